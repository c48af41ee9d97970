//! Sockets several live processes hold: a prefork master keeps the socket its
//! workers read, a supervisor keeps the socket its service reads. Their drops go to the
//! process that reads the socket, not to the newest holder.
//!
//! A socket is *watched* while it has drops and more than one live holder: it is in the
//! reader hook's `WATCHED` map, and the hook ([`ReaderHook`], `tp_btf/sock_recv_length`) is
//! attached while any socket is watched. The hook counts each process's receives from
//! watched sockets (`READERS`). Per poll, a watched socket's new drops go
//! ([`Shared::route`]):
//! 1. to the processes that received from it since the previous poll, split in proportion
//!    to their receives (largest remainder: the parts sum exactly to the kernel's delta);
//! 2. else, while the drops are younger than [`READER_WAIT`] (the hook was attached only
//!    when they were first seen), nowhere yet: they wait for the next poll's readers;
//! 3. else to the last process seen reading it, while it lives;
//! 4. else to the newest live holder (the rule without the hook).
//!
//! A socket stops being watched [`QUIET`] after its last drop, or when one process holds it
//! again; the hook is detached when none is left. The master that never reads gets nothing.

use std::time::{Duration, Instant};

use bufscope_common::{ReaderKey, ReaderVal};
use foldhash::{HashMap, HashMapExt as _, HashSet};

use super::reader::ReaderHook;
use crate::attribution::Attributor;
use crate::store::ProcRef;

/// How long new drops of a shared socket wait for the readers of the next polls before they
/// go to the last known reader or the newest holder.
pub const READER_WAIT: Duration = Duration::from_secs(2);
/// A watched socket without new drops for this long is no longer watched.
pub const QUIET: Duration = Duration::from_secs(3);

/// Where a shared socket's delta goes.
pub enum Route {
    /// To these processes, in these parts (summing to the delta).
    Split(Vec<(ProcRef, u64)>),
    /// Nowhere yet: wait for the readers of the next poll.
    Wait,
    /// The usual rule (the newest live holder).
    Holder,
}

/// The watched sockets and their readers.
pub struct Shared {
    hook: ReaderHook,
    /// Watched socket inode → when it last had new drops.
    watched: HashMap<u64, Instant>,
    /// `READERS` as last read (summed over CPUs): receives per key.
    seen: HashMap<ReaderKey, u64>,
    /// Receives since the previous poll, per socket: (tgid, receives).
    fresh: HashMap<u64, Vec<(u32, u64)>>,
    /// The process seen reading each socket most recently.
    last_reader: HashMap<u64, ProcRef>,
    /// The hook could not be attached (logged once).
    arm_failed: bool,
}

impl Shared {
    /// Wraps the loaded reader hook.
    pub fn new(hook: ReaderHook) -> Self {
        Self {
            hook,
            watched: HashMap::new(),
            seen: HashMap::new(),
            fresh: HashMap::new(),
            last_reader: HashMap::new(),
            arm_failed: false,
        }
    }

    /// The reader hook.
    pub fn hook(&self) -> &ReaderHook {
        &self.hook
    }

    /// Reads `READERS` into the receives since the previous call (nothing while the hook was
    /// never attached: then the map is empty).
    pub fn read_readers(&mut self) {
        self.fresh.clear();
        if self.watched.is_empty() && self.seen.is_empty() {
            return;
        }
        let mut now_seen = HashMap::with_capacity(self.seen.len());
        for (k, per_cpu) in self.hook.readers.entries() {
            let receives: u64 = per_cpu.iter().map(|v: &ReaderVal| v.receives).sum();
            // A key evicted and created again counts from zero.
            let before = self.seen.get(&k).copied().filter(|b| *b <= receives);
            let delta = receives - before.unwrap_or(0);
            if delta > 0 {
                self.fresh.entry(k.inode).or_default().push((k.tgid, delta));
            }
            now_seen.insert(k, receives);
        }
        self.seen = now_seen;
    }

    /// Where the `packets` new drops of `inode` (held since `since`), a socket `holders` live
    /// processes hold, go: see the module documentation.
    pub fn route(
        &mut self,
        inode: u64,
        packets: u64,
        since: Instant,
        now: Instant,
        attr: &mut Attributor,
    ) -> Route {
        let readers: Vec<(ProcRef, u64)> = self
            .fresh
            .get(&inode)
            .into_iter()
            .flatten()
            .filter_map(|(tgid, n)| Some((attr.proc_from_pid(*tgid)?, *n)))
            .collect();
        if let Some((top, _)) = readers.iter().max_by_key(|(p, n)| (*n, p.tgid)) {
            self.last_reader.insert(inode, *top);
            return Route::Split(split(packets, &readers));
        }
        if now.duration_since(since) < READER_WAIT && !self.arm_failed {
            return Route::Wait;
        }
        match self.last_reader.get(&inode) {
            Some(p) if attr.alive(p) => Route::Split(vec![(*p, packets)]),
            _ => Route::Holder,
        }
    }

