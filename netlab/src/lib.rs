//! Network lab: network namespaces, veth pairs and a userspace WAN emulator (delay, jitter,
//! loss, rate) for a kernel without `netem`.
//!
//! Building blocks, usable on their own by any privileged test:
//! - [`Netns`]: a named network namespace (`ip netns add`) that is deleted on drop, with
//!   helpers to run commands inside it ([`Netns::command`], [`Netns::exec`], [`Netns::spawn`]),
//!   to configure links, addresses, routes and per-namespace sysctls, and to run Rust code on a
//!   thread switched into it ([`Netns::run_in`]).
//! - [`VethPair`]: a veth pair created directly inside two namespaces (never visible in the
//!   root namespace), deleted on drop.
//! - [`Process`]: a child process killed and reaped on drop.
//! - [`cleanup()`]: removes leftovers of killed runs, found by their name prefix.
//!
//! On top of them, [`Lab`] builds two namespaces `a` and `b` joined either by a plain veth
//! pair or by an emulated WAN link: a pair of TUN devices and a forwarder (one thread per
//! direction) applying the link model of `../shared/LAB-FACTS.md` §2.
//!
//! Everything needs root (`CAP_NET_ADMIN` + `CAP_SYS_ADMIN`). Traffic stays inside the
//! namespaces the lab creates: nothing is added to the root namespace.
//!
//! ```no_run
//! use bufscope_netlab::{Lab, LabConfig, LinkParams};
//! # fn main() -> Result<(), bufscope_netlab::Error> {
//! let lab = Lab::new(LabConfig::wan("bsl", LinkParams::mbit(200).rtt_ms(50)))?;
//! let out = lab.a().exec("ping", ["-c", "3", &lab.addr_b().to_string()])?;
//! println!("{out}");
//! # Ok(()) }
//! ```

mod cleanup;
pub mod cli;
mod error;
mod lab;
pub mod measure;
mod netns;
mod shutdown;
mod tun;
mod wan;

pub use cleanup::{CleanupReport, cleanup, leftovers, owner_pid};
pub use error::Error;
pub use lab::{Lab, LabConfig, LinkKind};
pub use netns::{Netns, Process, VethPair, unique_name};
pub use shutdown::{TerminationSignals, unblock_in_child};
pub use wan::{DirectionStats, LinkParams, WanStats};

/// Name prefix of everything bufscope's own lab, tests and benchmarks create.
pub const PREFIX: &str = "bsl";

/// Fails with [`Error::NotRoot`] unless the process runs with uid 0.
pub fn require_root() -> Result<(), Error> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Error::NotRoot);
    }
    Ok(())
}
