//! Every network namespace a process lives in, each with one of its processes: the counters
//! the kernel keeps per namespace (`/proc/<pid>/net/netlink`, `/proc/<pid>/net/xfrm_stat`)
//! are read through that process's `/proc/<pid>/net/`, which shows its namespace's — no
//! `setns`, no privilege beyond reading `/proc`.
//!
//! Cost per poll: one `readdir` of `/proc` (shared by the rooms that read these counters) and
//! a `readlink` of `ns/net` for each process not seen before; every process is looked at
//! again every [`RECHECK`] (one that moved with `setns`/`unshare`), spread over the polls in
//! proportion to the time since the last one (with 3,000 processes, reading them all at
//! once made every tenth second's scrape wait 50 ms). Two cases cannot wait that long:
//! a process seen for the first time may still be switching namespaces (`ip -n`, `ip netns
//! exec`, `nsenter` call `setns` right after `exec`), so it is read again at every refresh
//! during its first [`YOUNG`]; and the process each namespace is read through is checked at
//! every refresh (one `readlink` per namespace), so a counter is never read through a
//! process that left the namespace. A namespace no process lives in (one kept only by a
//! bind mount under `/run/netns`, or by a socket whose process moved on) is not seen.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use foldhash::{HashMap, HashMapExt as _};

use crate::attribution::Procfs;

/// How often every process's namespace is read again.
pub const RECHECK: Duration = Duration::from_secs(10);

/// How long a process first seen is read again at every refresh (it may still be on its
/// way into its namespace).
pub const YOUNG: Duration = Duration::from_secs(2);

/// Which namespace each process is in, kept between polls.
#[derive(Debug, Default)]
pub struct Namespaces {
    /// pid → netns inode.
    of: HashMap<u32, u32>,
    /// The pids of `of`, least recently read first (a pid that left is skipped when it
    /// comes up).
    order: VecDeque<u32>,
    /// Pids first seen at the given time, read again at every refresh for [`YOUNG`].
    young: VecDeque<(u32, Instant)>,
    /// When the last refresh ran.
    last: Option<Instant>,
}

impl Namespaces {
    /// An empty index.
    pub fn new() -> Self {
        Self {
            of: HashMap::new(),
            order: VecDeque::new(),
            young: VecDeque::new(),
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
            if self.read(procfs, pid).is_some() {
                self.order.push_back(pid);
            }
        }
        // The young ones again (they may have moved since they were first read).
        while self
            .young
            .front()
            .is_some_and(|(_, seen)| now.saturating_duration_since(*seen) >= YOUNG)
        {
            self.young.pop_front();
        }
        for i in 0..self.young.len() {
            let pid = self.young[i].0;
            if self.of.contains_key(&pid) {
                self.read(procfs, pid);
            }
        }
        for &pid in pids {
            if self.of.contains_key(&pid) {
                continue;
            }
            if let Some(ns) = procfs.netns(pid) {
                self.of.insert(pid, ns);
                self.order.push_back(pid);
                self.young.push_back((pid, now));
            }
        }
        // Pids that left stay in the order until they come up: bounded here.
        if self.order.len() > 2 * self.of.len() + 64 {
            let of = &self.of;
            self.order.retain(|pid| of.contains_key(pid));
        }
        self.checked_representatives(procfs)
    }

    /// Each namespace with its lowest pid, every one of them read again first: one that
    /// moved (or whose pid now names another process) is filed where it is and the next
    /// lowest stands in (a few rounds at most: processes that keep moving are left to the
    /// next refresh).
    fn checked_representatives(&mut self, procfs: &Procfs) -> BTreeMap<u32, u32> {
        let mut reps = representatives(self.of.iter().map(|(p, n)| (*p, *n)));
        for _ in 0..4 {
            let mut moved = false;
            for (&ns, &pid) in &reps {
                moved |= self.read(procfs, pid) != Some(ns);
            }
            if !moved {
                break;
            }
            reps = representatives(self.of.iter().map(|(p, n)| (*p, *n)));
        }
        reps
    }

