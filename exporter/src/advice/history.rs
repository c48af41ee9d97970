//! What the findings were before: when each was first seen, when its verdict last changed,
//! its numbers while it cost, and whether a fix took. A per-socket finding that cost and then
//! stops costing after a change is kept as `resolved` (for `--advice.resolved-retention`) with
//! the numbers before and after:
//!
//! - **resized**: the same socket got a larger buffer and has not dropped since (judged once
//!   [`RESOLVE_AFTER`] passed since the change; drops/s after = drops since the change ÷ the
//!   time since it);
//! - **restarted**: the socket went away and the same program (comm, container, pod) has a
//!   socket of the same protocol and direction that does not cost (its size and drops/s) —
//!   a socket it sized, or one it never sized that the collector found among the program's
//!   live sockets ([`History::waiting`]: a fix through `rmem_default` and a restart).
//!
//! A costing socket that goes away before a successor shows is kept as `gone` with its last
//! numbers (never dropped silently). Drops that merely stop (the traffic went away, nothing
//! changed) make a finding benign, not resolved. State is bounded: [`MAX_ENTRIES`] entries,
//! [`MAX_SHOWN_PER_PROGRAM`] gone or resolved findings per program and kind.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bufscope_api::{Resolution, Snapshot, Verdict};
use bufscope_policy::Direction;

use super::sockets::{Fate, Settled, SocketFinding};
use super::{Finding, Severity};
use crate::labels::Proto;

/// How long after a buffer change a socket must go without drops before the change is called
/// a fix.
pub const RESOLVE_AFTER: u64 = 10;

/// How long resolved findings (and costing ones waiting for their program's new socket) are
/// kept by default (`--advice.resolved-retention`).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(30 * 60);

/// Who a program is across restarts: comm, container, pod, namespace.
pub type Program = (String, String, String, String);

/// A program's sockets of one protocol and direction.
type Kind = (Arc<Program>, Proto, Option<Direction>);

/// One socket direction as the rules saw it in one evaluation.
#[derive(Clone, Debug)]
pub struct Observation {
    /// Its process.
    pub pid: u32,
    /// Its socket.
    pub inode: u64,
    /// Its program (one allocation per process, shared by its sockets' observations).
    pub program: Arc<Program>,
    /// Transport.
    pub proto: Proto,
    /// Which buffer.
    pub dir: Direction,
    /// The buffer's size now.
    pub bytes: i64,
    /// Drops so far.
    pub drops_total: u64,
    /// Drops/s over the window.
    pub window_rate: f64,
    /// The finding's kind (None: nothing to say about it).
    pub kind: Option<&'static str>,
}

type Key = (u32, u64, &'static str);

fn dir_key(d: Direction) -> &'static str {
    match d {
        Direction::Receive => "receive",
        Direction::Send => "send",
    }
}

#[derive(Clone, Debug)]
struct Entry {
    program: Arc<Program>,
    proto: Proto,
    dir: Option<Direction>,
    first_seen: u64,
    last_seen: u64,
    /// The evaluation that last saw it.
    seen: u64,
    changed_at: u64,
    verdict: Option<Verdict>,
    severity: Severity,
    bytes: i64,
    /// When the buffer last changed size, and the drops then.
    resized: Option<(u64, u64)>,
    /// The numbers while it last cost.
    costing: Option<Snapshot>,
    /// Set once resolved: when.
    resolved_at: Option<u64>,
    /// The finding as last shown, as numbers: the one the evaluation's output holds
    /// (shared, not a copy).
    shown: Option<Arc<SocketFinding>>,
    /// The finding as last shown while its socket was there (once it is gone).
    before_gone: Option<Arc<SocketFinding>>,
}

impl Entry {
    /// The finding as last shown before it was marked gone (a gone finding turned resolved
    /// tells the story of the socket, not of its absence).
    fn unshown_gone(&self) -> Option<SocketFinding> {
        self.before_gone.as_deref().cloned()
    }
}

/// Findings' past, across evaluations.
#[derive(Debug)]
pub struct History {
    entries: HashMap<Key, Entry>,
    /// Sockets with nothing to say this evaluation (candidates for a restarted program's
    /// successor).
    quiet: Vec<Observation>,
    /// How long resolved findings are kept.
    pub retention: Duration,
    /// Evaluations so far.
    generation: u64,
}

