//! Per-process counters, and the bounded series they are exported on.
//!
//! Every signal module adds to a [`ProcStats`] obtained with [`Store::proc_mut`]: the
//! per-process detail the status page, `/api/v1/*`, `bufscope explain`/`top` and the advice
//! read. At most `max_processes` processes are tracked; when a new one arrives the least
//! recently active leaves the detail (its row is added to the `_other` row of the status
//! page). Processes that exited leave after the retention window. Counts that cannot be
//! attributed go to `comm="_unknown"` and to `bufscope_attribution_unknown_total{probe}`.
//!
//! Prometheus sees *identities*, not processes ([`series`]): every process counts on the
//! series of its program and place ([`ProcMeta`]), which sum every process the identity had,
//! tracked or gone. A process leaving the detail, for whatever reason, leaves its counts on
//! its identity's series ([`Series::departed`]): no series ever takes over counts another one
//! showed, so `sum(rate())` over any family counts every event once. Identities get series of
//! their own while they fit the series budget ([`Store::admit`]); the others count on the one
//! overflow identity.
//!
//! A process known to hold a UDP socket before it counted anything gets a *placeholder*
//! entry ([`Store::placeholder`]), so that its identity's drop series exists at 0 before the
//! first drop and Prometheus sees that drop as an increase. Placeholders only use free room:
//! a process with counts never makes way for one, and each one is the first to go when a
//! process with counts needs room (it has nothing to fold) or when it exits.
//!
//! A process that `exec`s keeps its pid and start time but gets a new `comm`
//! ([`Store::relabel`]): its counts so far stay on the series of its old identity, its counts
//! from then on go to its new identity's.

mod proc;
pub mod series;

use std::collections::BTreeMap;

use foldhash::{HashMap, HashMapExt as _, HashSet};
use std::time::{Duration, Instant, SystemTime};

pub use proc::{Parts, ProcMeta, ProcRef, ProcStats, Who};
pub use series::{Admission, Series, SeriesId, identity_hash};

use series::{FIRST, OVERFLOW, UNKNOWN};

/// The per-process counters and their bounds.
pub struct Store<P> {
    procs: HashMap<ProcRef, ProcStats<P>>,
    /// The identities (the overflow one included), by number.
    series: HashMap<SeriesId, Series<P>>,
    by_meta: HashMap<ProcMeta, SeriesId>,
    next_id: SeriesId,
    /// The status page's row of processes that left the detail for room.
    other: ProcStats<P>,
    unknown: ProcStats<P>,
    max_processes: usize,
    retention: Duration,
    /// Events that could not be attributed, by probe.
    pub attribution_unknown: BTreeMap<&'static str, u64>,
    /// Processes that left the per-process detail for room so far (their counts stay on
    /// their identity's series).
    pub folded: u64,
    /// Processes whose counts went to the overflow series (their identity got no series of
    /// its own: the series budget or the identity bound was reached).
    pub overflowed: u64,
    /// Per-process series shown at the last exposition (identities with their own series).
    pub series_used: usize,
    /// `--max-series`: the node's budget of per-process series.
    pub budget: usize,
    /// When the store was made (the exporter's start: every counter counts from then on).
    started: SystemTime,
}

/// `--max-series` by default: per-process series of a node (identities' counters and the
/// process info series).
pub const DEFAULT_MAX_SERIES: usize = 200;

/// The share of the budget the `bufscope_process_info` series may take (one in this many).
pub const INFO_SHARE: usize = 5;

/// The `comm` of the overflow identity (and of the status page's row of processes that left
/// the detail).
pub const OTHER_COMM: &str = "_other";
/// The `comm` of the pseudo-process for unattributable counts.
pub const UNKNOWN_COMM: &str = "_unknown";

