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

mod attribute;
mod read;
mod reader;
mod seen;
mod shared;

use std::collections::BTreeMap;
use std::sync::Arc;

use foldhash::{HashMap, HashMapExt as _, HashSet};
use prometheus::proto::MetricFamily;
use std::time::{Duration, Instant};

use aya::Ebpf;
use aya::maps::{MapData, PerCpuHashMap};
use bufscope_common::{DropKey, DropVal, drop_site, stat};

pub use reader::HOOK as READER_HOOK;
use reader::ReaderHook;
pub use seen::{HISTORY, HISTORY_STEP, Seen};
pub use shared::{QUIET, READER_WAIT, split};

use super::{
    AdviceCx, Attached, BuildEnv, CheckLine, Cx, GcCx, MapFill, Part, ProcStats, Room, Services,
    Signal, take_map,
};
use crate::advice::{Inputs, SocketDrops};
use crate::bpf::{BatchReader, BtfNeed, Hook, LoadPlan, ProbeSpec};
use crate::exposition::Spec;
use crate::kernel::{DropReasons, KernelBtf};
use crate::labels::Proto;
use crate::store::ProcRef;

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
    attributed: true,
};

/// The drops room's own flags.
#[derive(clap::Args, Clone, Debug)]
#[group(skip)]
pub struct Flags {
    /// Entries of the per-socket drop map.
    #[arg(
        id = "drops_entries",
        long = "bpf.drops-map-entries",
        default_value_t = 16384,
        value_name = "N",
        value_parser = crate::values::at_least_one::<u32>
    )]
    pub entries: u32,
    /// How long drops of a socket whose owner is not found yet are held before they are
    /// counted under `comm="_unknown"`.
    #[arg(id = "attribution_hold", long = "attribution.hold", default_value = "10s", value_parser = crate::values::parse_duration, value_name = "DURATION")]
    pub hold: Duration,
    /// Never attach a drops hook that runs for every received datagram
    /// (`fexit/__udp_enqueue_schedule_skb`, chosen where the kernel has neither `kfree_skb`'s
    /// `rx_sk` (6.11+) nor an IPv6 `udp_fail_queue_rcv_skb` (≈6.4+), e.g. Debian 12's 6.1):
    /// IPv6 UDP buffer-full drops are then counted per network namespace
    /// (`bufscope_netns_drops_total`, kernels with drop reasons, 5.17+) instead of per process,
    /// and not at all before 5.17. `bufscope check` says whether this kernel needs it.
    #[arg(id = "drops_zero_per_packet", long = "drops.zero-per-packet")]
    pub zero_per_packet: bool,
}

/// Whether variant `v` of [`PROBE`] has a hook that runs for every received UDP datagram (the
/// fexit on the UDP enqueue; every other drops hook runs only when something is dropped).
fn per_packet(v: usize) -> bool {
    PROBE
        .variants
        .get(v)
        .is_some_and(|hooks| hooks.iter().any(|h| matches!(h, Hook::Fexit { .. })))
}

/// What the drops room resolved before loading.
pub struct Setup {
    flags: Flags,
    /// The reader hook's program is loaded.
    reader: bool,
}

/// What this signal adds to a process.
#[derive(Clone, Debug, Default)]
pub struct ProcDrops {
    /// Dropped packets by (proto, reason name).
    pub packets: BTreeMap<(Proto, String), u64>,
}

impl Part for ProcDrops {
    fn absorb(&mut self, o: &Self) {
        for (k, v) in &o.packets {
            *self.packets.entry(k.clone()).or_default() += v;
        }
    }

    fn has_counts(&self) -> bool {
        !self.packets.is_empty()
    }

    fn status(&self, row: &mut bufscope_api::ProcessRow) {
        row.drops = self
            .packets
            .iter()
            .map(|((proto, reason), v)| (format!("{}/{reason}", proto.as_str()), *v))
            .collect();
        row.drops_total = self.packets.values().sum();
    }

    /// After an exec the process's drop series go on at 0 under its new labels.
    fn after_exec(&self) -> Self {
        Self {
            packets: self.packets.keys().map(|k| (k.clone(), 0)).collect(),
        }
    }
}

impl ProcDrops {
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
}

/// Most `bufscope_netns_drops_total` series (network namespace × proto × reason); beyond, the
/// least recently counting one is folded into `netns="_other"` (sums never go down).
pub const MAX_NETNS_SERIES: usize = 1024;
/// The `netns` key that stands for folded namespaces (rendered `_other`).
const NETNS_OTHER: u32 = u32::MAX;

