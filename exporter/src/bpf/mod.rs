//! The BPF side, seen from userspace: loading the object, attaching the probes the signal rooms
//! declare, pinning, and the map readers the rooms share.
//!
//! A *probe* is one signal's set of hooks ([`ProbeSpec`], declared by its room). Probes attach
//! independently: if one cannot (a kernel without the tracepoint, a verifier refusal), it is
//! detached entirely, the others keep working, and `bufscope_probe_attached{probe}` says 0
//! with the reason in the log. [`load`] works from the probe list and a [`LoadPlan`] the rooms
//! filled; it names no signal.
//!
//! | module | what |
//! |---|---|
//! | [`hook`] | `Hook`, `ProbeSpec`, `ProbeStatus`: probes as data |
//! | [`choice`] | which variants this kernel's BTF allows |
//! | [`plan`] | what the rooms ask of the loader (globals, map sizes, cgroups, pinning) |
//! | [`load`](load()) | plan (settings, pins), configure (the object loaded with them), attach (every probe, best variant first) |
//! | [`attach`] | loading one variant and linking its hooks, all or nothing |
//! | [`pins`] | `--bpf.pin-path`: adopt, upgrade or replace what an earlier bufscope pinned |
//! | [`sys`] | every raw `bpf(2)`/`perf_event_open(2)` call |
//! | [`table`], [`ring`] | the map-read seam: [`table::Table`] over a kernel map or an in-memory fake ([`fake`], tests), [`ring::Records`] over the event ring buffer |
//! | [`maps`], [`batch`], [`stats`] | taking and reading maps |

pub mod attach;
mod batch;
pub mod choice;
#[cfg(test)]
pub mod fake;
pub mod hook;
mod load;
mod maps;
pub mod pins;
pub mod plan;
pub mod ring;
mod stats;
pub mod switch;
pub mod sys;
pub mod table;

use aya::Ebpf;

use attach::Link;
pub use batch::BatchReader;
pub use choice::{BtfNeed, usable};
pub use hook::{Hook, ProbeSpec, ProbeStatus, Variant, describe};
pub use load::{RINGBUF_WAKEUP_BYTES, load};
pub use maps::{decode, take_map};
pub use plan::{Attached, LoadHooks, LoadPlan, Purpose};
pub use ring::Records;
pub use stats::{RunStats, Stats};
pub use table::{PerCpuTable, Table};

/// The compiled BPF object.
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/bufscope"));

/// The loaded object and what attached.
pub struct Probes {
    /// The object (programs and the maps not taken out by the rooms).
    pub ebpf: Ebpf,
    /// Per-probe outcome, in the order of the probe list.
    pub status: Vec<ProbeStatus>,
    /// `--bpf.pin-path`: what was pinned or adopted (None: nothing is pinned).
    pub pins: Option<pins::PinDir>,
    /// The links of the probes that are not pinned: held, so that dropping [`Probes`]
    /// detaches the probes.
    #[expect(
        dead_code,
        reason = "held for its Drop: closing the links detaches the probes"
    )]
    links: Vec<Link>,
}

impl Probes {
    /// Whether any probe is attached.
    pub fn any_attached(&self) -> bool {
        self.status.iter().any(|s| s.attached)
    }
}

/// Returns freed heap pages to the kernel (glibc keeps them otherwise). Start-up parses the
/// kernel's BTF into tens of MiB of small allocations; once they are dropped, this brings the
/// resident set down to what the daemon really uses (measured: 64 → 48 MiB after [`load`];
/// 8.6 MiB when the caller also drops its `KernelInfo` and calls this again).
pub fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}