/// One identity as the exposition shows it: its labels and the sum of its processes'
/// counters.
#[derive(Clone, Debug)]
pub struct Row<P> {
    /// Which identity.
    pub id: SeriesId,
    /// The overflow identity (`otel_metric_overflow="true"`).
    pub overflow: bool,
    /// Its labels ([`ProcStats::meta`]), counters (departed and tracked processes summed) and
    /// when it was made ([`ProcStats::born`]).
    pub stats: ProcStats<P>,
}

fn pseudo<P: Parts>(comm: &str, series: SeriesId) -> ProcStats<P> {
    let mut s = ProcStats::new(
        ProcMeta {
            comm: comm.to_string(),
            ..ProcMeta::default()
        },
        Instant::now(),
    );
    s.series = series;
    s
}

impl<P: Parts> Store<P> {
    /// A store that tracks at most `max_processes` (and at most that many identities more
    /// than the series budget admits) and forgets exited ones after `retention`.
    pub fn new(max_processes: usize, retention: Duration) -> Self {
        let mut series = HashMap::new();
        let mut overflow = Series::new(
            ProcMeta {
                comm: OTHER_COMM.to_string(),
                ..ProcMeta::default()
            },
            Admission::Own,
        );
        overflow.members = 0;
        series.insert(OVERFLOW, overflow);
        Self {
            procs: HashMap::new(),
            series,
            by_meta: HashMap::new(),
            next_id: FIRST,
            other: pseudo(OTHER_COMM, OVERFLOW),
            unknown: pseudo(UNKNOWN_COMM, UNKNOWN),
            max_processes: max_processes.max(1),
            retention,
            attribution_unknown: BTreeMap::new(),
            folded: 0,
            overflowed: 0,
            series_used: 0,
            budget: DEFAULT_MAX_SERIES,
            started: SystemTime::now(),
        }
    }

    /// With a budget of `max_series` per-process series (`--max-series`).
    pub fn with_series_budget(mut self, max_series: usize) -> Self {
        self.budget = max_series;
        self
    }

    /// How many `bufscope_process_info` series may be shown.
    pub fn info_budget(&self) -> usize {
        self.budget / INFO_SHARE
    }

