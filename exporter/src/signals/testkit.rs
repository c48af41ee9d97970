//! What the rooms' unit tests share: a [`Bench`] (the attribution service over this machine's
//! `/proc` with a fake `OWNERS`, a store, a fake `STATS`) that hands out the contexts the
//! collector would, this test process as a probe records it ([`me`]), and sockets it holds
//! ([`udp_socket`]). No root: the kernel's maps are [`FakeTable`]s.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::fd::AsRawFd as _;
use std::time::{Duration, Instant};

use bufscope_common::Owner;
use foldhash::HashSet;
use prometheus::proto::MetricFamily;

use super::{AdviceCx, GcCx, PollCx, Signal, Store};
use crate::attribution::{Attributor, Procfs};
use crate::bpf::Stats;
use crate::bpf::fake::FakeTable;
use crate::kernel::BufferLimits;
use crate::store::ProcRef;

/// What the collector would hand a room, with the kernel's maps faked.
pub struct Bench {
    /// Socket → process (this machine's `/proc`, [`Bench::owners`]).
    pub attr: Attributor,
    /// Per-process counters.
    pub store: Store,
    /// `STATS`, as the probes would bump it.
    pub stats_map: FakeTable<u32, Vec<u64>>,
    /// `OWNERS`, as the owners probe would fill it.
    pub owners: FakeTable<u64, Owner>,
    stats: Stats,
    /// The sysctl limits of this poll.
    pub limits: BufferLimits,
}

impl Default for Bench {
    fn default() -> Self {
        Self::new()
    }
}

impl Bench {
    /// An empty store of 100 processes with a 5 minute retention.
    pub fn new() -> Self {
        let owners = FakeTable::new(1024);
        let stats_map = FakeTable::new(64);
        Self {
            attr: Attributor::new(Procfs::new("/proc"), Some(owners.boxed()))
                .with_inline_lookups(true),
            store: Store::new(100, Duration::from_secs(300)),
            stats: Stats::new(stats_map.boxed()),
            stats_map,
            owners,
            limits: BufferLimits {
                rmem_max: Some(4_194_304),
                wmem_max: Some(4_194_304),
                tcp_rmem_max: Some(6_291_456),
                tcp_wmem_max: None,
            },
        }
    }

    /// The poll context.
    pub fn poll(&mut self) -> PollCx<'_> {
        PollCx {
            attr: &mut self.attr,
            store: &mut self.store,
            limits: self.limits,
            stats: Some(&self.stats),
        }
    }

    /// Adds one to `STATS[slot]` (a probe counted).
    pub fn bump(&self, slot: u32) {
        let n: u64 = self.stats_map.value(&slot).map_or(0, |v| v.iter().sum());
        self.stats_map.set(slot, vec![n + 1]);
    }

    /// Runs `room`'s GC with `live` as the socket inodes `/proc` shows and nothing idle
    /// protected.
    pub fn gc(&mut self, room: &mut dyn Signal, live: &HashSet<u64>) -> usize {
        let mut cx = GcCx {
            live,
            idle: Duration::ZERO,
            retention: self.store.retention(),
            attr: &mut self.attr,
            store: &self.store,
        };
        room.gc(&mut cx)
    }

    /// The advice context (rates over the last minute).
    pub fn advice(&self) -> AdviceCx<'_> {
        AdviceCx {
            store: &self.store,
            now: Instant::now(),
            window: Duration::from_secs(60),
        }
    }

    /// `room`'s families, as the exposition renders them (every identity, decided or not).
    pub fn families(&self, room: &dyn Signal) -> Vec<MetricFamily> {
        let rows = self.store.rows_including_pending();
        let mut out = Vec::new();
        room.families(&rows, &mut out);
        out
    }

    /// Counts of the identity of process `pid` in `room`'s family `name` (summed over label
    /// sets, then matched on `labels`: every (name, value) given must be on the sample).
    pub fn sample(&self, room: &dyn Signal, name: &str, pid: u32, labels: &[(&str, &str)]) -> f64 {
        let Some(series) = self
            .store
            .procs()
            .find(|(p, _)| p.tgid == pid)
            .map(|(_, s)| s.series)
        else {
            return 0.0;
        };
        let rows: Vec<_> = self
            .store
            .rows_including_pending()
            .into_iter()
            .filter(|r| r.id == series)
            .collect();
        let mut out = Vec::new();
        room.families(&rows, &mut out);
        out.iter()
            .filter(|f| f.name() == name)
            .flat_map(|f| f.get_metric())
            .filter(|m| {
                let has = |k: &str, v: &str| {
                    m.get_label()
                        .iter()
                        .any(|l| l.name() == k && l.value() == v)
                };
                labels.iter().all(|(k, v)| has(k, v))
            })
            .map(|m| m.get_counter().get_value() + m.get_gauge().get_value())
            .sum()
    }
}

/// This test process as a probe records it (pid, start time, comm).
pub fn me() -> Owner {
    let pid = std::process::id();
    let ticks = Procfs::new("/proc")
        .start_ticks(pid)
        .expect("own start time");
    let mut comm = [0u8; 16];
    let c = Procfs::new("/proc").comm(pid).unwrap_or_default();
    let n = c.len().min(16);
    comm[..n].copy_from_slice(&c[..n]);
    Owner {
        tgid: pid,
        pid,
        cgroup_id: 0,
        start_ns: ticks * (1_000_000_000 / crate::attribution::procfs::clk_tck()),
        comm,
    }
}

/// This test process's identity.
pub fn my_proc() -> ProcRef {
    let o = me();
    ProcRef {
        tgid: o.tgid,
        start_ticks: Procfs::ns_to_ticks(o.start_ns),
    }
}

/// A UDP socket this process holds, and its inode.
pub fn udp_socket() -> (std::net::UdpSocket, u64) {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("a UDP socket");
    let link = std::fs::read_link(format!("/proc/self/fd/{}", s.as_raw_fd())).unwrap();
    let ino = link
        .to_str()
        .and_then(|l| l.strip_prefix("socket:["))
        .and_then(|l| l.strip_suffix(']'))
        .and_then(|l| l.parse().ok())
        .expect("socket:[inode]");
    (s, ino)
}

/// An inode no process holds (a socket closed long ago).
pub fn gone_inode(n: u64) -> u64 {
    u64::MAX - n
}

/// The bytes of a `#[repr(C)]` event of `bufscope-common`, as the ring buffer carries it.
pub fn record<T: aya::Pod>(value: &T) -> Vec<u8> {
    // SAFETY: T is Pod (`#[repr(C)]`, integers only): its bytes are its value.
    unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

/// An `AUTOTUNE` value of a socket with `SOCK_RCVBUF_LOCK` whose autotuning the kernel wanted
/// to grow 50 times at 190 ms RTT (the `tcp_autotune_suppressed` finding).
pub fn suppressed_at_190ms() -> bufscope_common::AutotuneVal {
    bufscope_common::AutotuneVal {
        grow_events: 50,
        suppressed: 50,
        last_ns: 1,
        rtt_us: 190_000,
        rcvbuf: 131_072,
        copied: 131_072,
        interval_us: 190_000,
        userlocks: bufscope_common::SOCK_RCVBUF_LOCK as u32,
        ..bufscope_common::AutotuneVal::default()
    }
}