impl Default for History {
    fn default() -> Self {
        Self::new(DEFAULT_RETENTION)
    }
}

impl History {
    /// Nothing seen yet.
    pub fn new(retention: Duration) -> Self {
        Self {
            entries: HashMap::new(),
            quiet: Vec::new(),
            retention,
            generation: 0,
        }
    }

    /// Entries remembered (sockets and per-process findings, seen or gone).
    pub fn remembered(&self) -> usize {
        self.entries.len()
    }

    /// Starts an evaluation.
    pub fn begin(&mut self) {
        self.quiet.clear();
        self.generation += 1;
    }

    /// A socket direction with nothing to say.
    pub fn observe_quiet(&mut self, o: Observation, now: u64) {
        self.track(&o, now);
        self.quiet.push(o);
    }

    /// Records the size; returns the entry.
    fn track(&mut self, o: &Observation, now: u64) -> &mut Entry {
        let generation = self.generation;
        let e = self
            .entries
            .entry((o.pid, o.inode, dir_key(o.dir)))
            .or_insert_with(|| Entry {
                program: o.program.clone(),
                proto: o.proto,
                dir: Some(o.dir),
                first_seen: now,
                last_seen: now,
                seen: generation,
                changed_at: now,
                verdict: None,
                severity: Severity::Info,
                bytes: o.bytes,
                resized: None,
                costing: None,
                resolved_at: None,
                shown: None,
                before_gone: None,
            });
        if e.bytes != o.bytes {
            e.bytes = o.bytes;
            e.resized = Some((now, o.drops_total));
        }
        e.last_seen = now;
        e.seen = generation;
        e
    }

    /// Seconds since the socket's buffer changed size, while that is within the window's
    /// judgement (None: no change seen).
    pub fn seconds_since_change(&mut self, o: &Observation, now: u64) -> Option<u64> {
        let e = self.track(o, now);
        e.resized.map(|(at, _)| now.saturating_sub(at))
    }

    /// Drops/s to judge the socket by: since its buffer changed (when it did and the socket
    /// cost before), else over the window.
    pub fn rate(&mut self, o: &Observation, now: u64) -> f64 {
        let e = self.track(o, now);
        match (e.resized, &e.costing) {
            (Some((at, drops_then)), Some(_)) => {
                let secs = now.saturating_sub(at).max(1) as f64;
                o.drops_total.saturating_sub(drops_then) as f64 / secs
            }
            _ => o.window_rate,
        }
    }

    /// Applies the lifecycle to one of this evaluation's per-socket findings; returns it as
    /// the history keeps it and the evaluation lists it (one finding, shared).
    pub fn settle(
        &mut self,
        mut f: SocketFinding,
        o: &Observation,
        now: u64,
    ) -> Arc<SocketFinding> {
        let e = self.track(o, now);
        let rate = f.drops_per_second();
        match f.verdict {
            Verdict::Costing => {
                e.costing = Some(Snapshot {
                    bytes: o.bytes,
                    drops_per_second: rate,
                    inode: o.inode,
                    pid: o.pid,
                });
                e.resolved_at = None;
            }
            Verdict::Benign => {
                let since_change = e.resized.map(|(at, _)| now.saturating_sub(at));
                if let (Some(before), Some(since)) = (&e.costing, since_change)
                    && o.bytes > before.bytes
                    && since >= RESOLVE_AFTER
                {
                    let at = *e.resolved_at.get_or_insert(now);
                    let r = Resolution {
                        at,
                        before: before.clone(),
                        after: Snapshot {
                            bytes: o.bytes,
                            drops_per_second: rate,
                            inode: o.inode,
                            pid: o.pid,
                        },
                        change: "resized".into(),
                    };
                    resolve(&mut f);
                    f.settled = Some(Settled::Resized(Box::new(r)));
                } else if let (Some(_), Some(since)) = (&e.costing, since_change)
                    && since < RESOLVE_AFTER
                {
                    f.settled = Some(Settled::Changing(since));
                }
            }
            _ => {}
        }
        if e.verdict != Some(f.verdict) || e.severity != f.severity {
            if e.verdict.is_some() {
                e.changed_at = now;
            }
            e.verdict = Some(f.verdict);
            e.severity = f.severity;
        }
        f.since = e.first_seen;
        f.changed_at = e.changed_at;
        if let Some(prev) = &e.shown {
            keep_what_was_known(&mut f, prev);
        }
        let f = Arc::new(f);
        e.shown = Some(f.clone());
        f
    }

