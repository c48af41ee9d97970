//! Garbage collection: exited processes leave the store, map entries of closed sockets leave
//! the kernel's maps. The expensive part, reading `/proc`, is planned under the collector's
//! lock ([`Gc::plan`], cheap) and run without it ([`GcPlan::scan`]).

use std::time::{Duration, Instant};

use foldhash::HashSet;

use crate::attribution::{Attributor, Procfs};
use crate::signals::{GcCx, Signal, Store};
use crate::store::ProcRef;

/// How long a pass over `/proc/*/fd` stays good for GC (see [`Gc::plan`]).
pub const LIVE_TTL: Duration = Duration::from_secs(60);

/// Timing knobs.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// How often maps are garbage-collected.
    pub gc_every: Duration,
    /// How long a map entry must be idle before it may be collected.
    pub idle: Duration,
}

/// When GC last ran and the last pass over `/proc/*/fd`.
pub struct Gc {
    timing: Timing,
    last: Instant,
    /// Socket inodes held by any process, from the last pass over `/proc/*/fd`.
    live: Option<(Instant, HashSet<u64>)>,
}

/// The `/proc` lookups one GC pass needs (see [`Gc::plan`]).
pub struct GcPlan {
    procfs: Procfs,
    procs: Vec<ProcRef>,
    scan_sockets: bool,
}

/// What [`GcPlan::scan`] found.
pub struct GcScan {
    dead: Vec<ProcRef>,
    live: Option<HashSet<u64>>,
    at: Instant,
}

impl Gc {
    /// GC every `timing.gc_every`, of entries idle for `timing.idle`.
    pub fn new(timing: Timing) -> Self {
        Self {
            timing,
            last: Instant::now(),
            live: None,
        }
    }

    /// Whether GC is due.
    pub fn due(&self) -> bool {
        self.last.elapsed() >= self.timing.gc_every
    }

    /// What GC must look up in `/proc`.
    ///
    /// A pass over every `/proc/<pid>/fd` is the expensive part of GC (≈13,000 readlinks
    /// with 1,000 processes holding 10,000 sockets), so the last pass is reused for up to
    /// [`LIVE_TTL`] while every GC candidate (an idle map entry) was live in it: a closed
    /// socket's entry then goes at most that much later.
    pub fn plan(&mut self, rooms: &[Box<dyn Signal>], attr: &Attributor, store: &Store) -> GcPlan {
        self.last = Instant::now();
        let idle = self.timing.idle;
        let candidates: Vec<u64> = rooms.iter().flat_map(|s| s.gc_candidates(idle)).collect();
        let reuse = self.live.as_ref().is_some_and(|(at, live)| {
            at.elapsed() < LIVE_TTL && candidates.iter().all(|i| live.contains(i))
        });
        GcPlan {
            procfs: attr.procfs().clone(),
            procs: store.watched(),
            scan_sockets: !reuse,
        }
    }

    /// Applies what [`GcPlan::scan`] found: exited processes leave `store`, every room
    /// collects; returns the map entries removed. `attr` then keeps the labels of the
    /// processes the store or a room still refers to.
    pub fn apply(
        &mut self,
        scan: GcScan,
        rooms: &mut [Box<dyn Signal>],
        attr: &mut Attributor,
        store: &mut Store,
    ) -> usize {
        let dead: HashSet<ProcRef> = scan.dead.into_iter().collect();
        store.expire(|p| !dead.contains(p));
        if let Some(live) = scan.live {
            self.live = Some((scan.at, live));
        }
        let empty = HashSet::default();
        let live = self.live.as_ref().map_or(&empty, |(_, l)| l);
        let mut cx = GcCx {
            live,
            idle: self.timing.idle,
            retention: store.retention(),
            attr,
            store,
        };
        let mut removed = 0;
        let mut referenced = HashSet::default();
        for s in rooms.iter_mut() {
            removed += s.gc(&mut cx);
            s.referenced(&mut referenced);
        }
        attr.retain_procs(|p| store.get(p).is_some() || referenced.contains(p));
        if removed > 0 {
            tracing::debug!(removed, "garbage-collected map entries of closed sockets");
        }
        removed
    }
}

