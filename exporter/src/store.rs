//! Per-process counters, with bounded cardinality.
//!
//! Every signal module adds to a [`ProcStats`] obtained with [`Store::proc_mut`]. At most
//! `max_processes` processes are tracked; when a new one arrives the least recently active is
//! folded into the `comm="_other"` pseudo-process (its counts are added there, so sums over
//! processes never go down). Processes that exited leave after the retention window. Counts
//! that cannot be attributed go to `comm="_unknown"` and to
//! `bufscope_attribution_unknown_total{probe}`.
//!
//! A process known to hold a UDP socket before it counted anything gets a *placeholder*
//! entry ([`Store::placeholder`]), so that its drop series exists at 0 before its first drop
//! and Prometheus sees that drop as an increase. Placeholders only use free room: a process
//! with counts never makes way for one, and each one is the first to go when a process with
//! counts needs room (it has nothing to fold) or when it exits.
//!
//! A process that `exec`s keeps its pid and start time but gets a new `comm`
//! ([`Store::relabel`]): its counts so far stay on the series with the old labels (kept like
//! an exited process's for the retention window), its counts from then on go to new series.

use std::collections::BTreeMap;

use foldhash::{HashMap, HashMapExt as _};
use std::time::{Duration, Instant, SystemTime};

/// Identity of a process: pid plus start time, so a reused pid is a different process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcRef {
    /// Thread-group id.
    pub tgid: u32,
    /// Start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_ticks: u64,
}

/// Label values that describe a process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcMeta {
    /// Process name (lossy UTF-8 of the kernel's `comm` bytes).
    pub comm: String,
    /// Container id, empty on the host.
    pub container: String,
    /// Kubernetes pod name, empty outside a pod (`attribution::kubernetes`).
    pub pod: String,
    /// Kubernetes namespace, empty outside a pod.
    pub namespace: String,
    /// The container's name in its pod, empty outside a pod (or when not known).
    pub container_name: String,
}

/// The per-signal parts of a process's counters (the signal rooms define them; the store
/// only folds, expires and relabels them).
pub trait Parts: Clone + std::fmt::Debug + Default + Send {
    /// Adds every counter of `o` to `self`.
    fn absorb(&mut self, o: &Self);
    /// Whether anything was counted.
    fn has_counts(&self) -> bool;
    /// What the process starts with under new labels after an `exec` (series kept at 0).
    fn after_exec(&self) -> Self;
}

/// Counters of one process: common facts, then one part per signal ([`Parts`]).
#[derive(Clone, Debug)]
pub struct ProcStats<P> {
    /// Labels.
    pub meta: ProcMeta,
    /// Last time any counter moved.
    pub last_active: Instant,
    /// When the process was seen gone.
    pub exited: Option<Instant>,
    /// When this entry was made (wall clock): its counters have counted from 0 since then
    /// (OpenMetrics `_created`).
    pub born: SystemTime,
    /// Nothing counted yet: the entry exists only so that its series start at 0 (see
    /// [`Store::placeholder`]).
    pub placeholder: bool,
    /// One part per signal.
    pub parts: P,
}

impl<P: Parts> ProcStats<P> {
    fn new(meta: ProcMeta, now: Instant) -> Self {
        Self {
            meta,
            last_active: now,
            exited: None,
            born: SystemTime::now(),
            placeholder: false,
            parts: P::default(),
        }
    }

    /// Adds every counter of `o` to `self`.
    fn absorb(&mut self, o: &Self) {
        self.parts.absorb(&o.parts);
        self.last_active = self.last_active.max(o.last_active);
    }

    /// Whether anything was counted.
    pub fn has_counts(&self) -> bool {
        self.parts.has_counts()
    }
}

/// Who a count belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who {
    /// A process.
    Proc(ProcRef),
    /// Nobody we could find (`comm="_unknown"`).
    Unknown,
}

