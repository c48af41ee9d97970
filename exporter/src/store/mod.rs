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

mod proc;

use std::collections::BTreeMap;

use foldhash::{HashMap, HashMapExt as _};
use std::time::{Duration, Instant, SystemTime};

pub use proc::{Parts, ProcMeta, ProcRef, ProcStats, Who};

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
mod tests;
