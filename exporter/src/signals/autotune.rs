//! TCP receive autotuning: `tcp_rcvbuf_grow` events per socket, from the `AUTOTUNE` map.
//! An event on a socket with `SOCK_RCVBUF_LOCK` (or with `tcp_moderate_rcvbuf = 0`) is a
//! moment where the kernel wanted a bigger buffer and was not allowed to grow it.

use foldhash::{HashMap, HashMapExt as _, HashSet};
use std::time::{Duration, Instant};

use aya::maps::{MapData, PerCpuHashMap};
use bufscope_common::AutotuneVal;

use crate::attribution::Attributor;
use crate::store::{ProcRef, Store, Who};

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

/// The autotune signal.
pub struct Autotune {
    map: PerCpuHashMap<MapData, u64, AutotuneVal>,
    last: HashMap<u64, SockTune>,
    /// `stat::AUTOTUNE_SEEN` as read just before the last full read of the map.
    generation: Option<u64>,
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

impl Autotune {
    /// Wraps the `AUTOTUNE` map.
    pub fn new(map: PerCpuHashMap<MapData, u64, AutotuneVal>) -> Self {
        Self {
            map,
            last: HashMap::new(),
            generation: None,
        }
    }

    /// [`Autotune::poll`], unless `generation` (the probe's `stat::AUTOTUNE_SEEN`, read just
    /// before this call) shows that no event was counted since the last full read.
    pub fn poll_if_changed(
        &mut self,
        generation: Option<u64>,
        attr: &mut Attributor,
        store: &mut Store,
    ) {
        if generation.is_some() && generation == self.generation {
            return;
        }
        self.poll(attr, store);
        self.generation = generation;
    }

    /// Entries (as of the last poll).
    pub fn entries(&self) -> usize {
        self.last.len()
    }

    /// Per-socket state (for advice).
    pub fn sockets(&self) -> impl Iterator<Item = (&u64, &SockTune)> {
        self.last.iter()
    }

    /// Reads the map and attributes new suppressed events.
    pub fn poll(&mut self, attr: &mut Attributor, store: &mut Store) {
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
                    store.count_unknown("autotune", d);
                }
                let meta = owner.map(|p| attr.meta(&p)).unwrap_or_default();
                store.proc_mut(who, || meta).tcp_autotune_suppressed += d;
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

    /// Socket inodes of entries [`Autotune::gc`] would delete if their socket were gone.
    pub fn idle_inodes(&self, idle: Duration) -> Vec<u64> {
        let now = Instant::now();
        self.last
            .iter()
            .filter(|(_, s)| now.duration_since(s.changed) >= idle)
            .map(|(ino, _)| *ino)
            .collect()
    }

    /// Deletes idle entries of sockets that no longer exist.
    pub fn gc(&mut self, live: &HashSet<u64>, idle: Duration) -> usize {
        let now = Instant::now();
        let doomed: Vec<u64> = self
            .last
            .iter()
            .filter(|(ino, s)| now.duration_since(s.changed) >= idle && !live.contains(ino))
            .map(|(ino, _)| *ino)
            .collect();
        for ino in &doomed {
            let _ = self.map.remove(ino);
            self.last.remove(ino);
        }
        doomed.len()
    }
}
