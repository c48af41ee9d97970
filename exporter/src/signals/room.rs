//! What a room is: its registration ([`Room`]: probe, flags, loading hooks, its part of a
//! process's counters) and its running side ([`Signal`]: what the collector drives).

use std::time::{Duration, Instant};

use aya::Ebpf;
use foldhash::HashSet;
use prometheus::proto::MetricFamily;

use super::{ProcStats, Row, Store};
use crate::advice::Inputs;
use crate::attribution::{Attributor, OwnersMap, UdpSocketsMap};
use crate::bpf::pins::Outcome;
use crate::bpf::{Attached, LoadPlan, ProbeSpec, ProbeStatus, Stats};
use crate::kernel::{BufferLimits, DropReasons, KernelBtf};
use crate::store::{ProcRef, Who};
use crate::totals::Total;
use crate::values::Invalid;

/// A room's part of one process's counters ([`super::Parts`] holds one per room).
pub trait Part: Clone + std::fmt::Debug + Default + Send + Sync + 'static {
    /// Adds `o` (a folded process) to `self`.
    fn absorb(&mut self, o: &Self);

    /// Whether anything was counted.
    fn has_counts(&self) -> bool;

    /// Its columns of the process's row on the status page (`/api/v1/status`).
    fn status(&self, _row: &mut bufscope_api::ProcessRow) {}

    /// What a process that `exec`s starts with under its new labels: series that must go on
    /// existing (at 0) so the first counts after the exec show as an increase. Default:
    /// nothing.
    fn after_exec(&self) -> Self {
        Self::default()
    }

    /// Its counters that no pinned map keeps (built from events), each with its
    /// [`bufscope_common::total_family`]: with `--bpf.pin-path` the collector keeps them in
    /// `TOTALS` ([`crate::totals`]) and a restart hands them back ([`Part::restore`]), so
    /// they go on like the counters read from maps. Default: none.
    fn totals(&self, _out: &mut Vec<Total>) {}

    /// Takes back a counter [`Part::totals`] gave before a restart (ignores other families).
    fn restore(&mut self, _t: &Total) {}

    /// Every counter, those read from maps included: what an identity's departed processes
    /// counted, kept across a restart in `TOTALS` ([`crate::totals`]). Default:
    /// [`Part::totals`].
    fn counters(&self, out: &mut Vec<Total>) {
        self.totals(out);
    }

    /// Takes back a counter [`Part::counters`] gave before a restart. Default:
    /// [`Part::restore`].
    fn restore_counter(&mut self, t: &Total) {
        self.restore(t);
    }
}

/// Adds every counter of `from` to `into` (a part's counters keyed by label values: how it
/// folds into `_other`).
pub fn absorb_counts<K: Ord + Clone>(
    into: &mut std::collections::BTreeMap<K, u64>,
    from: &std::collections::BTreeMap<K, u64>,
) {
    for (k, v) in from {
        *into.entry(k.clone()).or_default() += v;
    }
}

/// A room without per-process counters.
impl Part for () {
    fn absorb(&mut self, _o: &Self) {}

    fn has_counts(&self) -> bool {
        false
    }
}

/// A room without flags of its own.
#[derive(clap::Args, Clone, Debug, Default)]
#[group(skip)]
pub struct NoFlags {}

/// What the rooms provide to the shared services while they are built.
#[derive(Default)]
pub struct Services {
    /// `OWNERS` (socket inode → the process that created or accepted it), for the
    /// [`Attributor`].
    pub owners: Option<OwnersMap>,
    /// `UDP_SOCKETS` (the inodes of UDP sockets, recorded at creation), for the
    /// [`Attributor`].
    pub udp_sockets: Option<UdpSocketsMap>,
}

/// The running room `make()` makes, when probe `probe` attached (the rooms that only read
/// the ring buffer and have nothing else to take).
pub fn when_attached<S: Signal + 'static>(
    env: &BuildCx<'_>,
    probe: &str,
    make: impl FnOnce() -> S,
) -> anyhow::Result<Option<Box<dyn Signal>>> {
    Ok(env
        .attached(probe)
        .then(|| Box::new(make()) as Box<dyn Signal>))
}

/// What a room sees while it is built from the loaded object ([`Room::take`]).
pub struct BuildCx<'a> {
    /// Per-probe outcome of attaching.
    pub status: &'a [ProbeStatus],
    /// The kernel's drop-reason names.
    pub reasons: &'a DropReasons,
    /// `--bpf.pin-path`: what the start did with the pins (None: nothing pinned).
    pub pins: Option<Outcome>,
}

