//! Buffer-full drops, from the per-CPU `DROPS` map (one entry per socket × drop reason).
//!
//! Each poll reads the cumulative counts, turns them into deltas, attributes each socket to its
//! owner and adds the delta to `bufscope_socket_drops_total{proto,reason}`. Deltas whose owner
//! cannot be found yet are held for `hold` (a `/proc` scan may still find them) and then go to
//! `comm="_unknown"`: counts are never dropped silently.

use std::collections::VecDeque;

use foldhash::{HashMap, HashMapExt as _, HashSet};
use std::time::{Duration, Instant};

use aya::maps::{MapData, PerCpuHashMap};
use bufscope_common::{DropKey, DropVal, drop_site};

use super::batch::BatchReader;
use crate::attribution::Attributor;
use crate::kernel::DropReasons;
use crate::store::{ProcRef, Proto, Store, Who};

/// What the last poll saw for one key.
#[derive(Clone, Debug)]
pub struct Seen {
    /// Cumulative packets.
    pub packets: u64,
    /// Cumulative skbs.
    pub skbs: u64,
    /// When the count last moved.
    pub changed: Instant,
    /// `sk_rcvbuf` at the latest drop.
    pub rcvbuf: i32,
    /// `sk_rmem_alloc` at the latest drop.
    pub rmem_alloc: i32,
    /// Who it was attributed to.
    pub owner: Option<ProcRef>,
    /// Device name (device drops).
    pub ifname: String,
    /// (time, cumulative packets) samples of the last [`HISTORY`], for rates.
    pub history: VecDeque<(Instant, u64)>,
}

/// How much per-key history is kept for rates.
pub const HISTORY: Duration = Duration::from_secs(300);

/// Spacing of the kept samples (rates are exact over [sample, now], with the window start
/// rounded down to a sample at most this much earlier).
pub const HISTORY_STEP: Duration = Duration::from_secs(10);

impl Seen {
    /// Packets per second over the last `window` (0 when nothing moved in it).
    pub fn rate(&self, window: Duration, now: Instant) -> f64 {
        let Some(&(t_last, last)) = self.history.back() else {
            return 0.0;
        };
        if now.duration_since(t_last) > window {
            return 0.0;
        }
        let since = now.checked_sub(window).unwrap_or(t_last);
        // The newest sample at or before the window start (or the oldest we have); samples
        // are in time order.
        let after = self.history.partition_point(|(t, _)| *t <= since);
        let base = self.history.get(after.saturating_sub(1)).copied();
        match base {
            Some((t0, v0)) if last > v0 => {
                let dt = now.duration_since(t0).as_secs_f64().max(1e-3);
                (last - v0) as f64 / dt
            }
            _ => 0.0,
        }
    }
}

/// A delta waiting for its owner.
struct Held {
    packets: u64,
    since: Instant,
}

/// The drops signal.
pub struct Drops {
    map: PerCpuHashMap<MapData, DropKey, DropVal>,
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
    /// Wraps the `DROPS` map.
    pub fn new(
        map: PerCpuHashMap<MapData, DropKey, DropVal>,
        reasons: DropReasons,
        hold: Duration,
    ) -> Self {
        Self {
            map,
            reasons,
            last: HashMap::new(),
            held: HashMap::new(),
            hold,
            last_poll: None,
            generation: None,
            names: HashMap::new(),
            batch: BatchReader::find(
                "DROPS",
                std::mem::size_of::<DropKey>(),
                std::mem::size_of::<DropVal>(),
            ),
        }
    }

    /// [`Drops::poll`], unless `generation` (the probe's `stat::DROPS_SEEN`, read just before
    /// this call) shows that nothing was counted since the last full read and no delta waits
    /// for its owner. Reading the map costs two syscalls per entry, so an idle host with
    /// thousands of sockets that once dropped would otherwise pay for them every poll.
    pub fn poll_if_changed(
        &mut self,
        generation: Option<u64>,
        attr: &mut Attributor,
        store: &mut Store,
    ) {
        if generation.is_some() && generation == self.generation && self.held.is_empty() {
            self.last_poll = Some(Instant::now());
            return;
        }
        self.poll(attr, store);
        self.generation = generation;
    }

    /// Whether counts wait for their owner (the next poll may attribute them).
    pub fn pending(&self) -> bool {
        !self.held.is_empty()
    }

    /// Entries currently in the BPF map (as of the last poll).
    pub fn entries(&self) -> usize {
        self.last.len()
    }

    /// The kernel's drop-reason names.
    pub fn reasons(&self) -> &DropReasons {
        &self.reasons
    }

    /// Per-key state (for advice and the status page).
    pub fn seen(&self) -> impl Iterator<Item = (&DropKey, &Seen)> {
        self.last.iter()
    }

