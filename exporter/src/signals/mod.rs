//! The signals: one room each. A room owns everything about its signal on the userspace side:
//!
//! - its probe ([`ProbeSpec`]: which BPF programs, on which hooks) and the maps it takes from
//!   the loaded object ([`build`] hands it the object);
//! - the decoding of its map entries or ring-buffer records;
//! - its per-socket state (deltas, rates, last values for advice);
//! - what it adds to a process's [`ProcStats`] (one field of its own type) and the metric
//!   families and status-page columns that field renders to;
//! - the inputs it hands to the advice rules.
//!
//! | room | probe | BPF → userspace | per-process part | metric families |
//! |---|---|---|---|---|
//! | [`drops`] | `drops` | `DROPS` per-CPU hash (socket × reason) | [`drops::ProcDrops`] | `bufscope_socket_drops_total` |
//! | [`setsockopt`] | `setsockopt` | ring buffer, [`SockoptEvent`](bufscope_common::SockoptEvent) | [`setsockopt::ProcSockopt`] | `bufscope_setsockopt{,_clamped,_failed}_total`, `bufscope_rcvbuf_locks_total` |
//! | [`tcp_state`] | `tcp_state` | ring buffer, [`EstablishedEvent`](bufscope_common::EstablishedEvent) | [`tcp_state::ProcTcp`] | `bufscope_tcp_established_total`, `bufscope_tcp_wscale_shrunk_total` |
//! | [`autotune`] | `autotune` | `AUTOTUNE` per-CPU hash (socket) | [`autotune::ProcAutotune`] | `bufscope_tcp_autotune_suppressed_total` |
//! | [`owners`] | `owners` | `OWNERS` hash (socket → process), read by [`Attributor`] | — | — |
//! | [`guard`] | `guard` (+ decisions in `cgroup/setsockopt`) | ring buffer, [`GuardEvent`](bufscope_common::GuardEvent) | [`guard::ProcGuard`] | `bufscope_guard_decisions_total` |
//!
//! The [`crate::collector::Collector`] is a loop over the rooms through the [`Signal`] trait;
//! attribution (socket → process → container) is the shared [`Attributor`]. Adding a signal:
//! see docs/architecture.md.

pub mod autotune;
pub mod drops;
pub mod guard;
pub mod owners;
pub mod setsockopt;
pub mod tcp_state;

use std::time::{Duration, Instant};

use aya::Ebpf;
use foldhash::HashSet;
use prometheus::proto::MetricFamily;

use crate::advice::Inputs;
use crate::attribution::Attributor;
use crate::kernel::{BufferLimits, DropReasons};
use crate::probes::{MapSizes, ProbeSpec, ProbeStatus, Stats};
use crate::store::{ProcRef, ProcStats, Store};

/// Every probe, in the order they attach and are listed (`bufscope check`, metrics).
pub const PROBES: &[ProbeSpec] = &[
    drops::PROBE,
    setsockopt::PROBE,
    tcp_state::PROBE,
    autotune::PROBE,
    owners::PROBE,
    guard::PROBE,
];

/// Probes whose events are attributed to processes (the `probe` label of
/// `bufscope_attribution_unknown_total`).
pub const ATTRIBUTED: &[&str] = &[
    drops::PROBE.name,
    setsockopt::PROBE.name,
    tcp_state::PROBE.name,
    autotune::PROBE.name,
];

/// What a room sees while it reads its maps or decodes an event.
pub struct Cx<'a> {
    /// Socket → process.
    pub attr: &'a mut Attributor,
    /// Per-process counters.
    pub store: &'a mut Store,
    /// `rmem_max`/`wmem_max`/`tcp_rmem` as of this poll.
    pub limits: BufferLimits,
    /// The probes' `STATS` slots (generations, losses); None when unreadable.
    pub stats: Option<&'a Stats>,
}

/// What a room sees during garbage collection.
pub struct GcCx<'a> {
    /// Socket inodes held by any process (from the last pass over `/proc/*/fd`).
    pub live: &'a HashSet<u64>,
    /// How long an entry must be idle before it may go.
    pub idle: Duration,
    /// Socket → process (a room forgets the inodes it deletes).
    pub attr: &'a mut Attributor,
    /// Per-process counters (read-only: which processes are still tracked).
    pub store: &'a Store,
}

/// What a room sees when it hands inputs to the advice rules.
pub struct AdviceCx<'a> {
    /// Per-process counters.
    pub store: &'a Store,
    /// Now (rates are measured up to it).
    pub now: Instant,
    /// Window over which rates are measured.
    pub window: Duration,
}

/// Fill level of a room's BPF map (`bufscope_bpf_map_entries{map}`).
#[derive(Clone, Copy, Debug)]
pub struct MapFill {
    /// Map name.
    pub map: &'static str,
    /// Entries now (as of the last poll).
    pub entries: u64,
    /// Capacity.
    pub max_entries: u64,
}

/// One signal's userspace side, as the collector drives it. Every method has a default that
/// does nothing, so a room implements only what its signal has.
pub trait Signal: Send {
    /// Its probe's name (flags, logs, the `probe` label).
    fn name(&self) -> &'static str;

