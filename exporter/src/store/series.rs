//! The series a node exports: one per *identity* — the program and where it runs
//! ([`ProcMeta`]: `comm`, container, pod, namespace, container name, or the cgroup of a host
//! service) — not per process. An identity's counters are the sum of every process it ever
//! had: the processes tracked now plus what the ones that left (exited past `--retention`,
//! folded out of the per-process detail, relabelled by an `exec`) had counted when they left
//! ([`Series::departed`]). A process leaving moves its counts from "tracked" to "departed" of
//! the same identity, so the identity's series never changes for it: nothing is counted twice
//! and nothing goes down.
//!
//! Every identity is *pending* until the exposition admits it ([`super::Store::admit`]): one
//! that fits the series budget (`--max-series`) gets series of its own for its whole life;
//! one that does not is merged, before anything of it was shown, into the overflow identity
//! (`comm="_other"`, `otel_metric_overflow="true"`), which its processes count on from then
//! on. Moving counts that no series showed yet counts nothing twice.

use std::time::{Instant, SystemTime};

use super::ProcMeta;
use super::proc::Parts;

/// An identity's number in the store (stable for its life).
pub type SeriesId = u64;

/// The overflow identity (`comm="_other"`, `otel_metric_overflow="true"`).
pub const OVERFLOW: SeriesId = 0;
/// Unattributed counts (`comm="_unknown"`).
pub const UNKNOWN: SeriesId = 1;
/// The first number a real identity gets.
pub(super) const FIRST: SeriesId = 2;

/// Whether an identity has series of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Not decided yet: nothing of it was shown.
    Pending,
    /// Its own series, for its life.
    Own,
}

/// One identity: its labels, what its departed processes counted, how many processes are
/// tracked under it now.
#[derive(Clone, Debug)]
pub struct Series<P> {
    /// The labels (what operators aggregate by).
    pub meta: ProcMeta,
    /// The counts of its processes that left the per-process store.
    pub departed: P,
    /// Of those, the processes that left while alive (folded out of the detail for room, or
    /// relabelled by an `exec`), each with what it had counted: their map-read counters are
    /// still in the probes' maps, which a restart that adopts them reads again, so the
    /// identity's record for a restart leaves those out. Dropped once the process is gone
    /// ([`super::Store::expire`]).
    pub departed_alive: Vec<(super::ProcRef, P)>,
    /// Processes tracked under it now.
    pub members: u32,
    /// When a process last left it (with no members, it leaves `--retention` after that).
    pub last_left: Instant,
    /// When it was made (its series' zero: OpenMetrics `_created`).
    pub born: SystemTime,
    /// Own series, or not decided yet.
    pub admission: Admission,
}

impl<P: Parts> Series<P> {
    pub(super) fn new(meta: ProcMeta, admission: Admission) -> Self {
        Self {
            meta,
            departed: P::default(),
            departed_alive: Vec::new(),
            members: 0,
            last_left: Instant::now(),
            born: SystemTime::now(),
            admission,
        }
    }
}

/// A stable 64-bit hash of an identity's labels (FNV-1a over the label values, each ended by
/// a NUL): the key an identity's counters are kept under across restarts (`TOTALS`), the
/// same in every bufscope version.
pub fn identity_hash(meta: &ProcMeta) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for field in [
        &meta.comm,
        &meta.container,
        &meta.pod,
        &meta.namespace,
        &meta.container_name,
        &meta.cgroup,
    ] {
        for b in field.bytes().chain([0]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    // 0 is never a hash: the key's `tgid` 0 says "an identity", its start ticks the hash.
    h.max(1)
}