impl BuildCx<'_> {
    /// Whether probe `name` attached.
    pub fn attached(&self, name: &str) -> bool {
        crate::bpf::hook::attached(self.status, name)
    }
}

/// What a room's flags are checked with ([`Room::validate`]): the rest of the command line.
pub struct ValidateCx<'a> {
    /// `--probe.disable`.
    pub disabled: &'a [String],
    /// `--bpf.pin-path` is given.
    pub pinned: bool,
    /// `--poll-interval` (how often the rooms poll their maps).
    pub poll_interval: std::time::Duration,
}

/// A line a room adds to `bufscope check` (e.g. whether an optional hook exists here).
pub struct CheckLine {
    /// Ok (else a warning: the room works without it).
    pub ok: bool,
    /// What.
    pub what: &'static str,
    /// The detail.
    pub detail: String,
}

/// A signal's registration: everything the list in [`super`] needs to know about a room.
/// Adding a signal = a type implementing this (and [`Signal`]) + one line in the list.
pub trait Room: Sized + Send + 'static {
    /// Its probe.
    const PROBE: ProbeSpec;
    /// Its part of each process's counters.
    type Part: Part;
    /// Its own flags (`bufscope run`), flattened into the command line and `bufscope.yaml`.
    type Flags: clap::Args + Clone + std::fmt::Debug + Send + Sync;
    /// What it resolved from its flags before loading, handed to [`Room::take`].
    type Setup: Send;

    /// Checks its flags beyond what clap checks, with the rest of the command line (before
    /// anything is loaded).
    fn validate(_flags: &Self::Flags, _cx: &ValidateCx<'_>) -> Result<(), Invalid> {
        Ok(())
    }

    /// Before the object is loaded: asks the loader for what its programs need (globals, map
    /// sizes, a cgroup, pinning) and resolves its settings.
    fn prepare(flags: &Self::Flags, plan: &mut LoadPlan) -> anyhow::Result<Self::Setup>;

    /// The object is loaded, nothing is attached yet: fill the maps its programs read.
    fn before_attach(_setup: &mut Self::Setup, _ebpf: &mut Ebpf) -> anyhow::Result<()> {
        Ok(())
    }

    /// Every probe is attached (or not): load what it attaches later, refuse settings that
    /// cannot work with what attached.
    fn after_attach(
        _setup: &mut Self::Setup,
        _ebpf: &mut Ebpf,
        _cx: &Attached<'_>,
    ) -> anyhow::Result<()> {
        Ok(())
    }

    /// Builds the running room from the loaded object (None: its probe did not attach, or it
    /// has nothing to run); may provide shared services.
    fn take(
        setup: Self::Setup,
        ebpf: &mut Ebpf,
        env: &BuildCx<'_>,
        services: &mut Services,
    ) -> anyhow::Result<Option<Box<dyn Signal>>>;

    /// Its lines in `bufscope check`.
    fn check(_kernel: &KernelBtf) -> Vec<CheckLine> {
        Vec::new()
    }
}

/// A room that reads only ring-buffer records: no flags of its own, nothing to prepare, and
/// running whenever its probe attached. Implementing this makes it a [`Room`].
pub trait RingRoom: Signal + Sized + 'static {
    /// Its probe.
    const PROBE: ProbeSpec;
    /// Its part of each process's counters.
    type Part: Part;

    /// The running room.
    fn start() -> Self;
}

impl<T: RingRoom> Room for T {
    const PROBE: ProbeSpec = <T as RingRoom>::PROBE;
    type Part = <T as RingRoom>::Part;
    type Flags = NoFlags;
    type Setup = ();

    fn prepare(_flags: &NoFlags, _plan: &mut LoadPlan) -> anyhow::Result<()> {
        Ok(())
    }

    /// The room, when its probe attached.
    fn take(
        _setup: (),
        _ebpf: &mut Ebpf,
        env: &BuildCx<'_>,
        _services: &mut Services,
    ) -> anyhow::Result<Option<Box<dyn Signal>>> {
        when_attached(env, <T as RingRoom>::PROBE.name, T::start)
    }
}

/// What a room sees while it reads the kernel's records: its maps ([`Signal::poll`]) or a
/// ring-buffer record ([`Signal::on_event`]).
pub struct PollCx<'a> {
    /// Socket → process.
    pub attr: &'a mut Attributor,
    /// Per-process counters.
    pub store: &'a mut Store,
    /// `rmem_max`/`wmem_max`/`tcp_rmem` as of this poll.
    pub limits: BufferLimits,
    /// The probes' `STATS` slots (generations, losses); None when unreadable.
    pub stats: Option<&'a Stats>,
}