/// One `bufscope_netns_drops_total` series.
#[derive(Clone, Copy, Debug)]
pub struct NetnsSeries {
    /// Drops so far.
    pub packets: u64,
    /// When it last counted.
    pub changed: Instant,
}

/// The `bufscope_netns_drops_total` series, bounded: a series leaves `retention` after its
/// last count once no process is in its namespace (as an exited process's), and at most
/// [`MAX_NETNS_SERIES`] exist.
#[derive(Default)]
pub struct NetnsDrops {
    series: BTreeMap<(u32, Proto, String), NetnsSeries>,
}

impl NetnsDrops {
    /// Counts `n` drops in `netns`.
    pub fn add(&mut self, netns: u32, proto: Proto, reason: String, n: u64, now: Instant) {
        let key = (netns, proto, reason);
        if !self.series.contains_key(&key) {
            // (`_other` counts against the bound too.)
            while self.series.len() >= MAX_NETNS_SERIES && self.fold_least_recent() {}
        }
        let s = self.series.entry(key).or_insert(NetnsSeries {
            packets: 0,
            changed: now,
        });
        s.packets += n;
        s.changed = now;
    }

    /// Folds the series that counted least recently into `netns="_other"` (false: nothing
    /// left to fold).
    fn fold_least_recent(&mut self) -> bool {
        let victim = self
            .series
            .iter()
            .filter(|((ns, _, _), _)| *ns != NETNS_OTHER)
            .min_by_key(|(_, s)| s.changed)
            .map(|(k, _)| k.clone());
        let Some(k) = victim else { return false };
        let Some(old) = self.series.remove(&k) else {
            return false;
        };
        let other = self
            .series
            .entry((NETNS_OTHER, k.1, k.2))
            .or_insert(NetnsSeries {
                packets: 0,
                changed: old.changed,
            });
        other.packets += old.packets;
        true
    }

    /// Forgets the series idle for `retention` whose namespace `alive` says is gone; returns
    /// how many went.
    pub fn expire(
        &mut self,
        retention: Duration,
        now: Instant,
        alive: impl Fn(u32) -> bool,
    ) -> usize {
        let before = self.series.len();
        self.series.retain(|(ns, _, _), s| {
            *ns == NETNS_OTHER || now.duration_since(s.changed) < retention || alive(*ns)
        });
        before - self.series.len()
    }

    /// Whether a series has been idle for `retention` (only then are namespaces looked up).
    pub fn any_idle(&self, retention: Duration, now: Instant) -> bool {
        self.series
            .iter()
            .any(|((ns, _, _), s)| *ns != NETNS_OTHER && now.duration_since(s.changed) >= retention)
    }

    /// Number of series.
    pub fn len(&self) -> usize {
        self.series.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
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
    /// `bufscope_netns_drops_total`, bounded.
    netns: NetnsDrops,
    /// Drops an entry gained between its last read and its deletion (taken with the delete:
    /// [`crate::bpf::BatchReader::take`]), with the owner it had: counted at the next poll.
    late: Vec<(DropKey, u64, Option<ProcRef>)>,
}

impl Room for Drops {
    const PROBE: ProbeSpec = PROBE;
    type Part = ProcDrops;
    type Flags = Flags;
    type Setup = Setup;

    fn prepare(flags: &Flags, plan: &mut LoadPlan) -> anyhow::Result<Setup> {
        plan.map_entries("DROPS", flags.entries);
        if flags.zero_per_packet {
            for v in (0..PROBE.variants.len()).filter(|v| per_packet(*v)) {
                plan.pass_over(
                    PROBE.name,
                    v,
                    "--drops.zero-per-packet: fexit/__udp_enqueue_schedule_skb runs for every \
                     received UDP datagram",
                );
            }
        }
        Ok(Setup {
            flags: flags.clone(),
            reader: false,
        })
    }

    /// Loads the reader hook when the drops probe attached (it is attached later, only while
    /// a shared socket drops).
    fn after_attach(setup: &mut Setup, ebpf: &mut Ebpf, cx: &Attached<'_>) -> anyhow::Result<()> {
        if crate::bpf::hook::attached(cx.status, PROBE.name) {
            setup.reader = reader::load(ebpf, cx.btf, cx.kernel);
        }
        Ok(())
    }

    fn take(
        setup: Setup,
        ebpf: &mut Ebpf,
        env: &BuildEnv<'_>,
        _services: &mut Services,
    ) -> anyhow::Result<Option<Box<dyn Signal>>> {
        if !env.attached(PROBE.name) {
            return Ok(None);
        }
        let mut room = Self::new(
            take_map(ebpf, "DROPS")?,
            setup.flags.entries,
            env.reasons.clone(),
            setup.flags.hold,
        );
        if setup.reader {
            room.shared = Some(shared::Shared::new(ReaderHook::take(ebpf)?));
        }
        room.retire = env.pins.is_some();
        room.adopted = env.pins.as_ref().is_some_and(|o| o.kept_maps());
        Ok(Some(Box::new(room)))
    }

