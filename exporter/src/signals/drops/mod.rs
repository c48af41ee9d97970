//! Buffer-full drops, from the per-CPU `DROPS` map (one entry per socket × drop reason).
//!
//! Each poll reads the cumulative counts, turns them into deltas, attributes each socket to its
//! owner and adds the delta to `bufscope_socket_drops_total{proto,reason}`. Deltas whose owner
//! cannot be found yet are held for `hold` (a `/proc` scan may still find them) and then go to
//! `comm="_unknown"`: counts are never dropped silently.

//!
//! Probe: `tp_btf/kfree_skb` filters on the tracked drop reasons first, then adds to `DROPS`
//! keyed by socket inode × reason (GRO skbs weighted by their segment count). Drops happen in
//! softirq, so the owner is never `current`: it is joined on the inode in userspace
//! ([`Attributor`]), to the live process holding the socket at the poll
//! ([`Attributor::refresh_holders`]: after a fork, an fd hand-off or an exec, not the creator).

mod seen;
mod shared;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use foldhash::{HashMap, HashMapExt as _, HashSet};
use prometheus::proto::MetricFamily;
use std::time::{Duration, Instant};

use aya::Ebpf;
use aya::maps::{IterableMap as _, MapData, PerCpuHashMap};
use bufscope_common::{DropKey, DropVal, drop_site, stat};

pub use seen::{HISTORY, HISTORY_STEP, Seen};
pub use shared::{QUIET, READER_WAIT, split};

use super::{AdviceCx, BuildEnv, Cx, GcCx, MapFill, Signal, take_map};
use crate::advice::{Inputs, SocketDrops};
use crate::attribution::Attributor;
use crate::kernel::DropReasons;
use crate::metrics::per_process;
use crate::probes::armed::ReaderHook;
use crate::probes::{BatchReader, BtfNeed, Hook, ProbeSpec};
use crate::store::{ProcRef, ProcStats, Proto, Store, Who};

/// `kfree_skb` with its 4th argument, `rx_sk` (6.11+): every drop names its socket.
const RX_SK: &[BtfNeed] = &[BtfNeed::Args(4)];
/// `kfree_skb` with a drop reason (5.17+), used without `rx_sk`.
const REASON: &[BtfNeed] = &[BtfNeed::Args(3)];
/// `udp_fail_queue_rcv_skb` that the kernel also fires for IPv6 (the tracepoint gained a
/// `family` field with the IPv6 call; Debian's 6.1 has neither).
const UDP_FAIL_V6: &[BtfNeed] = &[BtfNeed::Member {
    strukt: "trace_event_raw_udp_fail_queue_rcv_skb",
    member: "family",
    why: "the kernel fires it for IPv4 only",
}];

/// Drops of everything the UDP hook beside it does not count: by the owning socket when the
/// skb has one, else per network namespace (IPv4 and IPv6 UDP queue drops are left to the
/// UDP hook).
const KFREE_SKB_NOKS: Hook = Hook::BtfTracepointWhere {
    prog: "kfree_skb_noks",
    name: "kfree_skb",
    needs: REASON,
};

