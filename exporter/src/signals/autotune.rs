//! TCP receive autotuning: `tcp_rcvbuf_grow` events per socket, from the `AUTOTUNE` map.
//! An event on a socket with `SOCK_RCVBUF_LOCK` (or with `tcp_moderate_rcvbuf = 0`) is a
//! moment where the kernel wanted a bigger buffer and was not allowed to grow it.
//!
//! Probe: `tp_btf/tcp_rcvbuf_grow` counts, per socket inode, grow attempts and those on locked
//! sockets, with the receiver's RTT, buffer and throughput at the latest one (`AUTOTUNE`).

use foldhash::{HashMap, HashMapExt as _, HashSet};
use prometheus::proto::MetricFamily;
use std::time::{Duration, Instant};

use aya::maps::{MapData, PerCpuHashMap};
use bufscope_common::{AutotuneVal, stat, total_family};

use super::{
    AdviceCx, BuildEnv, Cx, GcCx, MapFill, Part, ProcStats, Room, Services, Signal, Store, take_map,
};
use crate::advice::{Inputs, TuneView};
use crate::attribution::Attributor;
use crate::bpf::{Hook, LoadPlan, ProbeSpec};
use crate::exposition::Spec;
use crate::labels::Proto;
use crate::store::{ProcRef, Who};
use crate::totals::Total;

/// The probe: the best variant this kernel allows.
///
/// | variant | exact | kernels |
/// |---|---|---|
/// | `tp_btf/tcp_rcvbuf_grow` | yes: the kernel's own event | 6.16+ |
/// | `fentry`+`fexit/tcp_rcv_space_adjust` | yes: a grow is the call raising `rcvq_space.space` (the branch where 6.16+ fires the tracepoint) | fentry allowed |
/// | `tp_btf/tcp_rcv_space_adjust` + `tp_btf/inet_sock_set_state` | same events, each seen at the socket's next call (one measurement late while open), the last one when the owner closes it | any (4.16+) |
pub const PROBE: ProbeSpec = ProbeSpec {
    name: "autotune",
    what: "tcp_rcvbuf_grow on sockets with SOCK_RCVBUF_LOCK (autotuning suppressed), RTT, throughput",
    variants: &[
        &[Hook::BtfTracepoint {
            prog: "tcp_rcvbuf_grow",
            name: "tcp_rcvbuf_grow",
        }],
        &[
            Hook::Fentry {
                prog: "rcv_space_entry",
                func: "tcp_rcv_space_adjust",
            },
            Hook::Fexit {
                prog: "rcv_space_exit",
                func: "tcp_rcv_space_adjust",
            },
        ],
        &[
            Hook::BtfTracepoint {
                prog: "rcv_space_tp",
                name: "tcp_rcv_space_adjust",
            },
            Hook::BtfTracepoint {
                prog: "rcv_space_flush",
                name: "inet_sock_set_state",
            },
        ],
    ],
    is_drop_probe: false,
    attributed: true,
};

/// The autotune room's own flags.
#[derive(clap::Args, Clone, Debug)]
#[group(skip)]
pub struct Flags {
    /// Entries of the per-socket autotune map.
    #[arg(
        id = "autotune_entries",
        long = "bpf.autotune-map-entries",
        default_value_t = 16384,
        value_name = "N",
        value_parser = crate::values::at_least_one::<u32>
    )]
    pub entries: u32,
}

const SUPPRESSED: Spec = Spec::counter(
    "bufscope_tcp_autotune_suppressed_total",
    "tcp_rcvbuf_grow events (the kernel wanted a bigger receive buffer) on sockets whose autotuning is off.",
    &[],
);

/// What this signal adds to a process.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcAutotune {
    /// `tcp_rcvbuf_grow` events on sockets whose autotuning is off.
    pub suppressed: u64,
    /// Of them, those of sockets whose `AUTOTUNE` entries were collected (closed while the
    /// process lives): kept in `TOTALS` for a restart, which reads the live sockets' counts
    /// back from the pinned map.
    pub retired: u64,
}

impl Part for ProcAutotune {
    fn absorb(&mut self, o: &Self) {
        self.suppressed += o.suppressed;
        self.retired += o.retired;
    }

    fn has_counts(&self) -> bool {
        self.suppressed > 0
    }

    fn status(&self, row: &mut bufscope_api::ProcessRow) {
        row.tcp_autotune_suppressed = self.suppressed;
    }