    fn check(kernel: &KernelBtf) -> Vec<CheckLine> {
        let (ok, detail) = match reader::available(kernel) {
            Ok(()) => (
                true,
                "tp_btf/sock_recv_length available: attached only while a shared socket drops, \
                 its drops go to the processes that read it"
                    .to_string(),
            ),
            Err(why) => (
                false,
                format!("unavailable ({why}): a shared socket's drops go to its newest holder"),
            ),
        };
        vec![
            CheckLine {
                ok,
                what: "reader hook",
                detail,
            },
            per_packet_line(kernel),
        ]
    }
}

impl Signal for Drops {
    fn name(&self) -> &'static str {
        PROBE.name
    }

    /// Per process, per network namespace for drops no hook of this kernel can put on a
    /// socket, and the reader hook's state.
    fn families(&self, procs: &[(String, &ProcStats)], out: &mut Vec<MetricFamily>) {
        netns_family(&self.netns, out);
        if let Some(sh) = &self.shared {
            sh.hook().families(out);
        }
        SOCKET_DROPS.per_process(procs, out, |s, emit| {
            for ((proto, reason), v) in &s.parts.drops.packets {
                emit(&[proto.as_str(), reason.as_str()], *v as f64);
            }
        });
    }

    fn map_counters(&self) -> &'static [&'static str] {
        &[SOCKET_DROPS.name, NETNS_DROPS.name]
    }

    /// Reads the map unless the probe's `stat::DROPS_SEEN` generation shows that nothing was
    /// counted since the last full read and no delta waits for its owner. Reading the map
    /// costs syscalls per entry, so an idle host with thousands of sockets that once dropped
    /// would otherwise pay for them every poll.
    fn poll(&mut self, cx: &mut Cx<'_>) -> bool {
        self.zero_udp_series(cx);
        let generation = cx.stats.and_then(|s| s.total(stat::DROPS_SEEN));
        if generation.is_some()
            && generation == self.generation
            && self.held.is_empty()
            && self.late.is_empty()
        {
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
    /// held by any process), so the map does not fill with closed sockets. An entry without a
    /// socket (a device's, a namespace's) can count again at any moment while its device or
    /// namespace is there, and a drop counted on another CPU while the kernel deletes it would
    /// be lost: it goes once idle and no process holds its TUN device, or its namespace has no
    /// process left (namespace 0, drops of skbs without a device, stays: a handful of keys).
    fn gc(&mut self, cx: &mut GcCx<'_>) -> usize {
        let (live, idle) = (cx.live, cx.idle);
        let now = Instant::now();
        let attr = &*cx.attr;
        let mut doomed: Vec<DropKey> = self
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
        if doomed.iter().any(|k| k.site == drop_site::NETNS) {
            let procfs = cx.attr.procfs();
            let alive: HashSet<u32> = procfs
                .pids()
                .into_iter()
                .filter_map(|p| procfs.netns(p))
                .collect();
            doomed.retain(|k| {
                k.site != drop_site::NETNS || (k.netns != 0 && !alive.contains(&k.netns))
            });
        }
        doomed.retain(|k| {
            k.site != drop_site::DEVICE || {
                let name = self.last.get(k).map(|s| s.ifname.as_str()).unwrap_or("");
                cx.attr.tun(k.netns, name).is_none()
            }
        });
        let attr = &*cx.attr;
        if self.retire {
            self.fold(&doomed, attr, now);
        }
        for k in &doomed {
            // Read and deleted in one step: a drop counted since the last read (an idle key of
            // a namespace, a closed socket's last packets) is not lost but counted at the next
            // poll; a re-created key starts from zero.
            self.take_entry(k);
            self.last.remove(k);
            if k.site == drop_site::SOCKET {
                cx.attr.forget_inode(k.inode);
                if let Some(sh) = &mut self.shared {
                    sh.forget(k.inode);
                }
            }
        }
        if self.netns.any_idle(cx.retention, now) {
            let procfs = cx.attr.procfs();
            let alive: HashSet<u32> = procfs
                .pids()
                .into_iter()
                .filter_map(|p| procfs.netns(p))
                .collect();
            self.netns
                .expire(cx.retention, now, |ns| alive.contains(&ns));
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

/// What the drops probe costs per received datagram on `kernel`, and the trade-off of
/// `--drops.zero-per-packet`.
fn per_packet_line(kernel: &KernelBtf) -> CheckLine {
    let first_usable = PROBE
        .variants
        .iter()
        .position(|hooks| crate::bpf::usable(hooks, kernel).is_ok());
    let detail = match first_usable {
        Some(v) if per_packet(v) => {
            let without = if kernel_has_reasons(kernel) {
                "are counted per network namespace (bufscope_netns_drops_total)"
            } else {
                "are not counted at all (no drop reasons before 5.17)"
            };
            format!(
                "fexit/__udp_enqueue_schedule_skb runs for every received UDP datagram: the \
                 price of IPv6 UDP drops per process on this kernel; with \
                 --drops.zero-per-packet they {without}"
            )
        }
        Some(_) => "none: drops are seen when they happen, nothing runs per datagram".into(),
        None => "no variant of the drops probe is usable".into(),
    };
    CheckLine {
        ok: true,
        what: "per-packet cost",
        detail,
    }
}

/// Whether `kfree_skb` carries a drop reason on this kernel (5.17+).
fn kernel_has_reasons(kernel: &KernelBtf) -> bool {
    crate::bpf::usable(&[KFREE_SKB_NOKS], kernel).is_ok()
}

const SOCKET_DROPS: Spec = Spec::counter(
    "bufscope_socket_drops_total",
    "Packets dropped because a socket buffer or queue was full, by the owning process and kernel drop reason (GRO skbs weighted by segment count).",
    &["proto", "reason"],
);

const NETNS_DROPS: Spec = Spec::counter(
    "bufscope_netns_drops_total",
    "Buffer-full drops this kernel's hooks cannot put on a socket (no kfree_skb rx_sk, before 6.11), by network namespace and kernel drop reason.",
    &["netns", "proto", "reason"],
);

/// `bufscope_netns_drops_total{netns,proto,reason}`: drops this kernel's hooks cannot put on a
/// socket (no `kfree_skb.rx_sk`, before 6.11: e.g. TCP receive-queue drops), by the network
/// namespace of the receiving device (inode number as in `/proc/<pid>/ns/net`; 0 when the
/// skb had no device; `_other` for namespaces folded beyond [`MAX_NETNS_SERIES`]) and reason.
fn netns_family(netns: &NetnsDrops, out: &mut Vec<MetricFamily>) {
    let mut f = NETNS_DROPS.family();
    for ((ns, proto, reason), s) in &netns.series {
        let label = if *ns == NETNS_OTHER {
            "_other".to_string()
        } else {
            ns.to_string()
        };
        f.push(&[&label, proto.as_str(), reason], s.packets as f64);
    }
    f.done(out);
}

#[cfg(test)]
mod netns_tests {
    use super::*;

    #[test]
    fn netns_series_are_capped_and_sums_kept() {
        let mut n = NetnsDrops::default();
        let t0 = Instant::now();
        for i in 0..(MAX_NETNS_SERIES as u32 + 50) {
            let at = t0 + Duration::from_millis(i as u64);
            n.add(i + 1, Proto::Tcp, "TCP_ZEROWINDOW".into(), 2, at);
        }
        assert!(n.len() <= MAX_NETNS_SERIES, "{}", n.len());
        let total: u64 = n.series.values().map(|s| s.packets).sum();
        assert_eq!(
            total,
            2 * (MAX_NETNS_SERIES as u64 + 50),
            "folded, not lost"
        );
        assert!(
            n.series
                .contains_key(&(NETNS_OTHER, Proto::Tcp, "TCP_ZEROWINDOW".into()))
        );
        // The oldest went first: the newest namespace is still there.
        assert!(n.series.contains_key(&(
            MAX_NETNS_SERIES as u32 + 50,
            Proto::Tcp,
            "TCP_ZEROWINDOW".into()
        )));
    }

    #[test]
    fn netns_series_leave_with_their_namespace_after_the_retention() {
        let mut n = NetnsDrops::default();
        let t0 = Instant::now();
        n.add(7, Proto::Udp, "SOCKET_RCVBUFF".into(), 5, t0);
        n.add(8, Proto::Udp, "SOCKET_RCVBUFF".into(), 5, t0);
        let r = Duration::from_secs(60);
        assert!(!n.any_idle(r, t0 + Duration::from_secs(59)));
        assert_eq!(
            n.expire(r, t0 + Duration::from_secs(59), |_| false),
            0,
            "within retention"
        );
        assert!(n.any_idle(r, t0 + r));
        assert_eq!(n.expire(r, t0 + r, |ns| ns == 8), 1, "namespace 7 is gone");
        assert_eq!(n.len(), 1);
    }
}