/// The per-process counters and their bounds.
pub struct Store<P> {
    procs: HashMap<ProcRef, ProcStats<P>>,
    other: ProcStats<P>,
    unknown: ProcStats<P>,
    max_processes: usize,
    retention: Duration,
    /// Events that could not be attributed, by probe.
    pub attribution_unknown: BTreeMap<&'static str, u64>,
    /// Processes folded into `_other` so far.
    pub folded: u64,
    /// When the store was made (the exporter's start: every counter counts from then on).
    started: SystemTime,
    /// The counts of processes under earlier labels (before an `exec`: [`Store::relabel`]),
    /// kept like exited processes for the retention window.
    retired: Vec<(ProcRef, ProcStats<P>)>,
}

/// The `comm` of the pseudo-process that absorbs folded processes.
pub const OTHER_COMM: &str = "_other";
/// The `comm` of the pseudo-process for unattributable counts.
pub const UNKNOWN_COMM: &str = "_unknown";

impl<P: Parts> Store<P> {
    /// A store that tracks at most `max_processes` and forgets exited ones after `retention`.
    pub fn new(max_processes: usize, retention: Duration) -> Self {
        let now = Instant::now();
        let pseudo = |c: &str| {
            ProcStats::new(
                ProcMeta {
                    comm: c.to_string(),
                    container: String::new(),
                    ..ProcMeta::default()
                },
                now,
            )
        };
        Self {
            procs: HashMap::new(),
            other: pseudo(OTHER_COMM),
            unknown: pseudo(UNKNOWN_COMM),
            max_processes: max_processes.max(1),
            retention,
            attribution_unknown: BTreeMap::new(),
            folded: 0,
            started: SystemTime::now(),
            retired: Vec::new(),
        }
    }

    /// `--retention`: how long an exited process's series stay.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// When the store was made: the exporter's start.
    pub fn started(&self) -> SystemTime {
        self.started
    }

    /// Number of tracked (real) processes.
    pub fn len(&self) -> usize {
        self.procs.len()
    }

    /// True when no process is tracked.
    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    /// The counters of `who`, creating them (and folding the least active process into
    /// `_other` if the bound is reached). `meta` is called only for a new process.
    pub fn proc_mut(&mut self, who: Who, meta: impl FnOnce() -> ProcMeta) -> &mut ProcStats<P> {
        let now = Instant::now();
        let p = match who {
            Who::Unknown => return &mut self.unknown,
            Who::Proc(p) => p,
        };
        if !self.procs.contains_key(&p) {
            // A reused pid: the earlier process (exited, kept for retention) would produce
            // series with exactly the same labels. Fold it into `_other` first.
            let reused: Vec<ProcRef> = self
                .procs
                .keys()
                .filter(|q| q.tgid == p.tgid)
                .copied()
                .collect();
            for q in reused {
                if let Some(old) = self.procs.remove(&q)
                    && !old.placeholder
                {
                    self.other.absorb(&old);
                    self.folded += 1;
                }
            }
            let (same_pid, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retired)
                .into_iter()
                .partition(|(q, _)| q.tgid == p.tgid);
            self.retired = kept;
            for (_, old) in same_pid {
                self.other.absorb(&old);
                self.folded += 1;
            }
            if self.procs.len() >= self.max_processes {
                self.fold_least_active();
            }
            self.procs.insert(p, ProcStats::new(meta(), now));
        }
        match self.procs.get_mut(&p) {
            Some(s) => {
                s.last_active = now;
                s.placeholder = false;
                s
            }
            // Unreachable (inserted above); fall back to _other rather than panic.
            None => &mut self.other,
        }
    }

    /// The entry of a process known to hold a socket that has not counted anything yet, so
    /// that a room can put its series at 0 (e.g. drops of a UDP socket: Prometheus then sees
    /// the first drops as an increase). An existing entry is returned as it is (nothing
    /// counts as activity). A new one is made only when there is room: `None` when
    /// `--max-processes` are tracked (a placeholder never folds a process).
    pub fn placeholder(
        &mut self,
        p: ProcRef,
        meta: impl FnOnce() -> ProcMeta,
    ) -> Option<&mut ProcStats<P>> {
        if !self.procs.contains_key(&p) {
            // A reused pid's earlier process (exited, kept for retention) has the same labels.
            if self.procs.len() >= self.max_processes || self.procs.keys().any(|q| q.tgid == p.tgid)
            {
                return None;
            }
            let mut s = ProcStats::new(meta(), Instant::now());
            s.placeholder = true;
            self.procs.insert(p, s);
        }
        self.procs.get_mut(&p)
    }