    /// How many series the identities' counters may have.
    pub fn counter_budget(&self) -> usize {
        self.budget - self.info_budget()
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

    /// The identity `meta` counts on, joined by one more process: its own (made, pending,
    /// when new and there is room for another identity), else the overflow identity (None
    /// instead when `overflow` is false).
    fn join(&mut self, meta: &ProcMeta, overflow: bool) -> Option<SeriesId> {
        let id = match self.by_meta.get(meta) {
            Some(id) => *id,
            // As many identities as can have series (those admitted) and as processes can
            // be tracked (those not decided yet); the overflow one not counted.
            None if self.series.len() > self.max_processes + self.counter_budget() => {
                if !overflow {
                    return None;
                }
                self.overflowed += 1;
                OVERFLOW
            }
            None => {
                let id = self.next_id;
                self.next_id += 1;
                self.series
                    .insert(id, Series::new(meta.clone(), Admission::Pending));
                self.by_meta.insert(meta.clone(), id);
                id
            }
        };
        if let Some(s) = self.series.get_mut(&id) {
            s.members += 1;
        }
        Some(id)
    }

    /// A process leaves the per-process detail: its counts stay on its identity's series.
    /// `alive`: the process (still running) whose counts the probes' maps keep too.
    fn depart(&mut self, s: &ProcStats<P>, alive: Option<ProcRef>, now: Instant) {
        let id = if self.series.contains_key(&s.series) {
            s.series
        } else {
            OVERFLOW
        };
        if let Some(series) = self.series.get_mut(&id) {
            series.departed.absorb(&s.parts);
            if let Some(p) = alive
                && s.exited.is_none()
                && s.has_counts()
            {
                series.departed_alive.push((p, s.parts.clone()));
            }
            series.members = series.members.saturating_sub(1);
            series.last_left = now;
        }
    }

    /// The counters of `who`, creating them (and making room by folding the least active
    /// process out of the detail if the bound is reached). `meta` is called only for a new
    /// process.
    pub fn proc_mut(&mut self, who: Who, meta: impl FnOnce() -> ProcMeta) -> &mut ProcStats<P> {
        let now = Instant::now();
        let p = match who {
            Who::Unknown => return &mut self.unknown,
            Who::Proc(p) => p,
        };
        if !self.procs.contains_key(&p) {
            if self.procs.len() >= self.max_processes {
                self.fold_least_active();
            }
            let meta = meta();
            let series = self.join(&meta, true).unwrap_or(OVERFLOW);
            let mut s = ProcStats::new(meta, now);
            s.series = series;
            self.procs.insert(p, s);
        }
        match self.procs.get_mut(&p) {
            Some(s) => {
                s.last_active = now;
                s.placeholder = false;
                s
            }
            // Unreachable (inserted above); fall back to the overflow row rather than panic.
            None => &mut self.other,
        }
    }

    /// The entry of a process known to hold a socket that has not counted anything yet, so
    /// that a room can put its series at 0 (e.g. drops of a UDP socket: Prometheus then sees
    /// the first drops as an increase). An existing entry is returned as it is (nothing
    /// counts as activity). A new one is made only when there is room: `None` when
    /// `--max-processes` are tracked (a placeholder never folds a process) or no identity
    /// can be made for it.
    pub fn placeholder(
        &mut self,
        p: ProcRef,
        meta: impl FnOnce() -> ProcMeta,
    ) -> Option<&mut ProcStats<P>> {
        if !self.procs.contains_key(&p) {
            if self.procs.len() >= self.max_processes {
                return None;
            }
            let meta = meta();
            let series = self.join(&meta, false)?;
            let mut s = ProcStats::new(meta, Instant::now());
            s.placeholder = true;
            s.series = series;
            self.procs.insert(p, s);
        }
        self.procs.get_mut(&p)
    }

    /// Puts series at 0 for process `p`, known to hold a socket that has not counted
    /// anything yet (`zero` adds the zero counts: e.g. UDP buffer drops, so that Prometheus
    /// sees the first drops as an increase): on its entry (a [`Store::placeholder`]) where
    /// there is room for one, else on its identity directly (made if needed), so that the
    /// zero series exist even while the per-process detail is full.
    pub fn zero_series(
        &mut self,
        p: ProcRef,
        meta: impl FnOnce() -> ProcMeta,
        zero: impl FnOnce(&mut P),
    ) {
        if self.procs.contains_key(&p) || self.procs.len() < self.max_processes {
            if let Some(s) = self.placeholder(p, meta) {
                zero(&mut s.parts);
            }
            return;
        }
        let meta = meta();
        let Some(id) = self.join(&meta, false) else {
            return;
        };
        if let Some(s) = self.series.get_mut(&id) {
            // No process of it is tracked: it stays the retention window, as one that left.
            s.members = s.members.saturating_sub(1);
            s.last_left = Instant::now();
            zero(&mut s.departed);
        }
    }

    /// Gives tracked process `p` new labels (`meta`: its `comm` changed with an `exec`). Its
    /// counts so far stay on its old identity's series; from now on it counts on its new
    /// identity's, whose drop series start at 0 (a name it had before: that identity's
    /// series go on). An entry that counted nothing just moves.
    pub fn relabel(&mut self, p: ProcRef, meta: ProcMeta) {
        let now = Instant::now();
        let Some(s) = self.procs.get(&p) else {
            return;
        };
        if s.meta == meta {
            return;
        }
        let Some(old) = self.procs.remove(&p) else {
            return;
        };
        let mut fresh = ProcStats::new(meta.clone(), now);
        fresh.placeholder = old.placeholder;
        fresh.born = old.born;
        fresh.exited = old.exited;
        if old.placeholder || !old.has_counts() {
            fresh.parts = old.parts.clone();
        } else {
            fresh.parts = old.parts.after_exec();
        }
        // What it counted stays on the old identity (as a process that left it).
        let mut leaving = old;
        if !leaving.has_counts() {
            leaving.parts = P::default();
        }
        self.depart(&leaving, Some(p), now);
        fresh.series = self.join(&meta, true).unwrap_or(OVERFLOW);
        self.procs.insert(p, fresh);
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
        {
            self.depart(&stats, Some(v), Instant::now());
            if !stats.placeholder {
                self.other.absorb(&stats);
                self.folded += 1;
            }
        }
    }

    /// Every tracked process, those already taken for exited included (GC looks at each
    /// again: one seen alive is not exited, whatever an earlier look said).
    pub fn tracked(&self) -> Vec<ProcRef> {
        self.procs.keys().copied().collect()
    }

    /// What GC must know the liveness of: every tracked process, and those that left the
    /// detail while alive ([`Series::departed_alive`]).
    pub fn watched(&self) -> Vec<ProcRef> {
        let mut v = self.tracked();
        v.extend(
            self.series
                .values()
                .flat_map(|s| s.departed_alive.iter().map(|(p, _)| *p)),
        );
        v
    }

    /// Marks processes for which `alive` is false as exited and forgets those that exited
    /// longer than the retention window ago (placeholders at once: they counted nothing);
    /// their counts stay on their identity. An identity with no process left leaves the
    /// retention window after its last one. A process taken for exited that `alive` finds
    /// running again (the same pid and start time: an earlier look at `/proc` failed) is
    /// running: it stays.
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
        let gone: Vec<ProcRef> = self
            .procs
            .iter()
            .filter(|(_, s)| {
                s.exited
                    .is_some_and(|t| s.placeholder || now.duration_since(t) >= retention)
            })
            .map(|(p, _)| *p)
            .collect();
        for p in gone {
            if let Some(s) = self.procs.remove(&p) {
                self.depart(&s, None, now);
            }
        }
        for s in self.series.values_mut() {
            s.departed_alive.retain(|(p, _)| alive(p));
        }
        let expired: Vec<SeriesId> = self
            .series
            .iter()
            .filter(|(id, s)| {
                **id != OVERFLOW && s.members == 0 && now.duration_since(s.last_left) >= retention
            })
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Some(s) = self.series.remove(&id) {
                self.by_meta.remove(&s.meta);
            }
        }
    }

    /// Every tracked process plus the pseudo-processes that have counts (the status page's
    /// rows), with its pid (empty for pseudo-processes).
    pub fn iter(&self) -> impl Iterator<Item = (String, &ProcStats<P>)> {
        let mut procs: Vec<(&ProcRef, &ProcStats<P>)> = self.procs.iter().collect();
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

    /// Every identity (the overflow one included).
    pub fn identities(&self) -> impl Iterator<Item = (SeriesId, &Series<P>)> {
        self.series.iter().map(|(id, s)| (*id, s))
    }

    /// Identity `id`, if it exists.
    pub fn identity(&self, id: SeriesId) -> Option<&Series<P>> {
        self.series.get(&id)
    }

    /// Identities with series of their own now (the overflow one not included).
    pub fn own_identities(&self) -> usize {
        self.series
            .iter()
            .filter(|(id, s)| **id != OVERFLOW && s.admission == Admission::Own)
            .count()
    }

    /// The rows of the identities `pick` selects, each the sum of its departed and tracked
    /// processes, sorted by labels.
    fn rows_where(&self, pick: impl Fn(SeriesId, &Series<P>) -> bool) -> Vec<Row<P>> {
        let mut acc: HashMap<SeriesId, Row<P>> = self
            .series
            .iter()
            .filter(|(id, s)| pick(**id, s))
            .map(|(id, s)| {
                let mut stats = ProcStats::new(s.meta.clone(), s.last_left);
                stats.born = s.born;
                stats.parts = s.departed.clone();
                stats.series = *id;
                (
                    *id,
                    Row {
                        id: *id,
                        overflow: *id == OVERFLOW,
                        stats,
                    },
                )
            })
            .collect();
        for s in self.procs.values() {
            if let Some(r) = acc.get_mut(&s.series) {
                r.stats.absorb(s);
            }
        }
        let mut rows: Vec<Row<P>> = acc.into_values().collect();
        rows.sort_by(|a, b| (a.overflow, &a.stats.meta).cmp(&(b.overflow, &b.stats.meta)));
        rows
    }

    /// What the exposition shows: the identities with series of their own, then the
    /// overflow identity and `_unknown` (each when it has counts).
    pub fn rows(&self) -> Vec<Row<P>> {
        let mut rows = self.rows_where(|_, s| s.admission == Admission::Own);
        rows.retain(|r| !r.overflow || r.stats.has_counts());
        if self.unknown.has_counts() {
            rows.push(Row {
                id: UNKNOWN,
                overflow: false,
                stats: self.unknown.clone(),
            });
        }
        rows
    }

    /// Every identity's row, decided or not (tests, and how many series an identity would
    /// have).
    pub fn rows_including_pending(&self) -> Vec<Row<P>> {
        self.rows_where(|id, _| id != OVERFLOW)
    }

    /// Decides the pending identities, oldest first: one whose series (`count`, as the
    /// exposition would render its row) fit in [`Store::counter_budget`] next to the [`Store::series_used`]
    /// of the last exposition gets series of its own; one that does not is merged into the
    /// overflow identity (nothing of it was shown: no count moves between series) and its
    /// processes count there from now on. One with no series yet stays pending.
    /// Returns whether any was decided.
    pub fn admit(&mut self, mut count: impl FnMut(&Row<P>) -> usize) -> bool {
        let budget = self.counter_budget();
        let mut pending = self.rows_where(|_, s| s.admission == Admission::Pending);
        if pending.is_empty() {
            return false;
        }
        pending.sort_by_key(|r| r.id);
        let mut refused = HashSet::default();
        let mut decided = false;
        for row in &pending {
            let n = count(row);
            if n == 0 {
                continue;
            }
            decided = true;
            if self.series_used + n <= budget {
                self.series_used += n;
                if let Some(s) = self.series.get_mut(&row.id) {
                    s.admission = Admission::Own;
                }
            } else {
                refused.insert(row.id);
            }
        }
        if refused.is_empty() {
            return decided;
        }
        for s in self.procs.values_mut() {
            if refused.contains(&s.series) {
                s.series = OVERFLOW;
                self.overflowed += 1;
                if let Some(o) = self.series.get_mut(&OVERFLOW) {
                    o.members += 1;
                }
            }
        }
        for id in refused {
            if let Some(s) = self.series.remove(&id) {
                self.by_meta.remove(&s.meta);
                if let Some(o) = self.series.get_mut(&OVERFLOW) {
                    o.departed.absorb(&s.departed);
                    o.departed_alive.extend(s.departed_alive);
                }
            }
        }
        true
    }

    /// The identity of `meta` as an earlier bufscope left it (`--bpf.pin-path`): its
    /// `departed` counts (the earlier bufscope's total of its departed processes and of the
    /// event-built counters of its tracked ones) and whether it had series of its own. The
    /// overflow identity when `overflow`.
    pub fn restore_identity(&mut self, meta: ProcMeta, overflow: bool, own: bool, departed: P) {
        let id = if overflow {
            OVERFLOW
        } else if let Some(id) = self.by_meta.get(&meta) {
            *id
        } else {
            let id = self.next_id;
            self.next_id += 1;
            let admission = if own {
                Admission::Own
            } else {
                Admission::Pending
            };
            self.series.insert(id, Series::new(meta.clone(), admission));
            self.by_meta.insert(meta, id);
            id
        };
        if let Some(s) = self.series.get_mut(&id) {
            s.departed.absorb(&departed);
            if own {
                s.admission = Admission::Own;
            }
        }
    }
}

#[cfg(test)]
mod tests;
