//! What the store keeps per process: its identity, its labels, its counters (one part per
//! signal), and who a count belongs to.

use std::time::{Instant, SystemTime};

/// Identity of a process: pid plus start time, so a reused pid is a different process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcRef {
    /// Thread-group id.
    pub tgid: u32,
    /// Start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_ticks: u64,
}

/// Label values that describe a process: its *identity*, what its series are keyed by (a
/// process's pid and start time are not: see [`super::series`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcMeta {
    /// Process name (lossy UTF-8 of the kernel's `comm` bytes).
    pub comm: String,
    /// Container id, empty on the host.
    pub container: String,
    /// Kubernetes pod name, empty outside a pod (`attribution::kubernetes`).
    pub pod: String,
    /// Kubernetes namespace, empty outside a pod.
    pub namespace: String,
    /// The container's name in its pod, empty outside a pod (or when not known).
    pub container_name: String,
    /// A host process's cgroup, as far as it names a service
    /// ([`crate::attribution::container::service_cgroup`]); empty in a container.
    pub cgroup: String,
}

/// The per-signal parts of a process's counters (the signal rooms define them; the store
/// only folds, expires and relabels them).
pub trait Parts: Clone + std::fmt::Debug + Default + Send {
    /// Adds every counter of `o` to `self`.
    fn absorb(&mut self, o: &Self);
    /// Whether anything was counted.
    fn has_counts(&self) -> bool;
    /// What the process starts with under new labels after an `exec` (series kept at 0).
    fn after_exec(&self) -> Self;
}

/// Counters of one process: common facts, then one part per signal ([`Parts`]).
#[derive(Clone, Debug)]
pub struct ProcStats<P> {
    /// Labels.
    pub meta: ProcMeta,
    /// Last time any counter moved.
    pub last_active: Instant,
    /// When the process was seen gone.
    pub exited: Option<Instant>,
    /// When this entry was made (wall clock): its counters have counted from 0 since then
    /// (OpenMetrics `_created`).
    pub born: SystemTime,
    /// Nothing counted yet: the entry exists only so that its series start at 0 (see
    /// [`Store::placeholder`]).
    pub placeholder: bool,
    /// One part per signal.
    pub parts: P,
    /// The identity it counts on ([`super::series`]).
    pub series: super::SeriesId,
}

impl ProcStats<()> {
    /// A row of labels only (no counters).
    pub fn new_row(meta: ProcMeta) -> Self {
        Self::new(meta, Instant::now())
    }
}

impl<P: Default> ProcStats<P> {
    pub(super) fn new(meta: ProcMeta, now: Instant) -> Self {
        Self {
            meta,
            last_active: now,
            exited: None,
            born: SystemTime::now(),
            placeholder: false,
            parts: P::default(),
            series: super::series::UNKNOWN,
        }
    }
}

impl<P: Parts> ProcStats<P> {
    /// Adds every counter of `o` to `self`.
    pub fn absorb(&mut self, o: &Self) {
        self.parts.absorb(&o.parts);
        self.last_active = self.last_active.max(o.last_active);
    }

    /// Whether anything was counted.
    pub fn has_counts(&self) -> bool {
        self.parts.has_counts()
    }
}

/// Who a count belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    /// A process.
    Proc(ProcRef),
    /// Nobody we could find (`comm="_unknown"`).
    Unknown,
}
