//! bufscope's recommended socket-buffer policy, as code.
//!
//! One source of truth for how big a tunnel's outer socket buffers should be, used by the
//! reference tunnel (`bufscope-tunnel`) to set them and by the exporter's advice engine to
//! judge what it sees. The crate has two halves:
//!
//! - **Pure rules** ([`plan`], [`bdp_bytes`], [`recommended_udp_buffer`], [`quic_windows`],
//!   [`expected_readback`], [`is_clamped`], [`clamp_fix`]): no I/O, usable on any platform and
//!   on numbers observed elsewhere (e.g. by eBPF probes).
//! - **Application** ([`Plan::apply`], unix only): sets the plan on a socket, trying
//!   `SO_RCVBUFFORCE`/`SO_SNDBUFFORCE` first when the process has `CAP_NET_ADMIN`, falls back to
//!   `SO_RCVBUF`/`SO_SNDBUF`, reads the effective sizes back with `getsockopt` and reports, per
//!   direction, what was requested, what took effect, whether it was forced, whether the kernel
//!   clamped it, and the fix when it did.
//!
//! Every rule cites the measurement it comes from (its `Citation`).
//!
//! ```
//! use bufscope_policy::{plan, Buffers, Platform, Target, Transport};
//! use std::time::Duration;
//!
//! // A 1 Gbit/s path at 190 ms RTT: the BDP (23.75 MB) says more than the 7 MiB default.
//! let p = plan(Transport::Udp, Platform::Linux, Some(Target::new(1_000_000_000, Duration::from_millis(190))));
//! assert!(matches!(p.buffers, Buffers::Set { receive, .. } if receive > 7 << 20));
//!
//! // TCP on Linux: leave the buffers alone so autotuning keeps working.
//! let p = plan(Transport::Tcp, Platform::Linux, None);
//! assert_eq!(p.buffers, Buffers::LeaveAlone);
//! ```

#[cfg(unix)]
mod apply;
mod caps;
pub mod programs;
mod rules;
pub mod units;

#[cfg(unix)]
pub use apply::{DirectionOutcome, Force, Outcome, read_buffers, set_buffer};
pub use caps::{CAP_NET_ADMIN, has_cap_net_admin};
pub use programs::{Knob, PROGRAMS, Program, Sizing, program};
pub use rules::*;

/// Errors from applying a plan to a socket.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// A requested size does not fit the kernel's `int` socket option.
    #[error("requested {direction} buffer of {bytes} bytes is larger than the kernel accepts")]
    TooLarge {
        /// Which buffer.
        direction: Direction,
        /// The requested size.
        bytes: usize,
    },
    /// `setsockopt` failed (other than the expected `EPERM` of a FORCE attempt, which falls back).
    #[error("setsockopt({option}, {bytes}) failed: {source}")]
    Set {
        /// The option name, e.g. `SO_RCVBUF`.
        option: &'static str,
        /// The requested size.
        bytes: usize,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `getsockopt` failed while reading a buffer size back.
    #[error("getsockopt({option}) failed: {source}")]
    Get {
        /// The option name, e.g. `SO_RCVBUF`.
        option: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}