    /// Ends an evaluation: entries not seen in it are gone (socket closed, process exited).
    /// Those that cost are shown as `gone` with their last numbers until the program has a
    /// socket of the same protocol and direction that does not cost (then `resolved`,
    /// `restarted`) or one that costs too (then that socket's own finding says so and this
    /// one goes), or until the retention passes. Returns the gone and resolved ones still
    /// kept.
    pub fn finish(&mut self, now: u64) -> Vec<Arc<SocketFinding>> {
        let retention = self.retention.as_secs();
        let generation = self.generation;
        let quiet = std::mem::take(&mut self.quiet);
        let costing_now: std::collections::HashSet<Kind> = self
            .entries
            .values()
            .filter(|e| e.seen == generation && e.verdict == Some(Verdict::Costing))
            .map(|e| (e.program.clone(), e.proto, e.dir))
            .collect();
        let mut gone_keep: Vec<Arc<SocketFinding>> = Vec::new();
        self.entries.retain(|_, e| {
            if e.seen == generation {
                return true;
            }
            if let Some(at) = e.resolved_at {
                if now.saturating_sub(at) > retention {
                    return false;
                }
                if let Some(f) = &e.shown {
                    gone_keep.push(f.clone());
                }
                return true;
            }
            let Some(before) = e.costing.clone() else {
                return false;
            };
            if now.saturating_sub(e.last_seen) > retention {
                return false;
            }
            if costing_now.contains(&(e.program.clone(), e.proto, e.dir)) {
                // The program's new socket costs too: its own finding says so.
                return false;
            }
            let Some(shown) = e.shown.clone() else {
                return false;
            };
            let successor = quiet.iter().find(|q| {
                q.program == e.program
                    && q.proto == e.proto
                    && Some(q.dir) == e.dir
                    && (q.pid, q.inode) != (before.pid, before.inode)
            });
            let Some(q) = successor else {
                // Not (yet) back: shown as gone, with its last numbers.
                if shown.verdict == Verdict::Gone {
                    gone_keep.push(shown);
                    return true;
                }
                let mut f = SocketFinding::clone(&shown);
                e.before_gone = Some(shown);
                gone(&mut f, &before, e.last_seen);
                e.changed_at = now;
                f.changed_at = now;
                e.verdict = Some(f.verdict);
                e.severity = f.severity;
                let f = Arc::new(f);
                e.shown = Some(f.clone());
                gone_keep.push(f);
                return true;
            };
            let mut f = e
                .unshown_gone()
                .unwrap_or_else(|| SocketFinding::clone(&shown));
            resolve(&mut f);
            f.fate = Some(Fate::Restarted(Box::new(Resolution {
                at: now,
                before,
                after: Snapshot {
                    bytes: q.bytes,
                    drops_per_second: q.window_rate,
                    inode: q.inode,
                    pid: q.pid,
                },
                change: "restarted".into(),
            })));
            f.changed_at = now;
            e.changed_at = now;
            e.verdict = Some(f.verdict);
            e.severity = f.severity;
            e.resolved_at = Some(now);
            let f = Arc::new(f);
            e.shown = Some(f.clone());
            gone_keep.push(f);
            true
        });
        bound_per_program(&mut gone_keep);
        self.bound_remembered();
        self.bound();
        gone_keep
    }

    /// Remembers at most [`MAX_SHOWN_PER_PROGRAM`] gone or resolved sockets per program and
    /// kind (the most recently changed, as shown): a program whose short-lived processes
    /// each cost once (one socket each) keeps what is shown of it, not every socket it had
    /// for the retention (5,000 of them held ~50 MB of findings).
    fn bound_remembered(&mut self) {
        let generation = self.generation;
        let mut per: HashMap<Kind, Vec<(u64, Key)>> = HashMap::new();
        for (k, e) in &self.entries {
            if e.seen != generation && e.shown.is_some() {
                per.entry((e.program.clone(), e.proto, e.dir))
                    .or_default()
                    .push((e.changed_at, *k));
            }
        }
        for (_, mut v) in per {
            if v.len() > MAX_SHOWN_PER_PROGRAM {
                v.sort_unstable_by_key(|(changed, _)| std::cmp::Reverse(*changed));
                for (_, k) in v.into_iter().skip(MAX_SHOWN_PER_PROGRAM) {
                    self.entries.remove(&k);
                }
            }
        }
    }