    /// Reads the map and attributes new drops.
    pub fn poll(&mut self, attr: &mut Attributor, store: &mut Store) {
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
                    // First sight: the new packets were dropped since the previous poll.
                    let base = self.last_poll.unwrap_or(now - Duration::from_secs(1));
                    let history = VecDeque::from([(base, v.packets.saturating_sub(dp))]);
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
            let history = &mut seen.history;
            if moved || history.len() < 2 {
                // One sample per HISTORY_STEP at most (the newest one keeps moving): a socket
                // that drops on every poll would otherwise keep HISTORY / poll interval = 300
                // samples, 4.8 KiB per socket (48 MiB with 10,000 sockets).
                let n = history.len();
                let recent = n >= 2 && now.duration_since(history[n - 2].0) < HISTORY_STEP;
                match history.back_mut() {
                    Some(last) if recent => *last = (now, v.packets),
                    _ => history.push_back((now, v.packets)),
                }
            }
            while history.len() > 2
                && history
                    .front()
                    .is_some_and(|(t, _)| now.duration_since(*t) > HISTORY)
            {
                history.pop_front();
            }
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
    }

    /// Every key with its per-CPU values summed: in batches when possible, else key by key.
    fn read_map(&mut self) -> Vec<(DropKey, DropVal)> {
        if let Some(b) = &self.batch {
            match b.read::<DropKey, DropVal>() {
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

    fn resolve(&self, k: &DropKey, attr: &mut Attributor) -> Option<ProcRef> {
        match k.site {
            drop_site::SOCKET => attr.lookup_inode(k.inode),
            drop_site::SOCKET_NO_INODE => attr.listener(k.netns, k.id as u16),
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
            return;
        }
        let unknown: HashSet<u64> = self
            .held
            .keys()
            .filter(|k| k.site == drop_site::SOCKET && attr.lookup_inode(k.inode).is_none())
            .map(|k| k.inode)
            .collect();
        attr.resolve_inodes(&unknown);
        let keys: Vec<DropKey> = self.held.keys().copied().collect();
        for k in keys {
            let who = self.resolve(&k, attr);
            let expired = self
                .held
                .get(&k)
                .is_some_and(|h| now.duration_since(h.since) >= self.hold);
            if who.is_none() && !expired {
                continue;
            }
            let Some(h) = self.held.remove(&k) else {
                continue;
            };
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
            // Labels are cloned only for a process the store does not know yet, and the
            // (proto, reason) entry is found without allocating its name: with thousands of
            // dropping sockets this loop runs for each of them on every poll.
            let s = store.proc_mut(who, || match who {
                Who::Proc(p) => attr.meta(&p),
                Who::Unknown => Default::default(),
            });
            let proto = Proto::from_ip(k.proto);
            let reasons = &self.reasons;
            let name = self
                .names
                .entry(k.reason)
                .or_insert_with(|| reasons.name(k.reason));
            match s
                .drops
                .iter_mut()
                .find(|((p, r), _)| *p == proto && r == name)
            {
                Some((_, n)) => *n += h.packets,
                None => {
                    s.drops.insert((proto, name.clone()), h.packets);
                }
            }
        }
    }

    /// Socket inodes of entries [`Drops::gc`] would delete if their socket were gone.
    pub fn idle_inodes(&self, idle: Duration) -> Vec<u64> {
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
    pub fn gc(&mut self, live: &HashSet<u64>, idle: Duration, attr: &mut Attributor) -> usize {
        let now = Instant::now();
        let doomed: Vec<DropKey> = self
            .last
            .iter()
            .filter(|(k, s)| {
                now.duration_since(s.changed) >= idle
                    && !self.held.contains_key(k)
                    && (k.site != drop_site::SOCKET || !live.contains(&k.inode))
            })
            .map(|(k, _)| *k)
            .collect();
        for k in &doomed {
            // The socket is gone (or the key idle): nothing can increment it between our last
            // read and this delete, and a re-created key starts from zero.
            let _ = self.map.remove(k);
            self.last.remove(k);
            if k.site == drop_site::SOCKET {
                attr.forget_inode(k.inode);
            }
        }
        doomed.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(samples: &[(u64, u64)], now: Instant) -> Seen {
        Seen {
            packets: samples.last().map_or(0, |s| s.1),
            skbs: 0,
            changed: now,
            rcvbuf: 0,
            rmem_alloc: 0,
            owner: None,
            ifname: String::new(),
            history: samples
                .iter()
                .map(|(ago_ms, v)| (now - Duration::from_millis(*ago_ms), *v))
                .collect(),
        }
    }

    #[test]
    fn rate_over_window() {
        let now = Instant::now() + Duration::from_secs(600);
        // 1000 packets in the last 10 s, steady before.
        let s = seen(&[(70_000, 0), (10_000, 5000), (0, 6000)], now);
        assert!((s.rate(Duration::from_secs(60), now) - 6000.0 / 70.0).abs() < 1.0);
        assert!((s.rate(Duration::from_secs(10), now) - 100.0).abs() < 1.0);
        // Nothing moved within the window.
        let idle = seen(&[(200_000, 0), (120_000, 10)], now);
        assert_eq!(idle.rate(Duration::from_secs(60), now), 0.0);
    }
}