    /// Ring-buffer record kinds ([`bufscope_common::event_kind`]) this room decodes.
    fn event_kinds(&self) -> &'static [u32] {
        &[]
    }

    /// Decodes and counts one ring-buffer record of one of [`Signal::event_kinds`].
    fn on_event(&mut self, _kind: u32, _bytes: &[u8], _cx: &mut Cx<'_>) {}

    /// Reads the room's maps into the store. Returns true when something the advice rules
    /// read may have changed (the collector then re-evaluates them).
    fn poll(&mut self, _cx: &mut Cx<'_>) -> bool {
        false
    }

    /// The room's map fill level, if it has a map of its own.
    fn map_fill(&self) -> Option<MapFill> {
        None
    }

    /// Socket inodes of entries GC would delete if their socket were gone (GC scans `/proc`
    /// again only when one of them was not live in the last scan).
    fn gc_candidates(&self, _idle: Duration) -> Vec<u64> {
        Vec::new()
    }

    /// Deletes state of closed sockets and exited processes; returns map entries removed.
    fn gc(&mut self, _cx: &mut GcCx<'_>) -> usize {
        0
    }

    /// Processes this room still refers to (attribution keeps their labels cached).
    fn referenced(&self, _out: &mut HashSet<ProcRef>) {}

    /// Adds the room's part of what the advice rules look at.
    fn advise(&self, _cx: &AdviceCx<'_>, _inputs: &mut Inputs) {}

    /// Its counter families whose values are read from BPF maps (so, with `--bpf.pin-path`,
    /// they go on across restarts: their `_created` is when the pinned maps began counting,
    /// not when this bufscope started). Families built from events start at the restart.
    fn map_counters(&self) -> &'static [&'static str] {
        &[]
    }
}

/// What [`build`] needs besides the loaded object.
pub struct BuildEnv<'a> {
    /// Per-probe outcome of attaching.
    pub status: &'a [ProbeStatus],
    /// Map sizes the object was loaded with.
    pub sizes: MapSizes,
    /// The kernel's drop-reason names.
    pub reasons: &'a DropReasons,
    /// How long drops wait for their owner before going to `_unknown`.
    pub attribution_hold: Duration,
    /// The guard's settings (None: `--guard.mode off`).
    pub guard: Option<guard::Settings>,
    /// `--bpf.pin-path`: what the start did with the pins (None: nothing pinned).
    pub pins: Option<crate::probes::pins::Outcome>,
}

impl BuildEnv<'_> {
    /// Whether probe `name` attached.
    pub fn attached(&self, name: &str) -> bool {
        self.status
            .iter()
            .any(|s| s.spec.name == name && s.attached)
    }
}

/// Takes each attached room's maps out of `ebpf` and returns the rooms, in [`PROBES`] order.
/// Rooms whose probe did not attach are left out (their families stay empty).
pub fn build(ebpf: &mut Ebpf, env: &BuildEnv<'_>) -> anyhow::Result<Vec<Box<dyn Signal>>> {
    let mut out: Vec<Box<dyn Signal>> = Vec::new();
    if let Some(s) = drops::Drops::take(ebpf, env)? {
        out.push(Box::new(s));
    }
    if let Some(s) = setsockopt::Setsockopt::take(env) {
        out.push(Box::new(s));
    }
    if let Some(s) = tcp_state::TcpState::take(env) {
        out.push(Box::new(s));
    }
    if let Some(s) = autotune::Autotune::take(ebpf, env)? {
        out.push(Box::new(s));
    }
    if let Some(s) = guard::Guard::take(env) {
        out.push(Box::new(s));
    }
    Ok(out)
}

/// Every room's per-process metric families, in [`PROBES`] order.
pub fn families(procs: &[(String, &ProcStats)], out: &mut Vec<MetricFamily>) {
    drops::families(procs, out);
    setsockopt::families(procs, out);
    tcp_state::families(procs, out);
    autotune::families(procs, out);
    guard::families(procs, out);
}

/// Every room's columns of one process's row on the status page (`/api/v1/status`).
pub fn status_row(s: &ProcStats, row: &mut bufscope_api::ProcessRow) {
    s.drops.status(row);
    s.sockopt.status(row);
    s.tcp.status(row);
    s.autotune.status(row);
    s.guard.status(row);
}

/// Takes map `name` out of the object as type `T`.
pub fn take_map<T>(ebpf: &mut Ebpf, name: &str) -> anyhow::Result<T>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    use anyhow::Context as _;
    let map = ebpf
        .take_map(name)
        .with_context(|| format!("map {name} missing from the BPF object"))?;
    T::try_from(map).with_context(|| format!("map {name} has an unexpected type"))
}

/// Reads a `#[repr(C)]` POD record from the start of `bytes` (None when too short).
pub fn decode<T: aya::Pod>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: length checked; T is a #[repr(C)] integer-only type from bufscope-common, valid
    // for any bit pattern; read_unaligned handles the ring buffer's 8-byte alignment.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const T) })
}