impl PollCx<'_> {
    /// The process a probe recorded in process context (None: it recorded none, `tgid` 0).
    /// An exec since its last event is applied first: this event already counts under the
    /// new name.
    pub fn recorded(&mut self, o: &bufscope_common::Owner) -> Option<ProcRef> {
        if o.tgid == 0 {
            return None;
        }
        let p = self.attr.owner(o);
        self.attr.apply_renames(self.store);
        Some(p)
    }

    /// The counters an event of `probe` goes to: `owner`'s, else `comm="_unknown"`'s (then
    /// counted `n` times in `bufscope_attribution_unknown_total{probe}`).
    pub fn counters(
        &mut self,
        probe: &'static str,
        owner: Option<ProcRef>,
        n: u64,
    ) -> (Who, &mut ProcStats) {
        let who = who_or_unknown(self.store, probe, owner, n);
        (who, counters_of(self.store, self.attr, who))
    }
}

/// `owner` as whom a count belongs to; without one, `n` unattributed counts of `probe`.
pub fn who_or_unknown(
    store: &mut Store,
    probe: &'static str,
    owner: Option<ProcRef>,
    n: u64,
) -> Who {
    match owner {
        Some(p) => Who::Proc(p),
        None => {
            store.count_unknown(probe, n);
            Who::Unknown
        }
    }
}

/// `who`'s counters (its labels looked up only when the store does not know it yet).
pub fn counters_of<'s>(store: &'s mut Store, attr: &Attributor, who: Who) -> &'s mut ProcStats {
    store.proc_mut(who, || match who {
        Who::Proc(p) => attr.meta(&p),
        Who::Unknown => Default::default(),
    })
}

/// What a room sees during garbage collection ([`Signal::gc`]).
pub struct GcCx<'a> {
    /// Socket inodes held by any process (from the last pass over `/proc/*/fd`).
    pub live: &'a HashSet<u64>,
    /// How long an entry must be idle before it may go.
    pub idle: Duration,
    /// `--retention`: how long series of something gone (a process, a namespace) stay.
    pub retention: Duration,
    /// Socket → process (a room forgets the inodes it deletes).
    pub attr: &'a mut Attributor,
    /// Per-process counters (read-only: which processes are still tracked).
    pub store: &'a Store,
}

/// What a room sees when it hands inputs to the advice rules ([`Signal::advise`]).
pub struct AdviceCx<'a> {
    /// Per-process counters.
    pub store: &'a Store,
    /// Now (rates are measured up to it).
    pub now: Instant,
    /// Window over which rates are measured.
    pub window: Duration,
}

pub use crate::exposition::MapFill;

/// One signal's running side, as the collector drives it. Every method has a default that
/// does nothing, so a room implements only what its signal has.
pub trait Signal: Send {
    /// Its probe's name (flags, logs, the `probe` label).
    fn name(&self) -> &'static str;

    /// The hooks of a probe this room attached after start by its own decision (kernel
    /// WireGuard's hook once the module loads), while they are attached: listed in
    /// `bufscope_probe_attached` then, and not while the room keeps them off (off is a
    /// choice, as for a probe left off at start). None for probes the loader attached.
    fn attached_late(&self) -> Option<&str> {
        None
    }

    /// Ring-buffer record kinds ([`bufscope_common::event_kind`]) this room decodes.
    fn event_kinds(&self) -> &'static [u32] {
        &[]
    }

    /// Decodes and counts one ring-buffer record of one of [`Signal::event_kinds`].
    fn on_event(&mut self, _kind: u32, _bytes: &[u8], _cx: &mut PollCx<'_>) {}

    /// Reads the room's maps into the store. Returns true when something the advice rules
    /// read may have changed (the collector then re-evaluates them).
    fn poll(&mut self, _cx: &mut PollCx<'_>) -> bool {
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

    /// Its metric families: per process from `procs`, and its own (e.g. a hook's state).
    fn families(&self, _procs: &[Row], _out: &mut Vec<MetricFamily>) {}

    /// Its counter families whose values are read from BPF maps (so, with `--bpf.pin-path`,
    /// they go on across restarts: their `_created` is when the pinned maps began counting,
    /// not when this bufscope started). Families built from events start at the restart.
    fn map_counters(&self) -> &'static [&'static str] {
        &[]
    }
}
