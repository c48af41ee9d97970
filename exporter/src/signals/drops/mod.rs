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
mod netns;
mod probe;
mod read;
mod reader;
mod seen;
mod shared;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;

use foldhash::{HashMap, HashMapExt as _, HashSet};
use prometheus::proto::MetricFamily;
use std::time::{Duration, Instant};

use aya::Ebpf;
use bufscope_common::{DropKey, DropVal, drop_site, maps, total_family};

pub use netns::{MAX_NETNS_SERIES, NetnsDrops, NetnsSeries};
use netns::{NETNS_DROPS, netns_family};
pub use probe::{Flags, PROBE};
use probe::{per_packet, per_packet_line};
pub use reader::HOOK as READER_HOOK;
use reader::ReaderHook;
pub use seen::{HISTORY, HISTORY_STEP, Seen};
pub use shared::{QUIET, READER_WAIT, split};

use super::counted::{Changed, CountedMap};
use super::{
    AdviceCx, Attached, BuildCx, CheckLine, GcCx, MapFill, Part, PollCx, Room, Row, Services,
    Signal, absorb_counts,
};
use crate::advice::{Inputs, SocketDrops};
use crate::bpf::table::PerCpuHash;
use crate::bpf::{LoadPlan, ProbeSpec};
use crate::exposition::Spec;
use crate::kernel::{DropReasons, KernelBtf};
use crate::labels::Proto;
use crate::store::ProcRef;
use crate::totals::Total;

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
        absorb_counts(&mut self.packets, &o.packets);
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

    /// Every count, by proto and the kernel's reason number (a reason numbered above 255,
    /// none of the buffer-full ones, is not kept).
    fn counters(&self, out: &mut Vec<Total>) {
        for ((proto, reason), v) in &self.packets {
            let Some(n) = crate::labels::drop_reason_number(reason) else {
                continue;
            };
            if let (Ok(option), true) = (u8::try_from(n), *v > 0) {
                out.push(Total {
                    family: total_family::DROPS,
                    proto: proto.to_ip(),
                    option,
                    value: *v,
                });
            }
        }
    }

    fn restore_counter(&mut self, t: &Total) {
        if t.family == total_family::DROPS
            && let Some(name) = crate::labels::drop_reason_name(u16::from(t.option))
        {
            self.add(Proto::from_ip(t.proto), &name, t.value);
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

/// A delta waiting for its owner.
struct Held {
    packets: u64,
    since: Instant,
}

impl Changed for Seen {
    fn changed(&self) -> Instant {
        self.changed
    }
}

/// The drops room.
pub struct Drops {
    /// `DROPS`, with each key's state as of the last read.
    map: CountedMap<DropKey, DropVal, Seen>,
    reasons: DropReasons,
    held: HashMap<DropKey, Held>,
    hold: Duration,
    last_poll: Option<Instant>,
    /// Reason names by number (resolved once).
    names: HashMap<u16, String>,
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
    /// How the namespaces of the dropping sockets see the buffer limits: a socket that drops
    /// but was never sized has no story to bring its namespace's view in.
    limits: crate::signals::setsockopt::NsLimitCache,
}

impl Room for Drops {
    const PROBE: ProbeSpec = PROBE;
    type Part = ProcDrops;
    type Flags = Flags;
    type Setup = Setup;

    fn prepare(flags: &Flags, plan: &mut LoadPlan) -> anyhow::Result<Setup> {
        plan.map_entries(maps::DROPS.name, flags.entries);
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
        env: &BuildCx<'_>,
        _services: &mut Services,
    ) -> anyhow::Result<Option<Box<dyn Signal>>> {
        if !env.attached(PROBE.name) {
            return Ok(None);
        }
        // Counters kept across restarts name reasons by number.
        crate::labels::register_drop_reasons(env.reasons.iter().map(|(v, n)| (v, n.to_string())));
        let mut room = Self::new(
            PerCpuHash::take(ebpf, maps::DROPS)?,
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
    fn families(&self, procs: &[Row], out: &mut Vec<MetricFamily>) {
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
    fn poll(&mut self, cx: &mut PollCx<'_>) -> bool {
        self.zero_udp_series(cx);
        let generation = self.map.generation(cx.stats);
        if self.map.unchanged(generation) && self.held.is_empty() && self.late.is_empty() {
            let now = Instant::now();
            self.last_poll = Some(now);
            if let Some(sh) = &mut self.shared {
                // Nothing dropped: watched sockets may have gone quiet.
                sh.update(&HashSet::default(), cx.attr, now);
            }
            return false;
        }
        self.read(generation, cx.attr, cx.store);
        self.note_namespaces(cx.attr.procfs());
        true
    }

    fn map_fill(&self) -> Option<MapFill> {
        Some(self.map.fill())
    }

    fn gc_candidates(&self, idle: Duration) -> Vec<u64> {
        self.map
            .idle(idle, Instant::now())
            .filter(|(k, _)| k.site == drop_site::SOCKET && !self.held.contains_key(k))
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
            .map
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
                let name = self
                    .map
                    .last
                    .get(k)
                    .map(|s| s.ifname.as_str())
                    .unwrap_or("");
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
            self.map.last.remove(k);
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
        let namespaces: HashSet<u32> = self
            .map
            .last
            .keys()
            .filter(|k| k.site == drop_site::SOCKET)
            .map(|k| k.netns)
            .collect();
        self.limits.retain(|ns| namespaces.contains(&ns));
        doomed.len()
    }

    fn referenced(&self, out: &mut HashSet<ProcRef>) {
        out.extend(self.map.last.values().filter_map(|s| s.owner));
        if let Some(sh) = &self.shared {
            sh.referenced(out);
        }
    }

    fn advise(&self, cx: &AdviceCx<'_>, inputs: &mut Inputs) {
        self.limits.advise(inputs);
        let mut names: HashMap<u16, Arc<str>> = HashMap::new();
        inputs.drops.extend(self.map.last.iter().map(|(k, s)| {
            SocketDrops {
                owner: s.owner,
                inode: k.inode,
                netns: k.netns,
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

const SOCKET_DROPS: Spec = Spec::counter(
    "bufscope_socket_drops_total",
    "Packets dropped because a socket buffer or queue was full, by the owning process and kernel drop reason (GRO skbs weighted by segment count).",
    &["proto", "reason"],
);