/// The probe: the best variant the kernel's BTF (and the kernel's refusals) allow.
///
/// | variant | socket known for | kernels |
/// |---|---|---|
/// | `tp_btf/kfree_skb` (`rx_sk`) | every drop | 6.11+ |
/// | `tp_btf/udp_fail_queue_rcv_skb` + `tp_btf/kfree_skb` | UDP v4+v6; skbs a socket owns | `udp_fail` with `family`, no `rx_sk` |
/// | `fexit/__udp_enqueue_schedule_skb` + `tp_btf/kfree_skb` | UDP v4+v6; skbs a socket owns | fexit allowed (e.g. Debian 6.1) |
/// | `tp_btf/udp_fail_queue_rcv_skb` + `tp_btf/kfree_skb` | UDP v4; skbs a socket owns | 5.17+ |
/// | `fexit/__udp_enqueue_schedule_skb` | UDP v4+v6 only | no drop reasons (before 5.17) |
/// | `tp_btf/udp_fail_queue_rcv_skb` | UDP v4 only | no drop reasons, no fexit |
///
/// Without `rx_sk`, a drop of an skb no socket owns yet (TCP's receive-queue drops, IPv6 UDP
/// where only IPv4 is hooked) is counted per network namespace and reason
/// (`bufscope_netns_drops_total`).
pub const PROBE: ProbeSpec = ProbeSpec {
    name: "drops",
    what: "buffer-full drops by kernel drop reason, per socket",
    variants: &[
        &[Hook::BtfTracepointWhere {
            prog: "kfree_skb",
            name: "kfree_skb",
            needs: RX_SK,
        }],
        &[
            Hook::BtfTracepointWhere {
                prog: "udp_fail_queue_rcv_skb",
                name: "udp_fail_queue_rcv_skb",
                needs: UDP_FAIL_V6,
            },
            KFREE_SKB_NOKS,
        ],
        &[
            Hook::Fexit {
                prog: "udp_enqueue_exit",
                func: "__udp_enqueue_schedule_skb",
            },
            KFREE_SKB_NOKS,
        ],
        &[
            Hook::BtfTracepoint {
                prog: "udp_fail_queue_rcv_skb",
                name: "udp_fail_queue_rcv_skb",
            },
            Hook::BtfTracepointWhere {
                prog: "kfree_skb_noks_v4",
                name: "kfree_skb",
                needs: REASON,
            },
        ],
        // No drop reasons (before 5.17): UDP queue drops only, no kfree_skb.
        &[Hook::Fexit {
            prog: "udp_enqueue_exit",
            func: "__udp_enqueue_schedule_skb",
        }],
        &[Hook::BtfTracepoint {
            prog: "udp_fail_queue_rcv_skb",
            name: "udp_fail_queue_rcv_skb",
        }],
    ],
    is_drop_probe: true,
};

/// What this signal adds to a process.
#[derive(Clone, Debug, Default)]
pub struct ProcDrops {
    /// Dropped packets by (proto, reason name).
    pub packets: BTreeMap<(Proto, String), u64>,
    /// Drops whose socket this kernel's hooks cannot name, by (netns inode, proto, reason
    /// name): only in the `_unknown` part (see [`drop_site::NETNS`]).
    pub netns: BTreeMap<(u32, Proto, String), u64>,
}