    /// Gives tracked process `p` new labels (`meta`: its `comm` changed with an `exec`). Its
    /// counts so far stay on series with the old labels, kept like an exited process's for
    /// the retention window; from now on it counts on series with the new labels, whose drop
    /// series start at 0. An entry that counted nothing is just renamed.
    pub fn relabel(&mut self, p: ProcRef, meta: ProcMeta) {
        let now = Instant::now();
        let Some(s) = self.procs.get_mut(&p) else {
            return;
        };
        if s.meta == meta {
            return;
        }
        if s.placeholder || !s.has_counts() {
            s.meta = meta;
            return;
        }
        // Back to labels it had before (exec A, B, A): those series continue.
        let fresh = match self
            .retired
            .iter()
            .position(|(q, r)| *q == p && r.meta == meta)
        {
            Some(i) => {
                let (_, mut r) = self.retired.swap_remove(i);
                r.exited = None;
                r.last_active = now;
                r
            }
            None => {
                let mut f = ProcStats::new(meta, now);
                f.parts = s.parts.after_exec();
                f
            }
        };
        let mut old = std::mem::replace(s, fresh);
        old.exited = Some(now);
        self.retired.push((p, old));
        if self.retired.len() > self.max_processes {
            let (_, o) = self.retired.remove(0);
            self.other.absorb(&o);
            self.folded += 1;
        }
    }

    /// Placeholder entries (processes with series at 0 and nothing counted).
    pub fn placeholders(&self) -> usize {
        self.procs.values().filter(|s| s.placeholder).count()
    }

    /// Records `n` unattributable events of `probe`.
    pub fn count_unknown(&mut self, probe: &'static str, n: u64) {
        *self.attribution_unknown.entry(probe).or_default() += n;
    }

    fn fold_least_active(&mut self) {
        // Placeholders first (nothing to fold), then exited processes, then the least active.
        let victim = self
            .procs
            .iter()
            .min_by_key(|(p, s)| (!s.placeholder, s.exited.is_none(), s.last_active, **p))
            .map(|(p, _)| *p);
        if let Some(v) = victim
            && let Some(stats) = self.procs.remove(&v)
            && !stats.placeholder
        {
            self.other.absorb(&stats);
            self.folded += 1;
        }
    }

    /// Every tracked process, those already taken for exited included (GC looks at each
    /// again: one seen alive is not exited, whatever an earlier look said).
    pub fn tracked(&self) -> Vec<ProcRef> {
        self.procs.keys().copied().collect()
    }

    /// Marks processes for which `alive` is false as exited and forgets those that exited
    /// longer than the retention window ago (placeholders at once: they counted nothing). A
    /// process taken for exited that `alive` finds running again (the same pid and start
    /// time: an earlier look at `/proc` failed) is running: its series stay.
    pub fn expire(&mut self, alive: impl Fn(&ProcRef) -> bool) {
        let now = Instant::now();
        for (p, s) in self.procs.iter_mut() {
            match (s.exited.is_some(), alive(p)) {
                (false, false) => s.exited = Some(now),
                (true, true) => s.exited = None,
                _ => {}
            }
        }
        let retention = self.retention;
        self.procs.retain(|_, s| {
            s.exited
                .is_none_or(|t| !s.placeholder && now.duration_since(t) < retention)
        });
        self.retired
            .retain(|(_, s)| s.exited.is_none_or(|t| now.duration_since(t) < retention));
    }

    /// Every tracked process plus the pseudo-processes that have counts, with the label
    /// value for `pid` (empty for pseudo-processes).
    pub fn iter(&self) -> impl Iterator<Item = (String, &ProcStats<P>)> {
        let mut procs: Vec<(&ProcRef, &ProcStats<P>)> = self
            .procs
            .iter()
            .chain(self.retired.iter().map(|(p, s)| (p, s)))
            .collect();
        procs.sort_by_key(|(p, _)| **p);
        procs
            .into_iter()
            .map(|(p, s)| (p.tgid.to_string(), s))
            .chain(
                [&self.other, &self.unknown]
                    .into_iter()
                    .filter(|s| s.has_counts())
                    .map(|s| (String::new(), s)),
            )
    }