    /// Reads `pid`'s namespace into the index (forgotten when it is gone); its namespace.
    fn read(&mut self, procfs: &Procfs, pid: u32) -> Option<u32> {
        let ns = procfs.netns(pid);
        match ns {
            Some(ns) => {
                self.of.insert(pid, ns);
            }
            None => {
                self.of.remove(&pid);
            }
        }
        ns
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

    /// A fake `/proc` under a temporary directory: `link(pid, ns)` files `pid` in `ns`.
    fn fake_proc(tag: &str) -> (std::path::PathBuf, Procfs) {
        let root =
            std::env::temp_dir().join(format!("bufscope-netns-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let procfs = Procfs::new(&root);
        (root, procfs)
    }

    fn link(root: &std::path::Path, pid: u32, ns: u32) {
        let d = root.join(pid.to_string()).join("ns");
        std::fs::create_dir_all(&d).unwrap();
        let l = d.join("net");
        let _ = std::fs::remove_file(&l);
        std::os::unix::fs::symlink(format!("net:[{ns}]"), l).unwrap();
    }

    /// `ip -n A xfrm monitor` is first seen before its setns (in the host's namespace) and
    /// enters A right after: it is read again at the next refresh, not a RECHECK later, and
    /// A is read through it from then on.
    #[test]
    fn a_process_that_enters_its_namespace_after_exec_is_seen_there_at_once() {
        let (root, procfs) = fake_proc("young");
        link(&root, 1, 3);
        link(&root, 50, 3);
        let pids = [1, 50];
        let mut n = Namespaces::new();
        let t0 = Instant::now();
        n.refresh_from(&procfs, &pids, t0);
        // Older than YOUNG: only RECHECK's share would read it again.
        let t1 = t0 + YOUNG;
        n.refresh_from(&procfs, &pids, t1);
        link(&root, 60, 3);
        let pids = [1, 50, 60];
        assert_eq!(n.refresh_from(&procfs, &pids, t1), BTreeMap::from([(3, 1)]));
        link(&root, 60, 7);
        let r = n.refresh_from(&procfs, &pids, t1 + Duration::from_millis(1));
        assert_eq!(r, BTreeMap::from([(3, 1), (7, 60)]));
        let _ = std::fs::remove_dir_all(&root);
    }

    /// The process a namespace is read through is checked at every refresh: when it left
    /// (here: moved to another namespace), the next lowest of the namespace stands in, at
    /// once.
    #[test]
    fn a_representative_that_left_is_replaced_at_the_next_refresh() {
        let (root, procfs) = fake_proc("reps");
        for (pid, ns) in [(1, 3), (10, 7), (20, 7)] {
            link(&root, pid, ns);
        }
        let pids = [1, 10, 20];
        let mut n = Namespaces::new();
        let t0 = Instant::now();
        assert_eq!(
            n.refresh_from(&procfs, &pids, t0),
            BTreeMap::from([(3, 1), (7, 10)])
        );
        let later = t0 + YOUNG;
        n.refresh_from(&procfs, &pids, later);
        link(&root, 10, 9);
        let r = n.refresh_from(&procfs, &pids, later + Duration::from_millis(1));
        assert_eq!(r, BTreeMap::from([(3, 1), (7, 20), (9, 10)]));
        let _ = std::fs::remove_dir_all(&root);
    }

    /// Every known process is read again once per RECHECK, spread over the refreshes, and
    /// a process that moved is seen in its new namespace within it.
    #[test]
    fn rechecks_are_spread_over_recheck() {
        let (root, procfs) = fake_proc("spread");
        let pids: Vec<u32> = (1..=100).collect();
        for &p in &pids {
            link(&root, p, 7);
        }
        let mut n = Namespaces::new();
        let t0 = Instant::now();
        assert_eq!(n.refresh_from(&procfs, &pids, t0), BTreeMap::from([(7, 1)]));
        // No longer young; the refresh at the YOUNG mark read every one again.
        let t1 = t0 + YOUNG;
        n.refresh_from(&procfs, &pids, t1);
        // Every pid moves; a tenth of RECHECK later, about a tenth of them were read again,
        // plus the few namespace representatives checked (at most 4 rounds of them).
        for &p in &pids {
            link(&root, p, 9);
        }
        let r = n.refresh_from(&procfs, &pids, t1 + RECHECK / 10);
        assert_eq!(r.len(), 2, "some moved, most not read yet: {r:?}");
        let moved = n.of.values().filter(|ns| **ns == 9).count();
        assert!((10..=10 + 4).contains(&moved), "{moved}");
        // Within one RECHECK of refreshes, all were read again.
        for i in 2..=10 {
            n.refresh_from(&procfs, &pids, t1 + RECHECK * i / 10);
        }
        assert_eq!(
            n.refresh_from(&procfs, &pids, t1 + RECHECK + Duration::from_millis(1)),
            BTreeMap::from([(9, 1)])
        );
        // A pid that left is dropped; the order stays bounded.
        let fewer: Vec<u32> = (1..=10).collect();
        n.refresh_from(&procfs, &fewer, t1 + RECHECK * 3);
        assert_eq!(n.of.len(), 10);
        assert!(n.order.len() <= 2 * 10 + 64);
        let _ = std::fs::remove_dir_all(&root);
    }
}