impl ProcDrops {
    /// Adds `o` (a folded process) to `self`.
    pub fn absorb(&mut self, o: &Self) {
        for (k, v) in &o.packets {
            *self.packets.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &o.netns {
            *self.netns.entry(k.clone()).or_default() += v;
        }
    }

    /// Whether anything was counted.
    pub fn has_counts(&self) -> bool {
        !self.packets.is_empty() || !self.netns.is_empty()
    }

    /// Adds `n` drops of (`proto`, `reason`) without allocating the name when it is known:
    /// with thousands of dropping sockets this runs for each of them on every poll.
    pub fn add(&mut self, proto: Proto, reason: &str, n: u64) {
        match self
            .packets
            .iter_mut()
            .find(|((p, r), _)| *p == proto && r == reason)
        {
            Some((_, v)) => *v += n,
            None => {
                self.packets.insert((proto, reason.to_string()), n);
            }
        }
    }

    /// Status-page columns.
    pub fn status(&self, row: &mut bufscope_api::ProcessRow) {
        row.drops = self
            .packets
            .iter()
            .map(|((proto, reason), v)| (format!("{}/{reason}", proto.as_str()), *v))
            .collect();
        row.drops_total = self.packets.values().sum();
    }
}

/// A delta waiting for its owner.
struct Held {
    packets: u64,
    since: Instant,
}

/// The drops room.
pub struct Drops {
    map: PerCpuHashMap<MapData, DropKey, DropVal>,
    max_entries: u32,
    reasons: DropReasons,
    last: HashMap<DropKey, Seen>,
    held: HashMap<DropKey, Held>,
    hold: Duration,
    last_poll: Option<Instant>,
    /// `stat::DROPS_SEEN` as read just before the last full read of the map.
    generation: Option<u64>,
    /// Reason names by number (resolved once).
    names: HashMap<u16, String>,
    /// Reads the map in batches (None: the kernel or the map does not allow it; then aya's
    /// key-by-key iterator).
    batch: Option<BatchReader>,
    /// Sockets several processes hold, and the reader hook (None: the kernel has no
    /// `sock_recv_length`; such a socket's drops go to its newest holder).
    shared: Option<shared::Shared>,
    /// With pinned maps: the counts of a live process's closed sockets are folded into a
    /// [`drop_site::RETIRED`] entry when their entries are removed, so they outlive a restart.
    retire: bool,
    /// The next read is the first of maps adopted from an earlier bufscope: their counts are
    /// not news of the last second (no rate is claimed from them).
    adopted: bool,
}

/// Sums one key's per-CPU values (latest `rcvbuf`/`rmem_alloc` win).
fn sum(values: &[DropVal]) -> DropVal {
    let mut total = DropVal::default();
    for v in values {
        total.packets += v.packets;
        total.skbs += v.skbs;
        if v.last_ns >= total.last_ns && v.skbs > 0 {
            total.last_ns = v.last_ns;
            total.rcvbuf = v.rcvbuf;
            total.rmem_alloc = v.rmem_alloc;
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
    /// Takes the `DROPS` map when the probe attached.
    pub fn take(ebpf: &mut Ebpf, env: &BuildEnv<'_>) -> anyhow::Result<Option<Self>> {
        if !env.attached(PROBE.name) {
            return Ok(None);
        }
        let mut room = Self::new(
            take_map(ebpf, "DROPS")?,
            env.sizes.drops,
            env.reasons.clone(),
            env.attribution_hold,
        );
        room.shared = ReaderHook::take(ebpf)?.map(shared::Shared::new);
        room.retire = env.pins.is_some();
        room.adopted = matches!(
            env.pins,
            Some(crate::probes::pins::Outcome::Adopted | crate::probes::pins::Outcome::Upgraded)
        );
        Ok(Some(room))
    }

    /// Wraps the `DROPS` map.
    pub fn new(
        map: PerCpuHashMap<MapData, DropKey, DropVal>,
        max_entries: u32,
        reasons: DropReasons,
        hold: Duration,
    ) -> Self {
        let batch = BatchReader::new(
            map.map().fd(),
            std::mem::size_of::<DropKey>(),
            std::mem::size_of::<DropVal>(),
        );
        Self {
            map,
            max_entries,
            reasons,
            last: HashMap::new(),
            held: HashMap::new(),
            hold,
            last_poll: None,
            generation: None,
            names: HashMap::new(),
            batch,
            shared: None,
            retire: false,
            adopted: false,
        }
    }

    /// Reads the map and attributes new drops.
    fn read(&mut self, attr: &mut Attributor, store: &mut Store) {
        let now = Instant::now();
        let current = self.read_map();
        for (k, v) in current {
            // A key that was deleted and re-created starts from zero again.
            let (dp, moved) = match self.last.get(&k) {
                Some(p) if v.packets >= p.packets => (v.packets - p.packets, v.skbs != p.skbs),
                _ => (v.packets, true),
            };
            let seen = match self.last.get_mut(&k) {
                // Known key: update in place (no per-key allocation on every poll).
                Some(seen) => {
                    if moved {
                        seen.changed = now;
                    }
                    seen.packets = v.packets;
                    seen.skbs = v.skbs;
                    seen.rcvbuf = v.rcvbuf;
                    seen.rmem_alloc = v.rmem_alloc;
                    if k.site == drop_site::DEVICE && moved {
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
                    self.last.entry(k).or_insert(Seen {
                        packets: v.packets,
                        skbs: v.skbs,
                        changed: now,
                        rcvbuf: v.rcvbuf,
                        rmem_alloc: v.rmem_alloc,
                        owner: None,
                        ifname: ifname(&v.ifname),
                        history,
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

    /// Every key with its per-CPU values summed: in batches when possible, else key by key.
    fn read_map(&mut self) -> Vec<(DropKey, DropVal)> {
        if let Some(b) = &self.batch {
            match b.read::<DropKey, DropVal>(self.map.map().fd()) {
                Ok(all) => return all.into_iter().map(|(k, v)| (k, sum(&v))).collect(),
                Err(e) => {
                    tracing::debug!("DROPS batch read failed ({e}); reading key by key");
                    self.batch = None;
                }
            }
        }
        let mut current = Vec::new();
        for item in self.map.iter() {
            match item {
                Ok((k, v)) => current.push((k, sum(&v))),
                Err(e) => {
                    tracing::debug!("DROPS iteration: {e}");
                    break;
                }
            }
        }
        current
    }

    /// Before the closed sockets `doomed` leave the map: adds their counts to their live
    /// owner's [`drop_site::RETIRED`] entry (one per process, proto and reason), written to
    /// the map as the total it already is in the store (no delta, no double count); a restart
    /// that adopts the map gives the process those counts again.
    fn fold(&mut self, doomed: &[DropKey], attr: &Attributor, now: Instant) {
        let mut folds: BTreeMap<(ProcRef, u16, u8), (u64, u64)> = BTreeMap::new();
        for k in doomed.iter().filter(|k| k.site == drop_site::SOCKET) {
            let Some(s) = self.last.get(k) else { continue };
            let Some(owner) = s.owner.filter(|p| attr.alive(p)) else {
                continue;
            };
            let f = folds.entry((owner, k.reason, k.proto)).or_default();
            f.0 += s.packets;
            f.1 += s.skbs;
        }
        let cpus = match aya::util::nr_cpus() {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!("folding closed sockets' drops: cannot count CPUs ({e:?})");
                return;
            }
        };
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
            let (p0, s0) = self.last.get(&key).map_or((0, 0), |s| (s.packets, s.skbs));
            let total = DropVal {
                packets: p0 + packets,
                skbs: s0 + skbs,
                ..DropVal::default()
            };
            let mut values = vec![DropVal::default(); cpus];
            values[0] = total;
            let written = aya::maps::PerCpuValues::try_from(values)
                .map_err(anyhow::Error::from)
                .and_then(|v| Ok(self.map.insert(key, v, 0)?));
            if let Err(e) = written {
                tracing::warn!(
                    pid = owner.tgid,
                    "closed sockets' drops not kept for a restart (DROPS full?): {e:#}"
                );
                continue;
            }
            let seen = self.last.entry(key).or_insert_with(|| Seen {
                packets: 0,
                skbs: 0,
                changed: now,
                rcvbuf: 0,
                rmem_alloc: 0,
                owner: Some(owner),
                ifname: String::new(),
                history: VecDeque::from([(now, total.packets)]),
            });
            seen.packets = total.packets;
            seen.skbs = total.skbs;
            seen.history = VecDeque::from([(now, total.packets)]);
        }
    }

    fn resolve(&self, k: &DropKey, attr: &mut Attributor) -> Option<ProcRef> {
        match k.site {
            drop_site::SOCKET => attr.lookup_inode(k.inode),
            drop_site::SOCKET_NO_INODE => attr.listener(k.netns, k.id as u16),
            drop_site::RETIRED => {
                let p = ProcRef {
                    tgid: k.id,
                    start_ticks: k.inode,
                };
                attr.alive(&p).then_some(p)
            }
            drop_site::DEVICE => {
                let name = self
                    .last
                    .get(k)
                    .map(|s| s.ifname.clone())
                    .unwrap_or_default();
                attr.tun(k.netns, &name)
            }
            _ => None,
        }
    }

    fn attribute(&mut self, attr: &mut Attributor, store: &mut Store, now: Instant) {
        if self.held.is_empty() {
            if let Some(sh) = &mut self.shared {
                sh.update(&HashSet::default(), attr, now);
            }
            return;
        }
        // The live holder of each socket with new drops (fork, fd passing, exec: the counts
        // follow the socket, not its creator).
        let dropping: HashSet<u64> = self
            .held
            .keys()
            .filter(|k| k.site == drop_site::SOCKET)
            .map(|k| k.inode)
            .collect();
        attr.refresh_holders(&dropping);
        attr.apply_renames(store);
        let unknown: HashSet<u64> = self
            .held
            .keys()
            .filter(|k| k.site == drop_site::SOCKET && attr.lookup_inode(k.inode).is_none())
            .map(|k| k.inode)
            .collect();
        attr.resolve_inodes(&unknown);
        if let Some(sh) = &mut self.shared {
            sh.read_readers();
        }
        let keys: Vec<DropKey> = self.held.keys().copied().collect();
        for k in keys {
            if self.route_shared(&k, attr, store, now) {
                continue;
            }
            let who = self.resolve(&k, attr);
            let expired = self
                .held
                .get(&k)
                .is_some_and(|h| now.duration_since(h.since) >= self.hold);
            if who.is_none() && k.site == drop_site::RETIRED {
                // Folded counts of a process that exited while no bufscope ran: its series
                // would have left with it (the entry goes at the next GC).
                self.held.remove(&k);
                continue;
            }
            if who.is_none() && !expired && k.site != drop_site::NETNS {
                continue;
            }
            let Some(h) = self.held.remove(&k) else {
                continue;
            };
            if k.site == drop_site::NETNS {
                let name = self.reasons.name(k.reason);
                let s = store.proc_mut(Who::Unknown, Default::default);
                *s.drops
                    .netns
                    .entry((k.netns, Proto::from_ip(k.proto), name))
                    .or_default() += h.packets;
                continue;
            }
            let who = match who {
                Some(p) => Who::Proc(p),
                None => {
                    store.count_unknown("drops", h.packets);
                    Who::Unknown
                }
            };
            if let (Some(seen), Who::Proc(p)) = (self.last.get_mut(&k), who) {
                seen.owner = Some(p);
            }
            // Labels are cloned only for a process the store does not know yet.
            let s = store.proc_mut(who, || match who {
                Who::Proc(p) => attr.meta(&p),
                Who::Unknown => Default::default(),
            });
            let reasons = &self.reasons;
            let name = self
                .names
                .entry(k.reason)
                .or_insert_with(|| reasons.name(k.reason));
            s.drops.add(Proto::from_ip(k.proto), name, h.packets);
        }
        if let Some(sh) = &mut self.shared {
            sh.update(&dropping, attr, now);
        }
    }

    /// Counts the held delta of `k` when its socket is shared (more than one live holder)
    /// and the reader hook says, or will say, who reads it ([`shared`]). Returns true when
    /// the delta was counted or must wait; false for the usual rule.
    fn route_shared(
        &mut self,
        k: &DropKey,
        attr: &mut Attributor,
        store: &mut Store,
        now: Instant,
    ) -> bool {
        let Some(sh) = &mut self.shared else {
            return false;
        };
        if k.site != drop_site::SOCKET || attr.holder_count(k.inode) <= 1 {
            return false;
        }
        let Some(h) = self.held.get(k) else {
            return false;
        };
        let parts = match sh.route(k.inode, h.packets, h.since, now, attr) {
            shared::Route::Holder => return false,
            shared::Route::Wait => return true,
            shared::Route::Split(parts) => parts,
        };
        self.held.remove(k);
        if let (Some(seen), Some((p, _))) =
            (self.last.get_mut(k), parts.iter().max_by_key(|(_, n)| *n))
        {
            seen.owner = Some(*p);
        }
        let reasons = &self.reasons;
        let name = self
            .names
            .entry(k.reason)
            .or_insert_with(|| reasons.name(k.reason));
        for (p, n) in parts {
            let s = store.proc_mut(Who::Proc(p), || attr.meta(&p));
            s.drops.add(Proto::from_ip(k.proto), name, n);
        }
        true
    }
}

/// The reason a full UDP receive buffer drops with (the series made at 0 in advance).
const UDP_RCVBUF_REASON: &str = "SOCKET_RCVBUFF";

impl Drops {
    /// Gives each process newly known to hold a UDP socket its
    /// `{proto="udp",reason="SOCKET_RCVBUFF"}` series at 0 (room permitting:
    /// [`Store::placeholder`]), so that Prometheus sees its first drops as an increase.
    fn zero_udp_series(&self, cx: &mut Cx<'_>) {
        if self.reasons.value(UDP_RCVBUF_REASON).is_none() {
            return;
        }
        for p in cx.attr.new_udp_holders() {
            let attr = &*cx.attr;
            if let Some(s) = cx.store.placeholder(p, || attr.meta(&p)) {
                s.drops.add(Proto::Udp, UDP_RCVBUF_REASON, 0);
            }
        }
    }
}

impl Signal for Drops {
    fn name(&self) -> &'static str {
        PROBE.name
    }

    fn map_counters(&self) -> &'static [&'static str] {
        &["bufscope_socket_drops_total", "bufscope_netns_drops_total"]
    }

    /// Reads the map unless the probe's `stat::DROPS_SEEN` generation shows that nothing was
    /// counted since the last full read and no delta waits for its owner. Reading the map
    /// costs syscalls per entry, so an idle host with thousands of sockets that once dropped
    /// would otherwise pay for them every poll.
    fn poll(&mut self, cx: &mut Cx<'_>) -> bool {
        self.zero_udp_series(cx);
        let generation = cx.stats.and_then(|s| s.total(stat::DROPS_SEEN));
        if generation.is_some() && generation == self.generation && self.held.is_empty() {
            let now = Instant::now();
            self.last_poll = Some(now);
            if let Some(sh) = &mut self.shared {
                // Nothing dropped: watched sockets may have gone quiet.
                sh.update(&HashSet::default(), cx.attr, now);
            }
            return false;
        }
        self.read(cx.attr, cx.store);
        self.generation = generation;
        true
    }

    fn map_fill(&self) -> Option<MapFill> {
        Some(MapFill {
            map: "DROPS",
            entries: self.last.len() as u64,
            max_entries: self.max_entries as u64,
        })
    }

    fn gc_candidates(&self, idle: Duration) -> Vec<u64> {
        let now = Instant::now();
        self.last
            .iter()
            .filter(|(k, s)| {
                k.site == drop_site::SOCKET
                    && now.duration_since(s.changed) >= idle
                    && !self.held.contains_key(k)
            })
            .map(|(k, _)| k.inode)
            .collect()
    }

    /// Deletes entries idle for `idle` whose socket no longer exists (`live` = socket inodes
    /// held by any process), so the map does not fill with closed sockets. Entries without an
    /// inode are deleted when idle.
    fn gc(&mut self, cx: &mut GcCx<'_>) -> usize {
        let (live, idle) = (cx.live, cx.idle);
        let now = Instant::now();
        let attr = &*cx.attr;
        let doomed: Vec<DropKey> = self
            .last
            .iter()
            .filter(|(k, s)| match k.site {
                // Folded counts stay while their process lives.
                drop_site::RETIRED => !attr.alive(&ProcRef {
                    tgid: k.id,
                    start_ticks: k.inode,
                }),
                site => {
                    now.duration_since(s.changed) >= idle
                        && !self.held.contains_key(k)
                        && (site != drop_site::SOCKET || !live.contains(&k.inode))
                }
            })
            .map(|(k, _)| *k)
            .collect();
        if self.retire {
            self.fold(&doomed, attr, now);
        }
        for k in &doomed {
            // The socket is gone (or the key idle): nothing can increment it between our last
            // read and this delete, and a re-created key starts from zero.
            let _ = self.map.remove(k);
            self.last.remove(k);
            if k.site == drop_site::SOCKET {
                cx.attr.forget_inode(k.inode);
                if let Some(sh) = &mut self.shared {
                    sh.forget(k.inode);
                }
            }
        }
        doomed.len()
    }

    fn referenced(&self, out: &mut HashSet<ProcRef>) {
        out.extend(self.last.values().filter_map(|s| s.owner));
        if let Some(sh) = &self.shared {
            sh.referenced(out);
        }
    }

    fn advise(&self, cx: &AdviceCx<'_>, inputs: &mut Inputs) {
        let mut names: HashMap<u16, Arc<str>> = HashMap::new();
        inputs.drops.extend(self.last.iter().map(|(k, s)| {
            SocketDrops {
                owner: s.owner,
                inode: k.inode,
                proto: Proto::from_ip(k.proto),
                reason: names
                    .entry(k.reason)
                    .or_insert_with(|| self.reasons.name(k.reason).into())
                    .clone(),
                packets: s.packets,
                rate: s.rate(cx.window, cx.now),
                rcvbuf: s.rcvbuf,
                ifname: s.ifname.clone(),
            }
        }));
    }
}

/// The drops families: per process, and per network namespace for drops no hook of this
/// kernel can put on a socket.
pub fn families(procs: &[(String, &ProcStats)], out: &mut Vec<MetricFamily>) {
    netns_family(procs, out);
    crate::probes::armed::families(out);
    per_process(
        "bufscope_socket_drops_total",
        "Packets dropped because a socket buffer or queue was full, by the owning process and kernel drop reason (GRO skbs weighted by segment count).",
        procs,
        out,
        |s, emit| {
            for ((proto, reason), v) in &s.drops.packets {
                emit(
                    &[("proto", proto.as_str()), ("reason", reason.as_str())],
                    *v as f64,
                );
            }
        },
    );
}

/// `bufscope_netns_drops_total{netns,proto,reason}`: drops this kernel's hooks cannot put on a
/// socket (no `kfree_skb.rx_sk`, before 6.11: e.g. TCP receive-queue drops), by the network
/// namespace of the receiving device (inode number as in `/proc/<pid>/ns/net`; 0 when the
/// skb had no device) and reason.
fn netns_family(procs: &[(String, &ProcStats)], out: &mut Vec<MetricFamily>) {
    use crate::probes::armed::sample;
    use prometheus::proto::MetricType;
    let mut sum: BTreeMap<(u32, Proto, &str), u64> = BTreeMap::new();
    for (_, s) in procs {
        for ((netns, proto, reason), v) in &s.drops.netns {
            *sum.entry((*netns, *proto, reason.as_str())).or_default() += v;
        }
    }
    if sum.is_empty() {
        return;
    }
    let mut mf = MetricFamily::default();
    mf.set_name("bufscope_netns_drops_total".into());
    mf.set_help(
        "Buffer-full drops this kernel's hooks cannot put on a socket (no kfree_skb rx_sk, before 6.11), by network namespace and kernel drop reason.".into(),
    );
    mf.set_field_type(MetricType::COUNTER);
    for ((netns, proto, reason), v) in sum {
        let netns = netns.to_string();
        let labels = [
            ("netns", netns.as_str()),
            ("proto", proto.as_str()),
            ("reason", reason),
        ];
        mf.mut_metric().push(sample(&labels, v as f64, true));
    }
    out.push(mf);
}