    /// Counters of one process, if tracked.
    pub fn get(&self, p: &ProcRef) -> Option<&ProcStats<P>> {
        self.procs.get(p)
    }

    /// All tracked processes.
    pub fn procs(&self) -> impl Iterator<Item = (&ProcRef, &ProcStats<P>)> {
        self.procs.iter()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A part with one counter and series by key (kept at 0 across an exec).
    #[derive(Clone, Debug, Default)]
    struct T {
        n: u64,
        by: BTreeMap<&'static str, u64>,
    }

    impl T {
        fn add(&mut self, k: &'static str, v: u64) {
            *self.by.entry(k).or_default() += v;
        }

        fn sum(&self) -> u64 {
            self.n + self.by.values().sum::<u64>()
        }
    }

    impl Parts for T {
        fn absorb(&mut self, o: &Self) {
            self.n += o.n;
            for (k, v) in &o.by {
                *self.by.entry(k).or_default() += v;
            }
        }

        fn has_counts(&self) -> bool {
            self.n > 0 || !self.by.is_empty()
        }

        fn after_exec(&self) -> Self {
            Self {
                n: 0,
                by: self.by.keys().map(|k| (*k, 0)).collect(),
            }
        }
    }

    type Store = super::Store<T>;

    fn p(t: u32) -> Who {
        Who::Proc(ProcRef {
            tgid: t,
            start_ticks: 1,
        })
    }

    fn meta(c: &str) -> impl FnOnce() -> ProcMeta + '_ {
        move || ProcMeta {
            comm: c.into(),
            container: String::new(),
            ..ProcMeta::default()
        }
    }

    #[test]
    fn folds_least_active_into_other_keeping_sums() {
        let mut s = Store::new(2, Duration::from_secs(60));
        s.proc_mut(p(1), meta("a")).parts.n += 5;
        std::thread::sleep(Duration::from_millis(2));
        s.proc_mut(p(2), meta("b")).parts.n += 7;
        std::thread::sleep(Duration::from_millis(2));
        s.proc_mut(p(3), meta("c")).parts.n += 1;
        assert_eq!(s.len(), 2);
        let all: Vec<_> = s
            .iter()
            .map(|(pid, st)| (pid, st.meta.comm.clone(), st.parts.n))
            .collect();
        assert!(
            all.contains(&(String::new(), OTHER_COMM.into(), 5)),
            "{all:?}"
        );
        assert_eq!(all.iter().map(|x| x.2).sum::<u64>(), 13);
        assert_eq!(s.folded, 1);
    }

    #[test]
    fn a_process_seen_alive_again_is_not_exited() {
        let mut s = Store::new(10, Duration::from_millis(20));
        s.proc_mut(p(1), meta("a")).parts.n += 1;
        s.expire(|_| false);
        assert_eq!(s.tracked().len(), 1, "looked at again by the next GC");
        s.expire(|_| true);
        std::thread::sleep(Duration::from_millis(30));
        s.expire(|_| true);
        assert_eq!(s.len(), 1, "alive: kept past the retention window");
        assert!(s.procs().all(|(_, st)| st.exited.is_none()));
    }

    #[test]
    fn exited_processes_leave_after_retention() {
        let mut s = Store::new(10, Duration::from_millis(20));
        s.proc_mut(p(1), meta("a")).parts.n += 1;
        s.expire(|_| false);
        assert_eq!(s.len(), 1, "kept during retention");
        std::thread::sleep(Duration::from_millis(30));
        s.expire(|_| false);
        assert!(s.is_empty());
    }

    #[test]
    fn a_reused_pid_never_duplicates_series() {
        let mut s = Store::new(10, Duration::from_secs(600));
        s.proc_mut(p(7), meta("a")).parts.n += 2;
        s.expire(|_| false); // exited, kept for retention
        let reused = Who::Proc(ProcRef {
            tgid: 7,
            start_ticks: 99,
        });
        s.proc_mut(reused, meta("a")).parts.n += 1;
        let pids: Vec<String> = s.iter().map(|(pid, _)| pid).collect();
        assert_eq!(pids.iter().filter(|x| *x == "7").count(), 1, "{pids:?}");
        let total: u64 = s.iter().map(|(_, st)| st.parts.n).sum();
        assert_eq!(total, 3, "the old process's counts moved to _other");
    }