    fn totals(&self, out: &mut Vec<Total>) {
        if self.retired > 0 {
            out.push(Total {
                family: total_family::AUTOTUNE_RETIRED,
                proto: Proto::Tcp.to_ip(),
                option: 0,
                value: self.retired,
            });
        }
    }

    fn restore(&mut self, t: &Total) {
        if t.family == total_family::AUTOTUNE_RETIRED {
            self.suppressed += t.value;
            self.retired += t.value;
        }
    }
}

/// Latest state of one TCP socket.
#[derive(Clone, Debug)]
pub struct SockTune {
    /// Cumulative grow events.
    pub grow_events: u64,
    /// Cumulative suppressed events.
    pub suppressed: u64,
    /// When the counts last moved.
    pub changed: Instant,
    /// Receiver RTT estimate (µs) at the latest event.
    pub rtt_us: u32,
    /// `sk_rcvbuf` at the latest event.
    pub rcvbuf: i32,
    /// Bytes the reader consumed in the latest RTT-long interval.
    pub copied: u64,
    /// Length of that interval (µs).
    pub interval_us: u64,
    /// Lock bits at the latest event.
    pub userlocks: u32,
    /// Owner.
    pub owner: Option<ProcRef>,
}

/// The autotune room.
pub struct Autotune {
    map: PerCpuHashMap<MapData, u64, AutotuneVal>,
    max_entries: u32,
    last: HashMap<u64, SockTune>,
    /// `stat::AUTOTUNE_SEEN` as read just before the last full read of the map.
    generation: Option<u64>,
    /// Suppressed events of collected entries (closed sockets) of live processes, added to
    /// their [`ProcAutotune::retired`] at the next poll.
    retiring: Vec<(ProcRef, u64)>,
}

fn sum(values: &[AutotuneVal]) -> AutotuneVal {
    let mut t = AutotuneVal::default();
    for v in values {
        t.grow_events += v.grow_events;
        t.suppressed += v.suppressed;
        if v.last_ns >= t.last_ns && v.grow_events > 0 {
            t.last_ns = v.last_ns;
            t.rtt_us = v.rtt_us;
            t.rcvbuf = v.rcvbuf;
            t.copied = v.copied;
            t.interval_us = v.interval_us;
            t.userlocks = v.userlocks;
            t.netns = v.netns;
        }
    }
    t
}

impl Room for Autotune {
    const PROBE: ProbeSpec = PROBE;
    type Part = ProcAutotune;
    type Flags = Flags;
    type Setup = u32;

    fn prepare(flags: &Flags, plan: &mut LoadPlan) -> anyhow::Result<u32> {
        plan.map_entries("AUTOTUNE", flags.entries);
        Ok(flags.entries)
    }

    fn take(
        entries: u32,
        ebpf: &mut aya::Ebpf,
        env: &BuildEnv<'_>,
        _services: &mut Services,
    ) -> anyhow::Result<Option<Box<dyn Signal>>> {
        if !env.attached(PROBE.name) {
            return Ok(None);
        }
        Ok(Some(Box::new(Self::new(
            take_map(ebpf, "AUTOTUNE")?,
            entries,
        ))))
    }
}

impl Autotune {
    /// Wraps the `AUTOTUNE` map.
    pub fn new(map: PerCpuHashMap<MapData, u64, AutotuneVal>, max_entries: u32) -> Self {
        Self {
            map,
            max_entries,
            last: HashMap::new(),
            generation: None,
            retiring: Vec::new(),
        }
    }