    /// Watches the sockets of `dropping` (new drops this poll) that more than one live
    /// process holds, stops watching those quiet for [`QUIET`] or held by one process, and
    /// attaches or detaches the hook accordingly.
    pub fn update(&mut self, dropping: &HashSet<u64>, attr: &Attributor, now: Instant) {
        for ino in dropping {
            if attr.holder_count(*ino) > 1 {
                if !self.watched.contains_key(ino)
                    && let Err(e) = self.hook.watched.insert(*ino, 1)
                {
                    tracing::debug!(inode = ino, "WATCHED insert failed: {e:#}");
                    continue;
                }
                self.watched.insert(*ino, now);
            }
        }
        let done: Vec<u64> = self
            .watched
            .iter()
            .filter(|(ino, last)| {
                now.duration_since(**last) >= QUIET || attr.holder_count(**ino) <= 1
            })
            .map(|(ino, _)| *ino)
            .collect();
        for ino in done {
            self.unwatch(ino);
        }
        if self.watched.is_empty() {
            self.hook.disarm();
        } else if !self.hook.armed() {
            match self.hook.arm() {
                Ok(()) => {
                    self.arm_failed = false;
                    tracing::debug!(sockets = self.watched.len(), "reader hook attached");
                }
                Err(e) if !self.arm_failed => {
                    self.arm_failed = true;
                    tracing::warn!(
                        "attaching the reader hook failed ({e}): shared sockets' drops go to their newest holder"
                    );
                }
                Err(_) => {}
            }
        }
        self.hook.set_watched(self.watched.len());
    }

    /// Stops watching `inode` and deletes its readers from the map.
    fn unwatch(&mut self, inode: u64) {
        self.watched.remove(&inode);
        self.hook.watched.remove(&inode);
        let keys: Vec<ReaderKey> = self
            .seen
            .keys()
            .filter(|k| k.inode == inode)
            .copied()
            .collect();
        for k in keys {
            self.hook.readers.remove(&k);
            self.seen.remove(&k);
        }
    }

    /// Forgets a socket that is gone.
    pub fn forget(&mut self, inode: u64) {
        self.unwatch(inode);
        self.last_reader.remove(&inode);
    }

    /// The readers this state still refers to.
    pub fn referenced(&self, out: &mut HashSet<ProcRef>) {
        out.extend(self.last_reader.values().copied());
    }
}

/// Splits `total` in proportion to `weights` (largest remainder, ties to the earlier entry):
/// the parts sum to `total` exactly. Entries with a zero part are left out.
pub fn split<T: Copy>(total: u64, weights: &[(T, u64)]) -> Vec<(T, u64)> {
    let sum: u128 = weights.iter().map(|(_, w)| *w as u128).sum();
    if sum == 0 {
        return Vec::new();
    }
    let mut parts: Vec<(T, u64, u128)> = weights
        .iter()
        .map(|(t, w)| {
            let x = total as u128 * *w as u128;
            (*t, (x / sum) as u64, x % sum)
        })
        .collect();
    let given: u64 = parts.iter().map(|(_, p, _)| *p).sum();
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by(|a, b| parts[*b].2.cmp(&parts[*a].2).then(a.cmp(b)));
    for i in order.into_iter().take((total - given) as usize) {
        parts[i].1 += 1;
    }
    parts
        .into_iter()
        .filter(|(_, p, _)| *p > 0)
        .map(|(t, p, _)| (t, p))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::split;

    fn sum(v: &[(u32, u64)]) -> u64 {
        v.iter().map(|(_, n)| n).sum()
    }

    #[test]
    fn parts_sum_to_the_total() {
        for total in [0u64, 1, 2, 7, 1000, 4999, u32::MAX as u64 * 3] {
            for w in [
                vec![(1u32, 1u64)],
                vec![(1, 1), (2, 1)],
                vec![(1, 1), (2, 1), (3, 1)],
                vec![(1, 3), (2, 7), (3, 11)],
                vec![(1, 1), (2, 1_000_000)],
            ] {
                assert_eq!(sum(&split(total, &w)), total, "{total} over {w:?}");
            }
        }
    }

    #[test]
    fn parts_follow_the_weights() {
        assert_eq!(split(10, &[(1u32, 3u64), (2, 1)]), vec![(1, 8), (2, 2)]);
        assert_eq!(
            split(3, &[(1u32, 1u64), (2, 1), (3, 1)]),
            vec![(1, 1), (2, 1), (3, 1)]
        );
        // 1 over two equal readers: the earlier one gets it, the other nothing.
        assert_eq!(split(1, &[(1u32, 5u64), (2, 5)]), vec![(1, 1)]);
        assert!(split(5, &[(1u32, 0u64)]).is_empty());
    }
}
