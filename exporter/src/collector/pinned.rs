//! Pinned state (`--bpf.pin-path`): the event-built counters kept in the pinned `TOTALS`
//! ([`crate::totals`]) and the pinned links watched for removal.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bufscope_common::total_family;
use foldhash::{HashMap, HashSet};

use crate::attribution::Attributor;
use crate::bpf::pins::LinkWatch;
use crate::exposition::Health;
use crate::signals::{Parts, Store};
use crate::store::series::OVERFLOW;
use crate::store::{Admission, ProcMeta, SeriesId, identity_hash};
use crate::totals::{Total, Totals, merged};

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
    /// Keeps every identity's record in `pins.totals` from now on; with adopted maps first
    /// starts each identity a live process has from the record an earlier bufscope left
    /// (the records of identities no live process has are deleted).
    pub fn new(pins: Option<Pins>, attr: &mut Attributor, store: &mut Store) -> Self {
        let Some(pins) = pins else {
            return Self::default();
        };
        let totals = pins.totals.map(|mut t| {
            if pins.adopted {
                restore(&mut t, attr, store);
            }
            let kept = hashes(store);
            t.retain(|h| kept.contains(&h));
            t
        });
        Self {
            totals,
            links: Some((pins.links, Instant::now())),
            lost: BTreeMap::new(),
        }
    }

    /// Writes the records of the identities that changed since the last write to the pinned
    /// `TOTALS` (nothing without `--bpf.pin-path`).
    pub fn flush(&mut self, store: &Store) {
        let Some(t) = &mut self.totals else {
            return;
        };
        t.flush(records(store));
    }

    /// Deletes the records of identities that left the store.
    pub fn retain(&mut self, store: &Store) {
        if let Some(t) = &mut self.totals {
            let kept = hashes(store);
            t.retain(|h| kept.contains(&h));
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

/// The hash an identity is kept under (the overflow identity's is fixed).
fn hash_of(id: SeriesId, meta: &ProcMeta) -> u64 {
    if id == OVERFLOW {
        OVERFLOW_HASH
    } else {
        identity_hash(meta)
    }
}

/// The key of the overflow identity's record.
const OVERFLOW_HASH: u64 = 0x6f76_6572_666c_6f77;

/// The hashes of every identity in the store.
fn hashes(store: &Store) -> HashSet<u64> {
    store
        .identities()
        .map(|(id, s)| hash_of(id, &s.meta))
        .collect()
}

/// Every identity's record: what its departed and exited processes counted (every counter),
/// the event-built counters of its live tracked processes (their map-read ones come back
/// from the maps), whether it has series of its own.
fn records(store: &Store) -> Vec<(u64, Vec<Total>)> {
    let mut by: HashMap<SeriesId, Vec<Total>> = store
        .identities()
        .map(|(id, s)| {
            let mut v = s.departed.counters();
            // Processes that left while alive: their map-read counters come back from the
            // maps (a restart reads them again), so only their event-built ones are kept.
            for (_, parts) in &s.departed_alive {
                v = without(v, &map_read(parts));
            }
            if s.admission == Admission::Own && id != OVERFLOW {
                v.push(Total {
                    family: total_family::OWN_SERIES,
                    value: 1,
                    ..Total::default()
                });
            }
            (id, v)
        })
        .collect();
    for (_, p) in store.procs() {
        if let Some(v) = by.get_mut(&p.series) {
            // An exited process (kept for the retention) counts nothing more in the maps and
            // will not be found there: all of its counts, as a departed one's.
            match p.exited {
                Some(_) => v.extend(p.parts.counters()),
                None => v.extend(p.parts.totals()),
            }
        }
    }
    store
        .identities()
        .filter_map(|(id, s)| {
            let v = by.remove(&id)?;
            Some((hash_of(id, &s.meta), merged(v)))
        })
        .collect()
}

/// The counters of `parts` the probes' maps keep (every counter but the event-built ones).
fn map_read(parts: &Parts) -> Vec<Total> {
    without(merged(parts.counters()), &merged(parts.totals()))
}

/// `from` less `less`, counter by counter (never below 0).
fn without(from: Vec<Total>, less: &[Total]) -> Vec<Total> {
    let key = |t: &Total| (t.family, t.proto, t.option);
    merged(from)
        .into_iter()
        .map(|mut t| {
            let minus: u64 = less
                .iter()
                .filter(|l| key(l) == key(&t))
                .map(|l| l.value)
                .sum();
            t.value = t.value.saturating_sub(minus);
            t
        })
        .filter(|t| t.value > 0)
        .collect()
}

/// Starts every identity a live process has (and the overflow one) from the record
/// `totals` kept for it.
fn restore(totals: &mut Totals, attr: &mut Attributor, store: &mut Store) {
    let mut kept = totals.read();
    let to_parts = |v: &[Total]| {
        let mut parts = Parts::default();
        for t in v {
            parts.restore_counter(t);
        }
        let own = v.iter().any(|t| t.family == total_family::OWN_SERIES);
        (parts, own)
    };
    if let Some(v) = kept.remove(&OVERFLOW_HASH) {
        let (parts, _) = to_parts(&v);
        store.restore_identity(ProcMeta::default(), true, true, parts);
    }
    let mut restored: HashSet<u64> = HashSet::default();
    if !kept.is_empty() {
        let pids = attr.procfs().pids();
        for pid in pids {
            let Some(p) = attr.proc_from_pid(pid) else {
                continue;
            };
            let meta = attr.meta(&p);
            let h = identity_hash(&meta);
            if let Some(v) = kept.remove(&h) {
                let (parts, own) = to_parts(&v);
                store.restore_identity(meta.clone(), false, own, parts);
                restored.insert(h);
            }
            // Every live process of it is tracked again (with nothing counted yet), so the
            // identity stays while one runs, as it did before the restart.
            if restored.contains(&h) {
                store.placeholder(p, || meta);
            }
        }
    }
    let restored = restored.len();
    tracing::info!(
        identities = restored,
        gone = kept.len(),
        "series go on from the pinned TOTALS (identities no live process has are left)"
    );
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::bpf::fake::FakeTable;
    use crate::labels::Proto;
    use crate::signals::testkit::{Bench, my_proc};
    use crate::store::{ProcRef, Who};
    use bufscope_common::TotalKey;

    fn pinned(b: &mut Bench, map: &FakeTable<TotalKey, u64>, adopted: bool) -> PinnedState {
        let mut s = PinnedState::default();
        let mut t = Totals::new(map.boxed());
        if adopted {
            restore(&mut t, &mut b.attr, &mut b.store);
        }
        let kept = hashes(&b.store);
        t.retain(|h| kept.contains(&h));
        s.totals = Some(t);
        s
    }

    /// The row of this test process's identity, all its processes summed.
    fn my_row(b: &mut Bench) -> crate::signals::Row {
        b.store.admit(|_| 1);
        let meta = b.attr.meta(&my_proc());
        b.store
            .rows()
            .into_iter()
            .find(|r| r.stats.meta == meta)
            .unwrap()
    }

    /// A restart that adopts the maps starts the identity of a live process from its record:
    /// what its exited processes counted (every counter) and the event-built counters of its
    /// live ones; the live process's map-read counts come back from the maps, so the series
    /// go on at the same values. The identity keeps series of its own and its live process
    /// is tracked again.
    #[test]
    fn an_adopted_restart_continues_every_series_of_an_identity() {
        let mut b = Bench::new();
        let map = FakeTable::new(64);
        let mut s = pinned(&mut b, &map, false);
        let me = my_proc();
        b.attr.proc_from_pid(me.tgid).unwrap();
        let meta = b.attr.meta(&me);
        // An exited process of the same program and place: it dropped and connected.
        let gone = ProcRef {
            tgid: u32::MAX - 3,
            start_ticks: 1,
        };
        let g = b.store.proc_mut(Who::Proc(gone), || meta.clone());
        g.parts.drops.add(Proto::Udp, "SOCKET_RCVBUFF", 40);
        g.parts.tcp_state.established = 2;
        // The live one: drops (read from a pinned map) and connections (events).
        let m = b.store.proc_mut(Who::Proc(me), || meta.clone());
        m.parts.drops.add(Proto::Udp, "SOCKET_RCVBUFF", 7);
        m.parts.tcp_state.established = 3;
        b.store.expire(|p| *p == me);
        let before = my_row(&mut b);
        crate::labels::register_drop_reasons([(6, "SOCKET_RCVBUFF".to_string())]);
        s.flush(&b.store);
        assert!(!map.is_empty());

        let mut after = Bench::new();
        pinned(&mut after, &map, true);
        assert!(
            after.store.get(&me).is_some(),
            "the live process is tracked again"
        );
        // The live process's drops come back from the pinned map; its events are in the
        // identity's record.
        after
            .store
            .proc_mut(Who::Proc(me), || meta.clone())
            .parts
            .drops
            .add(Proto::Udp, "SOCKET_RCVBUFF", 7);
        let row = my_row(&mut after);
        assert_eq!(
            row.stats.parts.drops.packets,
            before.stats.parts.drops.packets
        );
        assert_eq!(
            row.stats.parts.tcp_state.established,
            before.stats.parts.tcp_state.established
        );
        assert_eq!(row.stats.parts.tcp_state.established, 5);
        assert_eq!(
            after.store.identity(row.id).unwrap().admission,
            Admission::Own,
            "no second admission: its series were shown"
        );
    }

    /// A live process folded out of the detail for room still has its drops in the pinned
    /// maps, which a restart reads again: its identity's record leaves them out (the
    /// series goes on at 7, not 14) and keeps its connections (events). Once the process is
    /// gone (its map entries with it), the record keeps its counts whole.
    #[test]
    fn a_live_process_folded_for_room_is_not_counted_twice_after_a_restart() {
        let mut b = Bench::new();
        b.store = Store::new(1, Duration::from_secs(600));
        let map = FakeTable::new(64);
        let mut s = pinned(&mut b, &map, false);
        let me = my_proc();
        b.attr.proc_from_pid(me.tgid).unwrap();
        let meta = b.attr.meta(&me);
        let m = b.store.proc_mut(Who::Proc(me), || meta.clone());
        m.parts.drops.add(Proto::Udp, "SOCKET_RCVBUFF", 7);
        m.parts.tcp_state.established = 3;
        let other = ProcRef {
            tgid: u32::MAX - 5,
            start_ticks: 1,
        };
        b.store
            .proc_mut(Who::Proc(other), || ProcMeta {
                comm: "other".into(),
                cgroup: "/".into(),
                ..ProcMeta::default()
            })
            .parts
            .tcp_state
            .established = 1;
        assert!(b.store.get(&me).is_none(), "folded out of the one place");
        assert!(b.store.watched().contains(&me), "GC watches it");
        let before = my_row(&mut b);
        let drops = |r: &crate::signals::Row| r.stats.parts.drops.packets.values().sum::<u64>();
        assert_eq!(drops(&before), 7);
        crate::labels::register_drop_reasons([(6, "SOCKET_RCVBUFF".to_string())]);
        s.flush(&b.store);
        let restart = |drops_in_maps: u64| {
            let mut after = Bench::new();
            pinned(&mut after, &map, true);
            // What the adopted maps give the live process on the first read.
            after
                .store
                .proc_mut(Who::Proc(me), || meta.clone())
                .parts
                .drops
                .add(Proto::Udp, "SOCKET_RCVBUFF", drops_in_maps);
            let row = my_row(&mut after);
            (drops(&row), row.stats.parts.tcp_state.established)
        };
        assert_eq!(restart(7), (7, 3), "the maps' 7 drops are not added twice");

        // The process is gone: its sockets' entries leave the maps, its counts stay whole.
        b.store.expire(|p| *p == other);
        assert!(!b.store.watched().contains(&me));
        s.flush(&b.store);
        assert_eq!(restart(0), (7, 3), "nothing comes back from the maps now");
    }

    /// Records are per identity: 50,000 short-lived processes of two programs write the
    /// entries of those two, never push out a quiet long-lived identity's, and an identity
    /// no live process has is dropped at a restart.
    #[test]
    fn churn_writes_few_entries_and_leaves_quiet_identities_alone() {
        let mut b = Bench::new();
        let map = FakeTable::new(64);
        let mut s = pinned(&mut b, &map, false);
        let me = my_proc();
        b.attr.proc_from_pid(me.tgid).unwrap();
        let meta = b.attr.meta(&me);
        b.store
            .proc_mut(Who::Proc(me), || meta.clone())
            .parts
            .tcp_state
            .established = 9;
        s.flush(&b.store);
        let quiet = map.len();
        for i in 0..50_000u32 {
            let p = ProcRef {
                tgid: 5_000_000 + i,
                start_ticks: 1,
            };
            let comm = if i % 2 == 0 {
                "resolver"
            } else {
                "healthcheck"
            };
            b.store
                .proc_mut(Who::Proc(p), || ProcMeta {
                    comm: comm.into(),
                    cgroup: "/".into(),
                    ..ProcMeta::default()
                })
                .parts
                .tcp_state
                .established += 1;
            if i % 1000 == 999 {
                b.store.expire(|p| *p == me);
                s.flush(&b.store);
            }
        }
        b.store.admit(|_| 1);
        s.flush(&b.store);
        // Three identities, each its connections and its own-series flag.
        assert_eq!(quiet, 1, "flushed before its admission: no flag yet");
        assert_eq!(map.len(), 6, "{} entries", map.len());
        let h = identity_hash(&meta);
        let k = crate::totals::key(
            h,
            &Total {
                family: total_family::TCP_ESTABLISHED,
                proto: 6,
                ..Total::default()
            },
        );
        assert_eq!(map.value(&k), Some(9), "the quiet identity's count is kept");
        // After a restart only identities a live process has are started again.
        let mut after = Bench::new();
        pinned(&mut after, &map, true);
        assert_eq!(my_row(&mut after).stats.parts.tcp_state.established, 9);
        assert!(
            after
                .store
                .identities()
                .all(|(_, s)| s.meta.comm != "resolver")
        );
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