    /// Programs with a costing socket that is gone and not yet replaced, with its protocol:
    /// the collector looks up their live sockets (which may never have been sized, so no
    /// room knows them) so that a restart can be seen to fix it.
    pub fn waiting(&self) -> Vec<(Program, Proto)> {
        let mut out: Vec<(Program, Proto)> = self
            .entries
            .values()
            .filter(|e| {
                e.seen != self.generation
                    && e.resolved_at.is_none()
                    && e.costing.is_some()
                    && e.dir.is_some()
            })
            .map(|e| (Program::clone(&e.program), e.proto))
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// When time alone next changes what the history makes of the findings (Unix seconds; at
    /// `now` or before: at the next evaluation): a program waiting for its costing socket's
    /// successor (its live sockets are looked up at each evaluation), a changed buffer judged
    /// after [`RESOLVE_AFTER`], the retention of a resolved or gone finding ending. None:
    /// nothing changes with time alone.
    pub fn next_change(&self, now: u64) -> Option<u64> {
        let retention = self.retention.as_secs();
        let mut next: Option<u64> = None;
        let mut at = |t: u64| next = Some(next.map_or(t, |n| n.min(t)));
        for e in self.entries.values() {
            let shown_gone = e.seen != self.generation;
            if shown_gone && e.resolved_at.is_none() && e.costing.is_some() && e.dir.is_some() {
                // Waiting for a successor.
                at(now);
            }
            if let Some(r) = e.resolved_at {
                at(r.saturating_add(retention).saturating_add(1));
            }
            if e.costing.is_some()
                && e.resolved_at.is_none()
                && let Some((changed, _)) = e.resized
                && now.saturating_sub(changed) <= RESOLVE_AFTER
            {
                at(changed.saturating_add(RESOLVE_AFTER));
            }
        }
        next
    }

    /// Keeps the history within [`MAX_ENTRIES`]: the entries not seen for longest go first.
    fn bound(&mut self) {
        if self.entries.len() <= MAX_ENTRIES {
            return;
        }
        let mut ages: Vec<(u64, Key)> = self
            .entries
            .iter()
            .map(|(k, e)| (e.last_seen, *k))
            .collect();
        ages.sort_unstable();
        let excess = self.entries.len() - MAX_ENTRIES;
        for (_, k) in ages.into_iter().take(excess) {
            self.entries.remove(&k);
        }
    }

    /// First seen and last changed for a per-process finding (keyed by pid and kind).
    pub fn stamp(&mut self, f: &mut Finding, now: u64) {
        let key = (f.process.pid, 0, f.kind);
        let generation = self.generation;
        let e = self.entries.entry(key).or_insert_with(|| Entry {
            program: Arc::default(),
            proto: Proto::Other,
            dir: None,
            first_seen: now,
            last_seen: now,
            seen: 0,
            changed_at: now,
            verdict: None,
            severity: f.severity,
            bytes: 0,
            resized: None,
            costing: None,
            resolved_at: None,
            shown: None,
            before_gone: None,
        });
        if e.severity != f.severity {
            e.severity = f.severity;
            e.changed_at = now;
        }
        e.last_seen = now;
        e.seen = generation;
        f.since = e.first_seen;
        f.changed_at = e.changed_at;
    }

    /// Entries kept (for tests and bounds).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Nothing kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Gone and resolved findings shown per program at most (the newest kept): a program whose
/// short-lived processes each cost once does not flood the list.
pub const MAX_SHOWN_PER_PROGRAM: usize = 16;

/// Entries kept at most (sockets and per-process findings, seen or remembered).
pub const MAX_ENTRIES: usize = 50_000;

/// Keeps at most [`MAX_SHOWN_PER_PROGRAM`] gone or resolved findings per (program, kind),
/// the most recently changed.
fn bound_per_program(fs: &mut Vec<Arc<SocketFinding>>) {
    let key = |f: &Arc<SocketFinding>| {
        let p = &f.scene.process;
        (p.comm.clone(), p.container.clone(), p.pod.clone(), f.kind)
    };
    fs.sort_by(|a, b| {
        let (pa, pb) = (&a.scene.process, &b.scene.process);
        (&pa.comm, &pa.container, &pa.pod, a.kind)
            .cmp(&(&pb.comm, &pb.container, &pb.pod, b.kind))
            .then(b.changed_at.cmp(&a.changed_at))
    });
    let mut n = 0usize;
    let mut last: Option<(String, String, String, &'static str)> = None;
    fs.retain(|f| {
        let k = key(f);
        if last.as_ref() == Some(&k) {
            n += 1;
        } else {
            last = Some(k);
            n = 1;
        }
        n <= MAX_SHOWN_PER_PROGRAM
    });
}

/// A closed socket leaves the setsockopt room at its GC, its drops later (once idle), and its
/// process the store after `--retention`: in between, its finding would be rebuilt from the
/// drops alone — "never sized", no limit, no name — and that is what `gone` and `resolved`
/// would then show. Once a socket's story is known, the finding keeps it (and its process's
/// name), with this evaluation's verdict, severity and drop figures.
fn keep_what_was_known(f: &mut SocketFinding, prev: &SocketFinding) {
    if !f.told() && prev.told() {
        let mut g = prev.clone();
        g.verdict = f.verdict;
        g.severity = f.severity;
        g.since = f.since;
        g.changed_at = f.changed_at;
        if let Some(rate) = f.rate {
            // The drop figures this evaluation shows (a kind judged by its drops).
            let total = match f.drops_shown {
                Some((total, _)) => total,
                None => f.cand.drops.packets as f64,
            };
            g.drops_shown = Some((total, rate));
            g.rate = Some(rate);
        }
        *f = g;
    }
    if f.scene.process.comm.is_empty() && !prev.scene.process.comm.is_empty() {
        Arc::make_mut(&mut f.scene).process = prev.scene.process.clone();
    }
}

/// Turns a costing finding whose socket went away into its `gone` form, with its last
/// numbers (told by [`tell_gone`]).
fn gone(f: &mut SocketFinding, before: &Snapshot, last_seen: u64) {
    f.fate = Some(Fate::Gone(before.clone(), last_seen));
    f.verdict = Verdict::Gone;
    f.severity = Severity::Info;
}

/// Marks `f` resolved (how: [`Settled::Resized`] or [`Fate::Restarted`], told by
/// [`tell_resolved`]).
fn resolve(f: &mut SocketFinding) {
    f.verdict = Verdict::Resolved;
    f.severity = Severity::Info;
}

/// Tells a finding whose socket went away while it cost: its last numbers, then what it was.
pub(super) fn tell_gone(f: &mut Finding, before: &Snapshot, last_seen: u64) {
    f.summary = format!(
        "gone: the socket closed or its process exited while it cost ({} at {:.1} drops/s \
         when last seen, at {last_seen}); no socket of the same program has replaced it yet. \
         Was: {}",
        super::kib(before.bytes as f64),
        before.drops_per_second,
        f.summary
    );
    f.verdict = Some(Verdict::Gone);
    f.severity = Severity::Info;
}

/// Tells a resolved finding: before and after, then what it was.
pub(super) fn tell_resolved(f: &mut Finding, r: Resolution) {
    let how = match r.change.as_str() {
        "restarted" => format!(
            "the program's new socket {} (pid {}) has {} and drops {:.1}/s",
            r.after.inode,
            r.after.pid,
            super::kib(r.after.bytes as f64),
            r.after.drops_per_second
        ),
        _ => format!(
            "the buffer went to {} and the socket has dropped {:.1}/s since",
            super::kib(r.after.bytes as f64),
            r.after.drops_per_second
        ),
    };
    f.summary = format!(
        "resolved: before, {} at {:.1} drops/s; now {how}. Was: {}",
        super::kib(r.before.bytes as f64),
        r.before.drops_per_second,
        f.summary
    );
    f.verdict = Some(Verdict::Resolved);
    f.severity = Severity::Info;
    f.resolved = Some(r);
}
