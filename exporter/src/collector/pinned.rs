//! Pinned state (`--bpf.pin-path`): the event-built counters kept in the pinned `TOTALS`
//! ([`crate::totals`]) and the pinned links watched for removal.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::attribution::Attributor;
use crate::bpf::pins::LinkWatch;
use crate::exposition::Health;
use crate::signals::Store;
use crate::store::Who;
use crate::totals::Totals;

/// How often the pinned links are checked to still be this bufscope's.
pub const LINK_CHECK_EVERY: Duration = Duration::from_secs(1);

/// What a start with `--bpf.pin-path` hands the collector.
pub struct Pins {
    /// The pinned `TOTALS` (None: unavailable; event-built counters then restart at 0 with
    /// the next bufscope).
    pub totals: Option<Totals>,
    /// The maps come from an earlier bufscope: `TOTALS` holds its counts.
    pub adopted: bool,
    /// The pinned links of this run's probes.
    pub links: LinkWatch,
}

/// The pinned `TOTALS` and links (both None without `--bpf.pin-path`).
#[derive(Default)]
pub struct PinnedState {
    totals: Option<Totals>,
    /// The pinned links, and when they were last checked.
    links: Option<(LinkWatch, Instant)>,
    /// Probes whose pinned link was removed or replaced since start, with why.
    lost: BTreeMap<&'static str, String>,
}

impl PinnedState {
    /// Keeps the counters built from events in `pins.totals` from now on; with adopted maps
    /// first gives each live process the counts kept there (the same pid and start time;
    /// the entries of processes gone meanwhile are deleted).
    pub fn new(pins: Option<Pins>, attr: &mut Attributor, store: &mut Store) -> Self {
        let Some(pins) = pins else {
            return Self::default();
        };
        let totals = pins.totals.map(|mut t| {
            if pins.adopted {
                restore(&mut t, attr, store);
            }
            t.retain(|p| store.get(p).is_some());
            t
        });
        Self {
            totals,
            links: Some((pins.links, Instant::now())),
            lost: BTreeMap::new(),
        }
    }

    /// Writes the counters built from events of the processes that counted since the last
    /// write to the pinned `TOTALS` (nothing without `--bpf.pin-path`).
    pub fn flush(&mut self, store: &Store) {
        let Some(t) = &mut self.totals else {
            return;
        };
        let now = Instant::now();
        let since = t.since();
        let changed = store
            .procs()
            .filter(|(_, s)| since.is_none_or(|at| s.last_active >= at))
            .map(|(p, s)| (*p, s.parts.totals()));
        t.flush(changed, now);
    }

    /// Deletes the kept counters of processes that left the store.
    pub fn retain(&mut self, store: &Store) {
        if let Some(t) = &mut self.totals {
            t.retain(|p| store.get(p).is_some());
        }
    }

    /// Checks the pinned links (at most every [`LINK_CHECK_EVERY`]): a probe whose link is
    /// gone or replaced no longer counts, so `health` says it is detached and the log why.
    /// Returns whether any pinned probe is still attached (None: nothing checked).
    pub fn check_links(&mut self, health: &mut Health) -> Option<bool> {
        let (watch, at) = self.links.as_mut()?;
        if at.elapsed() < LINK_CHECK_EVERY {
            return None;
        }
        *at = Instant::now();
        let lost = watch.check();
        if lost.is_empty() {
            return None;
        }
        for (probe, why) in lost {
            tracing::warn!(
                probe,
                "probe detached: {why}; it no longer counts (restart bufscope to attach it again)"
            );
            for p in health.probes.iter_mut().filter(|p| p.probe == probe) {
                p.attached = false;
            }
            self.lost.insert(probe, why);
        }
        // Probes without links (procfs readers such as netlink's) go on, but with every
        // pinned link gone the node's BPF view is: that is what liveness reports.
        Some(
            health
                .probes
                .iter()
                .filter(|p| p.pinned)
                .any(|p| p.attached),
        )
    }

    /// Why probe `name` stopped counting since start (its pinned link was removed or
    /// replaced), if it did.
    pub fn lost(&self, name: &str) -> Option<&str> {
        self.lost.get(name).map(String::as_str)
    }
}

/// Gives each live process the counters `totals` kept for it.
fn restore(totals: &mut Totals, attr: &mut Attributor, store: &mut Store) {
    let mut restored = 0usize;
    for (p, kept) in totals.read() {
        if !attr.alive(&p) || attr.proc_from_pid(p.tgid) != Some(p) {
            continue;
        }
        let s = store.proc_mut(Who::Proc(p), || attr.meta(&p));
        for t in &kept {
            s.parts.restore(t);
        }
        restored += 1;
    }
    tracing::info!(
        processes = restored,
        "event-built counters (setsockopt, TCP) go on from the pinned TOTALS"
    );
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::bpf::fake::FakeTable;
    use crate::signals::testkit::{Bench, my_proc};
    use crate::store::ProcRef;
    use crate::totals::{Total, key};
    use bufscope_common::{TotalKey, total_family};

    fn established(n: u64) -> Total {
        Total {
            family: total_family::TCP_ESTABLISHED,
            proto: 6,
            option: 0,
            value: n,
        }
    }

    fn pinned(b: &mut Bench, map: &FakeTable<TotalKey, u64>, adopted: bool) -> PinnedState {
        let mut s = PinnedState::default();
        let mut t = Totals::new(map.boxed());
        if adopted {
            restore(&mut t, &mut b.attr, &mut b.store);
        }
        t.retain(|p| b.store.get(p).is_some());
        s.totals = Some(t);
        s
    }

    /// A restart that adopts the maps gives a live process (same pid and start time) its
    /// counters back; a process gone meanwhile (another start time) gets nothing and its
    /// entry is deleted.
    #[test]
    fn adopted_totals_go_back_to_live_processes_only() {
        let mut b = Bench::new();
        let map = FakeTable::new(64);
        let me = my_proc();
        let gone = ProcRef {
            tgid: me.tgid,
            start_ticks: me.start_ticks + 7,
        };
        map.set(key(me, &established(9)), 9);
        map.set(key(gone, &established(4)), 4);
        pinned(&mut b, &map, true);
        assert_eq!(b.store.get(&me).unwrap().parts.tcp_state.established, 9);
        assert!(b.store.get(&gone).is_none());
        assert_eq!(map.len(), 1, "the gone process's entry is deleted");
    }

    /// Flushes write each changed counter once; processes that left the store lose theirs.
    #[test]
    fn flush_writes_changes_and_retain_forgets_the_gone() {
        let mut b = Bench::new();
        let map = FakeTable::new(64);
        let mut s = pinned(&mut b, &map, false);
        let me = my_proc();
        b.store
            .proc_mut(Who::Proc(me), Default::default)
            .parts
            .tcp_state
            .established = 3;
        s.flush(&b.store);
        assert_eq!(map.value(&key(me, &established(3))), Some(3));
        b.store
            .proc_mut(Who::Proc(me), Default::default)
            .parts
            .tcp_state
            .established = 5;
        s.flush(&b.store);
        assert_eq!(map.value(&key(me, &established(5))), Some(5));
        // The process left the store (exited past the retention, or folded).
        s.retain(&Bench::new().store);
        assert!(map.is_empty());
    }

    #[test]
    fn without_pins_nothing_is_kept_or_watched() {
        let mut b = Bench::new();
        let mut s = PinnedState::new(None, &mut b.attr, &mut b.store);
        s.flush(&b.store);
        assert_eq!(s.check_links(&mut Health::default()), None);
        assert_eq!(s.lost("drops"), None);
    }
}
