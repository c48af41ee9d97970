//! Reading `DROPS`: cumulative per-CPU counts into per-socket deltas (in batches where the
//! kernel allows), and keeping a live process's counts of closed sockets across a restart
//! ([`Drops::fold`]).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use bufscope_common::{DropKey, DropVal, drop_site, maps, stat};
use foldhash::{HashMap, HashMapExt as _};

use super::{Drops, Held, Seen};
use crate::attribution::Attributor;
use crate::bpf::PerCpuTable;
use crate::kernel::DropReasons;
use crate::signals::Store;
use crate::signals::counted::CountedMap;
use crate::store::ProcRef;

/// Sums one key's per-CPU values (latest `rcvbuf`/`rmem_alloc` win; the device name is the
/// latest CPU's that has one: a slot written by a program that set the name only at creation
/// has none on the other CPUs).
fn sum(values: &[DropVal]) -> DropVal {
    let mut total = DropVal::default();
    let mut named_at = None;
    for v in values {
        total.packets += v.packets;
        total.skbs += v.skbs;
        if v.last_ns >= total.last_ns && v.skbs > 0 {
            total.last_ns = v.last_ns;
            total.rcvbuf = v.rcvbuf;
            total.rmem_alloc = v.rmem_alloc;
        }
        if v.ifname[0] != 0 && v.skbs > 0 && named_at.is_none_or(|t| v.last_ns >= t) {
            named_at = Some(v.last_ns);
            total.ifname = v.ifname;
        }
    }
    total
}