    fn proc_ref(t: u32) -> ProcRef {
        ProcRef {
            tgid: t,
            start_ticks: 1,
        }
    }

    #[test]
    fn placeholders_use_only_free_room_and_go_first() {
        let mut s = Store::new(3, Duration::from_secs(600));
        s.proc_mut(p(1), meta("counted")).parts.n += 1;
        s.placeholder(proc_ref(2), meta("udp-a"))
            .unwrap()
            .parts
            .add("udp", 0);
        s.placeholder(proc_ref(3), meta("udp-b")).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s.placeholders(), 2);
        // Full: a fourth placeholder is refused, nothing is folded for it.
        assert!(s.placeholder(proc_ref(4), meta("udp-c")).is_none());
        assert_eq!((s.len(), s.folded), (3, 0));
        // An existing entry is handed back as it is (a counted one stays counted).
        assert!(!s.placeholder(proc_ref(1), meta("x")).unwrap().placeholder);
        // A process with counts takes a placeholder's room; nothing is folded into _other.
        s.proc_mut(p(5), meta("new")).parts.n += 2;
        assert_eq!((s.len(), s.folded, s.placeholders()), (3, 0, 1));
        assert!(s.iter().all(|(_, st)| st.meta.comm != OTHER_COMM));
        // A placeholder that counts becomes a process like any other.
        s.proc_mut(p(3), meta("udp-b")).parts.n += 1;
        assert_eq!(s.placeholders(), 0);
        // Then the least active counted process is folded as before.
        s.proc_mut(p(6), meta("newer")).parts.n += 1;
        assert_eq!(s.folded, 1);
    }

    #[test]
    fn exited_placeholders_leave_at_once() {
        let mut s = Store::new(10, Duration::from_secs(600));
        s.placeholder(proc_ref(1), meta("udp")).unwrap();
        s.proc_mut(p(2), meta("counted")).parts.n += 1;
        s.expire(|_| false);
        let left: Vec<String> = s.iter().map(|(_, st)| st.meta.comm.clone()).collect();
        assert_eq!(
            left,
            vec!["counted".to_string()],
            "kept for retention: counted only"
        );
    }

    #[test]
    fn an_exec_starts_new_series_and_keeps_the_old_ones() {
        let mut s = Store::new(10, Duration::from_millis(20));
        let r = proc_ref(4);
        s.proc_mut(p(4), meta("launcher")).parts.add("udp", 5);
        s.relabel(r, meta("worker")());
        s.proc_mut(p(4), meta("unused")).parts.add("udp", 2);
        let by_comm = |s: &Store| -> Vec<(String, String, u64)> {
            let mut v: Vec<_> = s
                .iter()
                .map(|(pid, st)| (pid, st.meta.comm.clone(), st.parts.sum()))
                .collect();
            v.sort();
            v
        };
        assert_eq!(
            by_comm(&s),
            vec![
                ("4".into(), "launcher".into(), 5),
                ("4".into(), "worker".into(), 2)
            ]
        );
        // Back to an earlier name: that series continues (no duplicate labels).
        s.relabel(r, meta("launcher")());
        s.proc_mut(p(4), meta("unused")).parts.add("udp", 1);
        assert_eq!(
            by_comm(&s),
            vec![
                ("4".into(), "launcher".into(), 6),
                ("4".into(), "worker".into(), 2)
            ]
        );
        // The old labels leave after the retention window.
        std::thread::sleep(Duration::from_millis(30));
        s.expire(|_| true);
        assert_eq!(by_comm(&s), vec![("4".into(), "launcher".into(), 6)]);
    }

    #[test]
    fn unknown_is_separate() {
        let mut s = Store::new(1, Duration::from_secs(1));
        s.proc_mut(Who::Unknown, meta("x")).parts.add("udp", 3);
        let unknown: Vec<_> = s
            .iter()
            .filter(|(_, st)| st.meta.comm == UNKNOWN_COMM)
            .collect();
        assert_eq!(unknown.len(), 1);
        assert_eq!(s.len(), 0);
    }
}