    /// Reads the map and attributes new suppressed events.
    fn read(&mut self, attr: &mut Attributor, store: &mut Store) {
        let now = Instant::now();
        let mut current = Vec::new();
        for item in self.map.iter() {
            match item {
                Ok((k, v)) => current.push((k, sum(&v))),
                Err(e) => {
                    tracing::debug!("AUTOTUNE iteration: {e}");
                    break;
                }
            }
        }
        // Suppressed events follow the socket to its live holder (an accepted socket handed
        // to a worker), like drops.
        let moved: HashSet<u64> = current
            .iter()
            .filter(|(ino, v)| v.suppressed > self.last.get(ino).map_or(0, |p| p.suppressed))
            .map(|(ino, _)| *ino)
            .collect();
        attr.refresh_holders(&moved);
        attr.apply_renames(store);
        let unknown: HashSet<u64> = current
            .iter()
            .filter(|(ino, v)| {
                let prev = self.last.get(ino).map_or(0, |p| p.suppressed);
                v.suppressed > prev && attr.lookup_inode(*ino).is_none()
            })
            .map(|(ino, _)| *ino)
            .collect();
        attr.resolve_inodes(&unknown);
        for (ino, v) in current {
            let prev = self.last.get(&ino);
            let d = match prev {
                Some(p) if v.suppressed >= p.suppressed => v.suppressed - p.suppressed,
                _ => v.suppressed,
            };
            let moved = prev.is_none_or(|p| p.grow_events != v.grow_events);
            let mut owner = prev.and_then(|p| p.owner);
            if d > 0 || owner.is_none() {
                owner = attr.lookup_inode(ino).or(owner);
            }
            if d > 0 {
                let who = owner.map_or(Who::Unknown, Who::Proc);
                if owner.is_none() {
                    store.count_unknown(PROBE.name, d);
                }
                store
                    .proc_mut(who, || owner.map(|p| attr.meta(&p)).unwrap_or_default())
                    .parts
                    .autotune
                    .suppressed += d;
            }
            self.last.insert(
                ino,
                SockTune {
                    grow_events: v.grow_events,
                    suppressed: v.suppressed,
                    changed: if moved {
                        now
                    } else {
                        prev.map_or(now, |p| p.changed)
                    },
                    rtt_us: v.rtt_us,
                    rcvbuf: v.rcvbuf,
                    copied: v.copied,
                    interval_us: v.interval_us,
                    userlocks: v.userlocks,
                    owner,
                },
            );
        }
    }
}

impl Signal for Autotune {
    fn name(&self) -> &'static str {
        PROBE.name
    }

    fn families(&self, procs: &[(String, &ProcStats)], out: &mut Vec<MetricFamily>) {
        SUPPRESSED.per_process_value(procs, out, |s| {
            Some(s.parts.autotune.suppressed).filter(|n| *n > 0)
        });
    }

    fn map_counters(&self) -> &'static [&'static str] {
        &[SUPPRESSED.name]
    }

    /// Reads the map unless the probe's `stat::AUTOTUNE_SEEN` generation shows that no event
    /// was counted since the last full read.
    fn poll(&mut self, cx: &mut Cx<'_>) -> bool {
        for (p, n) in std::mem::take(&mut self.retiring) {
            if cx.store.get(&p).is_some() {
                let attr = &*cx.attr;
                cx.store
                    .proc_mut(Who::Proc(p), || attr.meta(&p))
                    .parts
                    .autotune
                    .retired += n;
            }
        }
        let generation = cx.stats.and_then(|s| s.total(stat::AUTOTUNE_SEEN));
        if generation.is_some() && generation == self.generation {
            return false;
        }
        self.read(cx.attr, cx.store);
        self.generation = generation;
        true
    }

    fn map_fill(&self) -> Option<MapFill> {
        Some(MapFill {
            map: "AUTOTUNE",
            entries: self.last.len() as u64,
            max_entries: self.max_entries as u64,
        })
    }

    fn gc_candidates(&self, idle: Duration) -> Vec<u64> {
        let now = Instant::now();
        self.last
            .iter()
            .filter(|(_, s)| now.duration_since(s.changed) >= idle)
            .map(|(ino, _)| *ino)
            .collect()
    }

    /// Deletes idle entries of sockets that no longer exist.
    fn gc(&mut self, cx: &mut GcCx<'_>) -> usize {
        let now = Instant::now();
        let doomed: Vec<u64> = self
            .last
            .iter()
            .filter(|(ino, s)| now.duration_since(s.changed) >= cx.idle && !cx.live.contains(ino))
            .map(|(ino, _)| *ino)
            .collect();
        for ino in &doomed {
            let _ = self.map.remove(ino);
            if let Some(t) = self.last.remove(ino)
                && let Some(p) = t.owner.filter(|p| t.suppressed > 0 && cx.attr.alive(p))
            {
                self.retiring.push((p, t.suppressed));
            }
        }
        doomed.len()
    }

    fn advise(&self, _cx: &AdviceCx<'_>, inputs: &mut Inputs) {
        inputs
            .tunes
            .extend(self.last.iter().map(|(ino, t)| TuneView {
                owner: t.owner,
                inode: *ino,
                suppressed: t.suppressed,
                rtt_us: t.rtt_us,
                rcvbuf: t.rcvbuf,
                copied: t.copied,
                interval_us: t.interval_us,
            }));
    }
}
