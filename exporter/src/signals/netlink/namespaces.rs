//! Every network namespace a process lives in, each with one of its processes: the counters
//! the kernel keeps per namespace (`/proc/<pid>/net/netlink`, `/proc/<pid>/net/xfrm_stat`)
//! are read through that process's `/proc/<pid>/net/`, which shows its namespace's — no
//! `setns`, no privilege beyond reading `/proc`.
//!
//! Cost per poll: one `readdir` of `/proc` (shared by the rooms that read these counters) and a `readlink` of `ns/net` for each process not
//! seen before; every process is looked at again every [`RECHECK`] (one that moved with
//! `setns`/`unshare`). A namespace no process lives in (one kept only by a bind mount under
//! `/run/netns`, or by a socket whose process moved on) is not seen.

use std::collections::BTreeMap;
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
    /// When every process was last read.
    full: Option<Instant>,
}

impl Namespaces {
    /// An empty index.
    pub fn new() -> Self {
        Self {
            of: HashMap::new(),
            full: None,
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
        let full = self.full.is_none_or(|t| now.duration_since(t) >= RECHECK);
        if full {
            self.of.clear();
            self.full = Some(now);
        } else {
            let live: foldhash::HashSet<u32> = pids.iter().copied().collect();
            self.of.retain(|pid, _| live.contains(pid));
        }
        for &pid in pids {
            if self.of.contains_key(&pid) {
                continue;
            }
            if let Some(ns) = procfs.netns(pid) {
                self.of.insert(pid, ns);
            }
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
        // Within RECHECK only new processes are read: the answer stays the same.
        let again = n.refresh(&procfs, now + Duration::from_secs(1));
        assert!(again.contains_key(&mine));
    }
}