fn ifname(raw: &[u8; 16]) -> String {
    let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

impl Drops {
    /// Wraps the `DROPS` map (the kernel's, or a fake in tests).
    pub fn new(
        map: PerCpuTable<DropKey, DropVal>,
        max_entries: u32,
        reasons: DropReasons,
        hold: Duration,
    ) -> Self {
        Self {
            map: CountedMap::new(maps::DROPS, max_entries, map, stat::DROPS_SEEN, sum),
            reasons,
            held: HashMap::new(),
            hold,
            last_poll: None,
            names: HashMap::new(),
            shared: None,
            retire: false,
            adopted: false,
            netns: super::NetnsDrops::default(),
            late: Vec::new(),
            limits: crate::signals::setsockopt::NsLimitCache::new(),
        }
    }

    /// Reads how the namespace of each dropping UDP socket sees the buffer limits (once per
    /// namespace, through the socket's owner), for the findings of sockets never sized.
    pub(super) fn note_namespaces(&mut self, procfs: &crate::attribution::Procfs) {
        let mut seen = foldhash::HashSet::default();
        for (k, s) in &self.map.last {
            if k.site != drop_site::SOCKET || i32::from(k.proto) != libc::IPPROTO_UDP {
                continue;
            }
            if let Some(o) = s.owner
                && seen.insert(k.netns)
            {
                self.limits.note(procfs, k.netns, o.tgid);
            }
        }
    }

    /// Deletes entry `k` of `DROPS`, read in the same step where the kernel can: what it
    /// gained since the last read is kept in `late` for the next poll (with the owner the
    /// entry had). Kernels without lookup-and-delete for hash maps (before 5.14): a plain
    /// delete.
    pub(super) fn take_entry(&mut self, k: &DropKey) {
        if let Some(now) = self.map.take(k)
            && let Some(seen) = self.map.last.get(k)
            && now.packets > seen.packets
        {
            self.late.push((*k, now.packets - seen.packets, seen.owner));
        }
    }

    /// Reads the map (`generation`: the probe's, read before) and attributes new drops.
    pub(super) fn read(
        &mut self,
        generation: Option<u64>,
        attr: &mut Attributor,
        store: &mut Store,
    ) {
        let now = Instant::now();
        let current = self.map.read(generation);
        for (k, v) in current {
            // A key that was deleted and re-created starts from zero again.
            let (dp, moved) = match self.map.last.get(&k) {
                Some(p) if v.packets >= p.packets => (v.packets - p.packets, v.skbs != p.skbs),
                _ => (v.packets, true),
            };
            let seen = match self.map.last.get_mut(&k) {
                // Known key: update in place (no per-key allocation on every poll).
                Some(seen) => {
                    if moved {
                        seen.changed = now;
                    }
                    seen.packets = v.packets;
                    seen.skbs = v.skbs;
                    seen.rcvbuf = v.rcvbuf;
                    seen.rmem_alloc = v.rmem_alloc;
                    if k.site == drop_site::DEVICE && moved && v.ifname[0] != 0 {
                        seen.ifname = ifname(&v.ifname);
                    }
                    seen
                }
                None => {
                    // First sight: the new packets were dropped since the previous poll
                    // (adopted maps: at some time while no bufscope ran).
                    let history = if self.adopted {
                        VecDeque::from([(now, v.packets)])
                    } else {
                        let base = self.last_poll.unwrap_or(now - Duration::from_secs(1));
                        VecDeque::from([(base, v.packets.saturating_sub(dp))])
                    };
                    self.map.last.entry(k).or_insert(Seen {
                        packets: v.packets,
                        skbs: v.skbs,
                        changed: now,
                        rcvbuf: v.rcvbuf,
                        rmem_alloc: v.rmem_alloc,
                        owner: None,
                        ifname: ifname(&v.ifname),
                        history,
                        credited: Vec::new(),
                    })
                }
            };
            seen.record(now, v.packets, moved);
            if dp > 0 {
                let h = self.held.entry(k).or_insert(Held {
                    packets: 0,
                    since: now,
                });
                h.packets += dp;
            }
        }
        self.attribute(attr, store, now);
        self.last_poll = Some(now);
        self.adopted = false;
    }

    /// Before the closed sockets `doomed` leave the map: adds what each live process was
    /// credited from them to its [`drop_site::RETIRED`] entry (one per process, proto and
    /// reason), written to the map as the total it already is in the store (no delta, no
    /// double count); a restart that adopts the map gives each process those counts again.
    pub(super) fn fold(&mut self, doomed: &[DropKey], attr: &Attributor, now: Instant) {
        let mut folds: BTreeMap<(ProcRef, u16, u8), (u64, u64)> = BTreeMap::new();
        for k in doomed.iter().filter(|k| k.site == drop_site::SOCKET) {
            let Some(s) = self.map.last.get(k) else {
                continue;
            };
            // Each live process keeps what it was credited (a shared socket's readers their
            // shares): a restart gives each its own part back, no series takes another's.
            for (p, n) in s.credited.iter().filter(|(p, n)| *n > 0 && attr.alive(p)) {
                let f = folds.entry((*p, k.reason, k.proto)).or_default();
                f.0 += n;
                f.1 += n;
            }
        }
        for ((owner, reason, proto), (packets, skbs)) in folds {
            let key = DropKey {
                inode: owner.start_ticks,
                netns: 0,
                id: owner.tgid,
                reason,
                proto,
                site: drop_site::RETIRED,
                _pad: 0,
            };
            let (p0, s0) = self
                .map
                .last
                .get(&key)
                .map_or((0, 0), |s| (s.packets, s.skbs));
            let total = DropVal {
                packets: p0 + packets,
                skbs: s0 + skbs,
                ..DropVal::default()
            };
            if let Err(e) = self.map.insert(key, total) {
                tracing::warn!(
                    pid = owner.tgid,
                    "closed sockets' drops not kept for a restart (DROPS full?): {e:#}"
                );
                continue;
            }
            let seen = self.map.last.entry(key).or_insert_with(|| Seen {
                packets: 0,
                skbs: 0,
                changed: now,
                rcvbuf: 0,
                rmem_alloc: 0,
                owner: Some(owner),
                ifname: String::new(),
                history: VecDeque::from([(now, total.packets)]),
                credited: Vec::new(),
            });
            seen.packets = total.packets;
            seen.skbs = total.skbs;
            seen.history = VecDeque::from([(now, total.packets)]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::Procfs;
    use crate::bpf::fake::FakeTable;
    use crate::signals::{GcCx, Signal as _, Store};
    use foldhash::HashSet;

    /// A per-namespace drops key (no socket: it can gain drops whenever) of a namespace no
    /// process is in.
    const KEY: DropKey = DropKey {
        inode: 0,
        netns: 4_026_539_999,
        id: 0,
        reason: 6,
        proto: 17,
        site: drop_site::NETNS,
        _pad: 0,
    };

    /// The kernel side of the scenario: the probe's count of [`KEY`].
    trait Kernel {
        /// Sets [`KEY`] to `packets` as the probe would (all on CPU 0).
        fn set(&mut self, packets: u64);
        /// Whether [`KEY`] is in the map.
        fn has_key(&self) -> bool;
    }

    fn value(packets: u64) -> DropVal {
        DropVal {
            packets,
            skbs: packets,
            ..DropVal::default()
        }
    }

    impl Kernel for FakeTable<DropKey, Vec<DropVal>> {
        fn set(&mut self, packets: u64) {
            FakeTable::set(self, KEY, vec![value(packets)]);
        }
        fn has_key(&self) -> bool {
            self.value(&KEY).is_some()
        }
    }

    /// A TUN's entry created on one CPU and counted on others: the others' slots carry no
    /// name when written by a program that named the device only at creation; the summed
    /// entry keeps the name whichever CPU counted last, and the counts of every CPU.
    #[test]
    fn a_device_named_on_one_cpu_keeps_its_name_and_every_cpu_s_counts() {
        let named = DropVal {
            packets: 10,
            skbs: 10,
            last_ns: 5,
            ifname: *b"wg0\0\0\0\0\0\0\0\0\0\0\0\0\0",
            ..DropVal::default()
        };
        let unnamed = DropVal {
            packets: 7,
            skbs: 7,
            last_ns: 9,
            ..DropVal::default()
        };
        for values in [[named, unnamed], [unnamed, named]] {
            let total = sum(&values);
            assert_eq!((total.packets, total.skbs), (17, 17));
            assert_eq!(ifname(&total.ifname), "wg0");
            assert_eq!(total.last_ns, 9);
        }
        // A CPU that never counted has no say.
        let idle = DropVal {
            last_ns: 99,
            ifname: *b"old\0\0\0\0\0\0\0\0\0\0\0\0\0",
            ..DropVal::default()
        };
        assert_eq!(ifname(&sum(&[named, idle]).ifname), "wg0");
    }

    fn counted(d: &Drops) -> u64 {
        d.netns.total()
    }

    /// Drops the kernel adds to an idle entry between bufscope's last read and the garbage
    /// collector's delete are counted at the next poll, not lost (lookup-and-delete), and a
    /// key the probe re-creates afterwards starts from zero.
    fn nothing_lost_between_the_last_read_and_the_delete(
        map: PerCpuTable<DropKey, DropVal>,
        kernel: &mut dyn Kernel,
    ) {
        let reasons = DropReasons::parse_format(r#"{ 6, "SOCKET_RCVBUFF" }"#);
        let mut d = Drops::new(map, 64, reasons, Duration::from_secs(10));
        let mut attr = Attributor::new(Procfs::new("/proc"), None).with_inline_lookups(true);
        let mut store = Store::new(10, Duration::from_secs(300));

        kernel.set(5);
        d.read(None, &mut attr, &mut store);
        assert_eq!(counted(&d), 5);
        // The kernel counts 7 more after the read; then the entry is collected as idle.
        kernel.set(12);
        let live = HashSet::default();
        let mut cx = GcCx {
            live: &live,
            idle: Duration::ZERO,
            retention: Duration::from_secs(300),
            attr: &mut attr,
            store: &store,
        };
        assert_eq!(d.gc(&mut cx), 1, "the idle entry went");
        assert!(!kernel.has_key(), "deleted from the kernel map");
        d.read(None, &mut attr, &mut store);
        assert_eq!(counted(&d), 12, "the 7 taken with the delete are counted");
        // The probe re-creates the key: from zero, not a negative delta.
        kernel.set(3);
        d.read(None, &mut attr, &mut store);
        assert_eq!(counted(&d), 15);
    }

    /// An idle entry of a namespace that has a process (this one's) can still count at any
    /// moment: the garbage collector leaves it in the map; a gone namespace's goes.
    #[test]
    fn an_idle_entry_of_a_live_namespace_stays() {
        let kernel = FakeTable::new(64);
        let reasons = DropReasons::parse_format(r#"{ 6, "SOCKET_RCVBUFF" }"#);
        let mut d = Drops::new(kernel.boxed(), 64, reasons, Duration::from_secs(10));
        let mut attr = Attributor::new(Procfs::new("/proc"), None);
        let mut store = Store::new(10, Duration::from_secs(300));
        let own = DropKey {
            netns: Procfs::new("/proc")
                .netns(std::process::id())
                .expect("this process's network namespace"),
            ..KEY
        };
        kernel.set(own, vec![value(4)]);
        kernel.set(KEY, vec![value(5)]);
        d.read(None, &mut attr, &mut store);
        assert_eq!(counted(&d), 9);
        let live = HashSet::default();
        let mut cx = GcCx {
            live: &live,
            idle: Duration::ZERO,
            retention: Duration::from_secs(300),
            attr: &mut attr,
            store: &store,
        };
        assert_eq!(d.gc(&mut cx), 1, "only the gone namespace's entry went");
        assert!(
            kernel.value(&own).is_some(),
            "the live namespace's entry stays"
        );
        assert!(kernel.value(&KEY).is_none());
    }

    #[test]
    fn drops_between_the_last_read_and_the_delete_are_counted() {
        let kernel = FakeTable::new(64);
        nothing_lost_between_the_last_read_and_the_delete(kernel.boxed(), &mut kernel.clone());
    }

    /// Before 5.14 a delete does not return the entry: what came after the last read is lost
    /// (and nothing is counted twice).
    #[test]
    fn without_lookup_and_delete_the_entry_is_deleted_plainly() {
        let kernel = FakeTable::new(64).without_lookup_and_delete();
        let reasons = DropReasons::parse_format(r#"{ 6, "SOCKET_RCVBUFF" }"#);
        let mut d = Drops::new(kernel.boxed(), 64, reasons, Duration::from_secs(10));
        let mut attr = Attributor::new(Procfs::new("/proc"), None).with_inline_lookups(true);
        let mut store = Store::new(10, Duration::from_secs(300));
        let mut k = kernel.clone();
        Kernel::set(&mut k, 5);
        d.read(None, &mut attr, &mut store);
        Kernel::set(&mut k, 12);
        d.take_entry(&KEY);
        assert!(kernel.is_empty());
        d.read(None, &mut attr, &mut store);
        assert_eq!(counted(&d), 5);
    }

    /// The same against a real kernel map (per-CPU hash, lookup-and-delete in one step).
    #[test]
    #[ignore = "needs root (creates a BPF map): run by `cargo xtask test`"]
    fn drops_between_the_last_read_and_the_delete_are_counted_in_the_kernel() {
        use crate::bpf::table::PerCpuHash;
        use aya::maps::{IterableMap as _, Map, MapData, PerCpuHashMap};

        struct Real(PerCpuHashMap<MapData, DropKey, DropVal>);
        impl Kernel for Real {
            fn set(&mut self, packets: u64) {
                let cpus = aya::util::nr_cpus().expect("possible CPUs");
                let mut values = vec![DropVal::default(); cpus];
                values[0] = value(packets);
                self.0
                    .insert(
                        KEY,
                        aya::maps::PerCpuValues::try_from(values).expect("one value per CPU"),
                        0,
                    )
                    .expect("writing the map");
            }
            fn has_key(&self) -> bool {
                self.0.get(&KEY, 0).is_ok()
            }
        }

        let map = PerCpuHashMap::<MapData, DropKey, DropVal>::create(64, 0)
            .expect("creating a per-CPU hash map (root, or CAP_BPF)");
        let id = map.map().info().expect("map info").id();
        let twin = PerCpuHashMap::try_from(Map::PerCpuHashMap(
            MapData::from_id(id).expect("a second handle on the map"),
        ))
        .expect("a per-CPU hash map");
        let table = PerCpuHash::new("DROPS", map);
        assert!(table.batched(), "this kernel reads and deletes in one step");
        nothing_lost_between_the_last_read_and_the_delete(Box::new(table), &mut Real(twin));
    }
}