impl GcPlan {
    /// Reads `/proc` (no collector state involved: run it without the lock, so scrapes are
    /// not held up by thousands of readlinks).
    pub fn scan(self) -> GcScan {
        let at = Instant::now();
        let dead = self
            .procs
            .into_iter()
            // Gone, or its pid now belongs to another process (a different start time).
            .filter(|p| self.procfs.start_ticks(p.tgid) != Some(p.start_ticks))
            .collect();
        let live = self
            .scan_sockets
            .then(|| self.procfs.all_socket_holders().into_keys().collect());
        GcScan { dead, live, at }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::bpf::fake::FakeTable;
    use crate::signals::autotune::Autotune;
    use crate::signals::testkit::{Bench, me, my_proc, udp_socket};
    use crate::store::Who;
    use bufscope_common::AutotuneVal;

    fn gc() -> Gc {
        Gc::new(Timing {
            gc_every: Duration::from_secs(60),
            idle: Duration::ZERO,
        })
    }

    /// A process `/proc` no longer shows is gone: its series leave (after the retention); the
    /// live process stays.
    #[test]
    fn exited_processes_are_found_and_expired() {
        let mut b = Bench::new();
        // No such pid (pid_max is at most 2^22).
        let ghost = ProcRef {
            tgid: u32::MAX - 1,
            start_ticks: 1,
        };
        b.store
            .proc_mut(Who::Proc(ghost), Default::default)
            .parts
            .tcp_state
            .established = 1;
        b.store
            .proc_mut(Who::Proc(my_proc()), Default::default)
            .parts
            .tcp_state
            .established = 1;
        let mut g = gc();
        let plan = g.plan(&[], &b.attr, &b.store);
        let scan = plan.scan();
        assert_eq!(scan.dead, vec![ghost]);
        g.apply(scan, &mut [], &mut b.attr, &mut b.store);
        assert!(b.store.get(&ghost).unwrap().exited.is_some());
        assert!(b.store.get(&my_proc()).unwrap().exited.is_none());
    }

    /// The pass over `/proc/*/fd` is reused while every idle entry's socket was live in it;
    /// a candidate not live in it (a socket closed since) makes the next GC look again.
    #[test]
    fn the_socket_scan_is_reused_while_every_candidate_was_live() {
        let mut b = Bench::new();
        let kernel = FakeTable::new(64);
        let (_s, held) = udp_socket();
        b.owners.set(held, me());
        kernel.set(
            held,
            vec![AutotuneVal {
                grow_events: 1,
                suppressed: 1,
                ..AutotuneVal::default()
            }],
        );
        let mut room = Autotune::new(kernel.boxed(), 64);
        room.poll(&mut b.poll());
        let mut rooms: Vec<Box<dyn Signal>> = vec![Box::new(room)];
        let mut g = gc();
        let plan = g.plan(&rooms, &b.attr, &b.store);
        assert!(plan.scan_sockets, "no pass yet");
        let scan = plan.scan();
        assert!(scan.live.as_ref().unwrap().contains(&held));
        assert_eq!(
            g.apply(scan, &mut rooms, &mut b.attr, &mut b.store),
            0,
            "live: kept"
        );
        assert!(!g.plan(&rooms, &b.attr, &b.store).scan_sockets, "reused");
        g.live = Some((Instant::now(), HashSet::default()));
        assert!(
            g.plan(&rooms, &b.attr, &b.store).scan_sockets,
            "a candidate not live"
        );
    }

    #[test]
    fn due_after_its_period() {
        let mut g = Gc::new(Timing {
            gc_every: Duration::ZERO,
            idle: Duration::ZERO,
        });
        assert!(g.due());
        g.timing.gc_every = Duration::from_secs(3600);
        let b = Bench::new();
        g.plan(&[], &b.attr, &b.store);
        assert!(!g.due());
    }
}
