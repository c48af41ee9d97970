//! Every network namespace a process lives in, each with one of its processes: the counters
//! the kernel keeps per namespace (`/proc/<pid>/net/netlink`, `/proc/<pid>/net/xfrm_stat`)
//! are read through that process's `/proc/<pid>/net/`, which shows its namespace's — no
//! `setns`, no privilege beyond reading `/proc`.
//!
//! Cost per poll: one `readdir` of `/proc` (shared by the rooms that read these counters) and
//! a `readlink` of `ns/net` for each process not seen before; every process is looked at
//! again every [`RECHECK`] (one that moved with `setns`/`unshare`), spread over the polls in
//! proportion to the time since the last one (with 3,000 processes, reading them all at
//! once made every tenth second's scrape wait 50 ms). A namespace no process lives in (one
//! kept only by a bind mount under `/run/netns`, or by a socket whose process moved on) is
//! not seen.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use foldhash::{HashMap, HashMapExt as _};

use crate::attribution::Procfs;

/// How often every process's namespace is read again.
pub const RECHECK: Duration = Duration::from_secs(10);

/// Which namespace each process is in, kept between polls.
#[derive(Debug, Default)]
pub struct Namespaces {
    /// pid → netns inode.
    of: HashMap<u32, u32>,
    /// The pids of `of`, least recently read first (a pid that left is skipped when it
    /// comes up).
    order: VecDeque<u32>,
    /// When the last refresh ran.
    last: Option<Instant>,
}

impl Namespaces {
    /// An empty index.
    pub fn new() -> Self {
        Self {
            of: HashMap::new(),
            order: VecDeque::new(),
            last: None,
        }
    }

    /// Brings the index up to date and returns each namespace with one of its processes (the
    /// lowest pid).
    pub fn refresh(&mut self, procfs: &Procfs, now: Instant) -> BTreeMap<u32, u32> {
        self.refresh_from(procfs, &procfs.pids(), now)
    }

    /// [`Namespaces::refresh`] with `/proc` listed already (`pids`: once per poll, for every
    /// room that reads per-namespace counters).
    pub fn refresh_from(
        &mut self,
        procfs: &Procfs,
        pids: &[u32],
        now: Instant,
    ) -> BTreeMap<u32, u32> {
        let live: foldhash::HashSet<u32> = pids.iter().copied().collect();
        self.of.retain(|pid, _| live.contains(pid));
        // The share of the known processes due again since the last refresh (all of them
        // once RECHECK passed), least recently read first.
        let elapsed = self
            .last
            .map_or(RECHECK, |t| now.saturating_duration_since(t));
        self.last = Some(now);
        let due = if elapsed >= RECHECK {
            self.of.len()
        } else {
            (self.of.len() as u128 * elapsed.as_nanos()).div_ceil(RECHECK.as_nanos()) as usize
        };
        let mut rechecked = 0;
        while rechecked < due {
            let Some(pid) = self.order.pop_front() else {
                break;
            };
            if !self.of.contains_key(&pid) {
                continue;
            }
            rechecked += 1;
            match procfs.netns(pid) {
                Some(ns) => {
                    self.of.insert(pid, ns);
                    self.order.push_back(pid);
                }
                None => {
                    self.of.remove(&pid);
                }
            }
        }
        for &pid in pids {
            if self.of.contains_key(&pid) {
                continue;
            }
            if let Some(ns) = procfs.netns(pid) {
                self.of.insert(pid, ns);
                self.order.push_back(pid);
            }
        }
        // Pids that left stay in the order until they come up: bounded here.
        if self.order.len() > 2 * self.of.len() + 64 {
            let of = &self.of;
            self.order.retain(|pid| of.contains_key(pid));
        }
        representatives(self.of.iter().map(|(p, n)| (*p, *n)))
    }

    /// Forgets `pid` (its `/proc/<pid>/net` could not be read: it exited).
    pub fn forget(&mut self, pid: u32) {
        self.of.remove(&pid);
    }
}

/// Each namespace of `(pid, netns)` pairs with its lowest pid.
pub fn representatives(pairs: impl Iterator<Item = (u32, u32)>) -> BTreeMap<u32, u32> {
    let mut out: BTreeMap<u32, u32> = BTreeMap::new();
    for (pid, ns) in pairs {
        out.entry(ns)
            .and_modify(|p| *p = (*p).min(pid))
            .or_insert(pid);
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn one_process_per_namespace_the_lowest() {
        let r = representatives([(30, 7), (4, 7), (12, 9), (1, 3)].into_iter());
        assert_eq!(r, BTreeMap::from([(3, 1), (7, 4), (9, 12)]));
    }

    #[test]
    fn finds_this_process_namespace() {
        let procfs = Procfs::default();
        let mine = procfs.netns(std::process::id()).unwrap();
        let mut n = Namespaces::new();
        let now = Instant::now();
        let found = n.refresh(&procfs, now);
        assert!(found.contains_key(&mine), "{found:?}");
        // Within RECHECK only new processes and a share of the known ones are read: the
        // answer stays the same.
        let again = n.refresh(&procfs, now + Duration::from_secs(1));
        assert!(again.contains_key(&mine));
    }

    /// Every known process is read again once per RECHECK, spread over the refreshes, and
    /// a process that moved is seen in its new namespace within it.
    #[test]
    fn rechecks_are_spread_over_recheck() {
        let root = std::env::temp_dir().join(format!("bufscope-netns-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let procfs = Procfs::new(&root);
        let link = |pid: u32, ns: u32| {
            let d = root.join(pid.to_string()).join("ns");
            std::fs::create_dir_all(&d).unwrap();
            let l = d.join("net");
            let _ = std::fs::remove_file(&l);
            std::os::unix::fs::symlink(format!("net:[{ns}]"), l).unwrap();
        };
        let pids: Vec<u32> = (1..=100).collect();
        for &p in &pids {
            link(p, 7);
        }
        let mut n = Namespaces::new();
        let t0 = Instant::now();
        assert_eq!(n.refresh_from(&procfs, &pids, t0), BTreeMap::from([(7, 1)]));
        // Every pid moves; a tenth of RECHECK later, about a tenth of them were read again.
        for &p in &pids {
            link(p, 9);
        }
        let r = n.refresh_from(&procfs, &pids, t0 + RECHECK / 10);
        assert_eq!(r.len(), 2, "some moved, most not read yet: {r:?}");
        assert_eq!(n.of.values().filter(|ns| **ns == 9).count(), 10);
        // Within one RECHECK of refreshes, all were read again.
        for i in 2..=10 {
            n.refresh_from(&procfs, &pids, t0 + RECHECK * i / 10);
        }
        assert_eq!(
            n.refresh_from(&procfs, &pids, t0 + RECHECK + Duration::from_millis(1)),
            BTreeMap::from([(9, 1)])
        );
        // A pid that left is dropped; the order stays bounded.
        let fewer: Vec<u32> = (1..=10).collect();
        n.refresh_from(&procfs, &fewer, t0 + RECHECK * 3);
        assert_eq!(n.of.len(), 10);
        assert!(n.order.len() <= 2 * 10 + 64);
        let _ = std::fs::remove_dir_all(&root);
    }
}
