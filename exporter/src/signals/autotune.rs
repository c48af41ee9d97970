//! TCP receive autotuning: `tcp_rcvbuf_grow` events per socket, from the `AUTOTUNE` map.
//! An event on a socket with `SOCK_RCVBUF_LOCK` (or with `tcp_moderate_rcvbuf = 0`) is a
//! moment where the kernel wanted a bigger buffer and was not allowed to grow it.
//!
//! Probe: `tp_btf/tcp_rcvbuf_grow` counts, per socket inode, grow attempts and those on locked
//! sockets, with the receiver's RTT, buffer and throughput at the latest one (`AUTOTUNE`).

use foldhash::HashSet;
use prometheus::proto::MetricFamily;
use std::time::{Duration, Instant};

use bufscope_common::{AutotuneVal, maps, stat, total_family};

use super::counted::{Changed, CountedMap};
use super::{
    AdviceCx, BuildCx, GcCx, MapFill, Part, PollCx, Room, Row, Services, Signal, Store,
    counters_of, who_or_unknown,
};
use crate::advice::{Inputs, TuneView};
use crate::attribution::{Attributor, Cause};
use crate::bpf::table::PerCpuHash;
use crate::bpf::{Hook, LoadPlan, PerCpuTable, ProbeSpec};
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
        long = "autotune.map-entries",
        alias = "bpf.autotune-map-entries",
        default_value_t = maps::AUTOTUNE.default_entries,
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

    /// All of them (departed processes: nothing of theirs is left in `AUTOTUNE`).
    fn counters(&self, out: &mut Vec<Total>) {
        if self.suppressed > 0 {
            out.push(Total {
                family: total_family::AUTOTUNE_SUPPRESSED,
                proto: Proto::Tcp.to_ip(),
                option: 0,
                value: self.suppressed,
            });
        }
    }

    fn restore_counter(&mut self, t: &Total) {
        match t.family {
            total_family::AUTOTUNE_SUPPRESSED => self.suppressed += t.value,
            _ => self.restore(t),
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

impl Changed for SockTune {
    fn changed(&self) -> Instant {
        self.changed
    }
}

/// The autotune room.
pub struct Autotune {
    /// `AUTOTUNE`, with each socket's state as of the last read.
    map: CountedMap<u64, AutotuneVal, SockTune>,
    /// Suppressed events of collected entries (closed sockets) of live processes, added to
    /// their [`ProcAutotune::retired`] at the next poll.
    retiring: Vec<(ProcRef, u64)>,
    /// Grows held at the last read for an owner look-up: the next poll reads the map again
    /// even if the probe counted nothing since (the held delta is taken then).
    held: bool,
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
        plan.map_entries(maps::AUTOTUNE.name, flags.entries);
        Ok(flags.entries)
    }

    fn take(
        entries: u32,
        ebpf: &mut aya::Ebpf,
        env: &BuildCx<'_>,
        _services: &mut Services,
    ) -> anyhow::Result<Option<Box<dyn Signal>>> {
        if !env.attached(PROBE.name) {
            return Ok(None);
        }
        Ok(Some(Box::new(Self::new(
            PerCpuHash::take(ebpf, maps::AUTOTUNE)?,
            entries,
        ))))
    }
}

impl Autotune {
    /// Wraps the `AUTOTUNE` map (the kernel's, or a fake in tests).
    pub fn new(map: PerCpuTable<u64, AutotuneVal>, max_entries: u32) -> Self {
        Self {
            map: CountedMap::new(maps::AUTOTUNE, max_entries, map, stat::AUTOTUNE_SEEN, sum),
            retiring: Vec::new(),
            held: false,
        }
    }

    /// Reads the map (`generation`: the probe's, read before) and attributes new suppressed
    /// events.
    fn read(&mut self, generation: Option<u64>, attr: &mut Attributor, store: &mut Store) {
        let now = Instant::now();
        self.held = false;
        let current = self.map.read(generation);
        let last = &self.map.last;
        // Suppressed events follow the socket to its live holder (an accepted socket handed
        // to a worker), like drops.
        let moved: HashSet<u64> = current
            .iter()
            .filter(|(ino, v)| v.suppressed > last.get(ino).map_or(0, |p| p.suppressed))
            .map(|(ino, _)| *ino)
            .collect();
        attr.refresh_holders(&moved);
        attr.apply_renames(store);
        let unknown: HashSet<u64> = current
            .iter()
            .filter(|(ino, v)| {
                let prev = last.get(ino).map_or(0, |p| p.suppressed);
                v.suppressed > prev && attr.lookup_inode(*ino).is_none()
            })
            .map(|(ino, _)| *ino)
            .collect();
        attr.resolve_inodes(Cause::Autotune, &unknown);
        for (ino, v) in current {
            let prev = self.map.last.get(&ino);
            let d = match prev {
                Some(p) if v.suppressed >= p.suppressed => v.suppressed - p.suppressed,
                _ => v.suppressed,
            };
            let moved = prev.is_none_or(|p| p.grow_events != v.grow_events);
            let mut owner = prev.and_then(|p| p.owner);
            if d > 0 || owner.is_none() {
                owner = attr.lookup_inode(ino).or(owner);
            }
            // Its owner is being looked up: the new grows wait for it (the map keeps counting;
            // the delta is taken at the poll after the answer).
            if d > 0 && owner.is_none() && attr.pending(ino) {
                self.held = true;
                continue;
            }
            if d > 0 {
                let who = who_or_unknown(store, PROBE.name, owner, d);
                counters_of(store, attr, who).parts.autotune.suppressed += d;
            }
            self.map.last.insert(
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

    fn families(&self, procs: &[Row], out: &mut Vec<MetricFamily>) {
        SUPPRESSED.per_process_value(procs, out, |s| {
            Some(s.parts.autotune.suppressed).filter(|n| *n > 0)
        });
    }

    fn map_counters(&self) -> &'static [&'static str] {
        &[SUPPRESSED.name]
    }

    /// Reads the map unless the probe's `stat::AUTOTUNE_SEEN` generation shows that no event
    /// was counted since the last full read.
    fn poll(&mut self, cx: &mut PollCx<'_>) -> bool {
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
        let generation = self.map.generation(cx.stats);
        if self.map.unchanged(generation) && !self.held {
            return false;
        }
        self.read(generation, cx.attr, cx.store);
        true
    }

    fn map_fill(&self) -> Option<MapFill> {
        Some(self.map.fill())
    }

    fn gc_candidates(&self, idle: Duration) -> Vec<u64> {
        self.map
            .idle(idle, Instant::now())
            .map(|(ino, _)| *ino)
            .collect()
    }

    /// Deletes idle entries of sockets that no longer exist.
    fn gc(&mut self, cx: &mut GcCx<'_>) -> usize {
        let doomed: Vec<u64> = self
            .map
            .idle(cx.idle, Instant::now())
            .filter(|(ino, _)| !cx.live.contains(ino))
            .map(|(ino, _)| *ino)
            .collect();
        for ino in &doomed {
            self.map.remove(ino);
            if let Some(t) = self.map.last.remove(ino)
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
            .extend(self.map.last.iter().map(|(ino, t)| TuneView {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::bpf::fake::FakeTable;
    use crate::signals::testkit::{Bench, gone_inode, me, my_proc, udp_socket};
    use bufscope_common::SOCK_RCVBUF_LOCK;

    fn grow(grow_events: u64, suppressed: u64) -> AutotuneVal {
        AutotuneVal {
            grow_events,
            suppressed,
            last_ns: grow_events,
            rtt_us: 190_000,
            rcvbuf: 131_072,
            copied: 1 << 20,
            interval_us: 190_000,
            userlocks: SOCK_RCVBUF_LOCK as u32,
            ..AutotuneVal::default()
        }
    }

    const SUPPRESSED_TOTAL: &str = "bufscope_tcp_autotune_suppressed_total";

    /// Suppressed grows go to the socket's owner as deltas of the kernel's cumulative counts,
    /// summed over CPUs; the map is read again only when the probe's generation moved.
    #[test]
    fn suppressed_grows_are_counted_once_on_the_owner() {
        let mut b = Bench::new();
        let kernel = FakeTable::new(64);
        let mut room = Autotune::new(kernel.boxed(), 64);
        let ino = gone_inode(1);
        b.owners.set(ino, me());
        kernel.set(ino, vec![grow(3, 2), grow(1, 1)]);
        b.bump(stat::AUTOTUNE_SEEN);
        assert!(room.poll(&mut b.poll()), "read: advice inputs changed");
        let pid = my_proc().tgid;
        assert_eq!(b.sample(&room, SUPPRESSED_TOTAL, pid, &[]), 3.0);
        // The kernel counts more, but the probe's generation did not move: not read.
        kernel.set(ino, vec![grow(10, 9), grow(1, 1)]);
        assert!(!room.poll(&mut b.poll()));
        assert_eq!(b.sample(&room, SUPPRESSED_TOTAL, pid, &[]), 3.0);
        b.bump(stat::AUTOTUNE_SEEN);
        room.poll(&mut b.poll());
        assert_eq!(b.sample(&room, SUPPRESSED_TOTAL, pid, &[]), 10.0);
        assert_eq!(room.map_fill().unwrap().entries, 1);
    }

    /// Grows of a socket whose owner is being looked up wait for the answer, then count on
    /// the owner at the next poll, although the probe counted nothing since.
    #[test]
    fn grows_held_for_a_look_up_count_once_it_answered() {
        let mut b = Bench::new();
        b.attr = b.attr.with_inline_lookups(false);
        let kernel = FakeTable::new(64);
        let mut room = Autotune::new(kernel.boxed(), 64);
        let (_sock, ino) = udp_socket();
        kernel.set(ino, vec![grow(3, 2)]);
        b.bump(stat::AUTOTUNE_SEEN);
        room.poll(&mut b.poll());
        let pid = my_proc().tgid;
        assert_eq!(b.sample(&room, SUPPRESSED_TOTAL, pid, &[]), 0.0, "held");
        assert_eq!(b.store.attribution_unknown.get("autotune"), None);
        b.attr.settle();
        assert!(
            room.poll(&mut b.poll()),
            "read again without a new generation"
        );
        assert_eq!(b.sample(&room, SUPPRESSED_TOTAL, pid, &[]), 2.0);
        assert!(
            !room.poll(&mut b.poll()),
            "then only when the probe counts again"
        );
        assert_eq!(b.sample(&room, SUPPRESSED_TOTAL, pid, &[]), 2.0);
    }

    /// Without an owner the grows go to `_unknown` and `bufscope_attribution_unknown_total`.
    #[test]
    fn grows_of_an_unknown_socket_are_counted_as_unknown() {
        let mut b = Bench::new();
        let kernel = FakeTable::new(64);
        let mut room = Autotune::new(kernel.boxed(), 64);
        kernel.set(gone_inode(2), vec![grow(2, 2)]);
        room.poll(&mut b.poll());
        assert_eq!(b.store.attribution_unknown.get("autotune"), Some(&2));
    }

    /// GC deletes the idle entries of closed sockets from the kernel map and keeps their
    /// suppressed grows on the live owner as `retired` (what a restart reads back from
    /// `TOTALS`), so the process's total never goes down.
    #[test]
    fn gc_deletes_closed_sockets_and_keeps_their_counts() {
        let mut b = Bench::new();
        let kernel = FakeTable::new(64);
        let mut room = Autotune::new(kernel.boxed(), 64);
        let (closed, open) = (gone_inode(3), gone_inode(4));
        b.owners.set(closed, me());
        b.owners.set(open, me());
        kernel.set(closed, vec![grow(4, 4)]);
        kernel.set(open, vec![grow(1, 1)]);
        room.poll(&mut b.poll());
        let live: HashSet<u64> = [open].into_iter().collect();
        assert_eq!(room.gc_candidates(Duration::ZERO).len(), 2);
        assert_eq!(b.gc(&mut room, &live), 1, "only the closed socket's entry");
        assert!(kernel.value(&closed).is_none() && kernel.value(&open).is_some());
        room.poll(&mut b.poll());
        let me = my_proc();
        let part = b.store.get(&me).unwrap().parts.autotune;
        assert_eq!((part.suppressed, part.retired), (5, 4));
        let mut totals = Vec::new();
        part.totals(&mut totals);
        assert_eq!(totals.len(), 1);
        assert_eq!(
            totals[0].value, 4,
            "only the closed sockets' part goes to TOTALS"
        );
    }

    /// Advice sees each socket's latest RTT, buffer and throughput.
    #[test]
    fn advice_gets_each_sockets_latest_sample() {
        let mut b = Bench::new();
        let kernel = FakeTable::new(64);
        let mut room = Autotune::new(kernel.boxed(), 64);
        let ino = gone_inode(5);
        b.owners.set(ino, me());
        kernel.set(ino, vec![grow(1, 1), grow(7, 0)]);
        room.poll(&mut b.poll());
        let mut inputs = Inputs::default();
        room.advise(&b.advice(), &mut inputs);
        let t = &inputs.tunes[0];
        assert_eq!((t.inode, t.suppressed, t.owner), (ino, 1, Some(my_proc())));
        assert_eq!((t.rtt_us, t.rcvbuf), (190_000, 131_072));
    }
}
