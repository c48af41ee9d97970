//! The advice cache: the inputs every room hands to the advice rules, and the last
//! evaluation of the rules, reused while nothing they read changed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use foldhash::HashSet;

use crate::advice::{self, Findings, Inputs, LiveSocket};
use crate::attribution::Procfs;
use crate::kernel::BufferLimits;
use crate::labels::Proto;
use crate::signals::{AdviceCx, Signal, Store};
use crate::store::{ProcMeta, ProcRef};

/// How long an evaluation of the advice rules is reused while nothing it reads changed but
/// time, and time changes what it found: drop rates that decay over the window, a program
/// waiting for its costing socket's successor.
pub const FINDINGS_MAX_AGE: Duration = Duration::from_secs(5);

/// How long an evaluation is reused while nothing it reads changed and time alone changes
/// nothing it found before a deadline (a changed buffer judged, a resolved finding's
/// retention): an idle node's 10,000 sockets are not re-evaluated every few seconds for the
/// same findings. A safety net for what no room reports as a change (the host's UDP socket
/// count some fixes quote).
pub const FINDINGS_STEADY_MAX_AGE: Duration = Duration::from_secs(60);

/// The last evaluation of the advice rules and whether it is out of date.
pub struct AdviceCache {
    /// Window over which advice measures rates.
    window: Duration,
    /// The last evaluation: when, and its findings.
    last: Option<(Instant, Arc<Findings>)>,
    /// When the last evaluation is out of date even if nothing it reads changes (see
    /// [`FINDINGS_MAX_AGE`], [`FINDINGS_STEADY_MAX_AGE`]).
    stale_at: Option<Instant>,
    /// Something the rules read changed since `last` was computed.
    dirty: bool,
    /// The findings' past: first seen, changes, resolved ones.
    history: advice::History,
    /// sock_diag sockets for the live sockets of programs whose costing socket is gone.
    diag: crate::kernel::sock_diag::Diag,
    /// How long resolved findings are kept (a new history's, while the real one is out).
    retention: Duration,
    /// An evaluation runs without the lock ([`AdviceCache::plan`]): `history` is its
    /// stand-in until [`AdviceCache::apply`] puts the real one back.
    evaluating: bool,
}

/// One evaluation of the advice rules, taken from the cache under the collector's lock and
/// run without it ([`Evaluation::run`]): with 10,000 sockets that ever dropped it takes a
/// few hundred milliseconds, which no scrape should wait for.
pub struct Evaluation {
    inputs: Inputs,
    history: advice::History,
}

/// What an [`Evaluation`] found, for [`AdviceCache::apply`].
pub struct Evaluated {
    findings: Findings,
    history: advice::History,
    /// Its inputs had rates that time alone changes ([`Inputs::decaying`]).
    decaying: bool,
    /// When it ran (Unix seconds).
    at: u64,
}

impl Evaluation {
    /// Evaluates the rules (no lock needed: everything it reads was copied out).
    pub fn run(mut self) -> Evaluated {
        // A set, not a scan of every tracked process per finding (1,000 × 1,000 per scrape).
        let tracked: HashSet<u32> = self.inputs.meta.keys().map(|p| p.tgid).collect();
        let at = advice::unix_now();
        let mut findings = advice::evaluate_findings(&self.inputs, &mut self.history, at);
        // Gone and resolved findings outlive their process (they say what became of it); the
        // history bounds them.
        findings.retain(|h| tracked.contains(&h.pid) || !h.active());
        Evaluated {
            findings,
            history: self.history,
            decaying: self.inputs.decaying(),
            at,
        }
    }
}

/// What the rules look at, besides the rooms: the store and the sysctl limits.
pub struct Observed<'a> {
    /// The attached rooms.
    pub rooms: &'a [Box<dyn Signal>],
    /// Per-process counters.
    pub store: &'a Store,
    /// `rmem_max`/`wmem_max`/`tcp_rmem` as of the last poll.
    pub limits: BufferLimits,
    /// `/proc`, for the live sockets of programs whose costing socket is gone.
    pub procfs: &'a Procfs,
}

/// Processes whose sockets are looked up per evaluation at most, for programs waiting for a
/// successor of a costing socket.
const LIVE_PROCESSES_MAX: usize = 64;

impl AdviceCache {
    /// Rates measured over `window`; resolved findings kept for `retention`.
    pub fn new(window: Duration, retention: Duration) -> Self {
        Self {
            window,
            last: None,
            stale_at: None,
            dirty: true,
            history: advice::History::new(retention),
            diag: crate::kernel::sock_diag::Diag::new(),
            retention,
            evaluating: false,
        }
    }

    /// Something the rules read changed (a poll that read new counts, an event, GC, new
    /// sysctl limits).
    pub fn dirty(&mut self) {
        self.dirty = true;
    }

    /// The advice rules' view of what was observed: common facts, then each room's part.
    pub fn inputs(&self, o: &Observed<'_>) -> Inputs {
        let meta: BTreeMap<ProcRef, ProcMeta> =
            o.store.procs().map(|(p, s)| (*p, s.meta.clone())).collect();
        let mut inputs = Inputs {
            meta,
            rmem_max: o.limits.rmem_max,
            wmem_max: o.limits.wmem_max,
            tcp_rmem_max: o
                .limits
                .tcp_rmem_max
                .unwrap_or(advice::TCP_RMEM_MAX_DEFAULT),
            tcp_wmem_max: o
                .limits
                .tcp_wmem_max
                .unwrap_or(advice::TCP_WMEM_MAX_DEFAULT),
            udp_sockets: udp_sockets_in_use(),
            window: self.window,
            ..Inputs::default()
        };
        let cx = AdviceCx {
            store: o.store,
            now: Instant::now(),
            window: self.window,
        };
        for s in o.rooms {
            s.advise(&cx, &mut inputs);
        }
        inputs
    }

    /// Findings for tracked processes (those folded or unknown are not actionable), with
    /// their past (first seen, resolved) from the cache's history.
    ///
    /// Evaluating the rules walks every socket that ever dropped (10,000 of them cost more
    /// than the rest of a scrape), so the result is reused until something it depends on
    /// changes ([`AdviceCache::dirty`]) or time alone changes it ([`FINDINGS_MAX_AGE`] while
    /// drop rates decay, a deadline of the findings' history, [`FINDINGS_STEADY_MAX_AGE`]
    /// at most). `min_age`: reuse an evaluation younger than this even if something changed
    /// (the rules measure rates over a minute; scrapes that come in bursts need not each
    /// re-evaluate them).
    pub fn findings(&mut self, min_age: Duration, o: &Observed<'_>) -> Arc<Findings> {
        if let Some(f) = self.reusable(min_age) {
            return f;
        }
        match self.plan(Duration::ZERO, o) {
            Some(job) => self.apply(job.run()),
            // An evaluation runs without the lock and there is none before it: nothing yet.
            None => Arc::default(),
        }
    }

    /// The last evaluation, whatever its age, when there is one; else an evaluation now.
    /// For scrapes: the poll task keeps the findings fresh ([`AdviceCache::plan`] without
    /// the lock, every poll at most), so a scrape never evaluates the rules but the first.
    pub fn latest(&mut self, o: &Observed<'_>) -> Arc<Findings> {
        match &self.last {
            Some((_, f)) => f.clone(),
            None => self.findings(Duration::ZERO, o),
        }
    }

    /// The last evaluation when it may be reused: younger than `min_age`, nothing changed
    /// and not out of date with time alone, or one is running without the lock.
    fn reusable(&self, min_age: Duration) -> Option<Arc<Findings>> {
        let (at, f) = self.last.as_ref()?;
        let now = Instant::now();
        let current = self.stale_at.is_some_and(|t| now < t);
        (self.evaluating || now.duration_since(*at) < min_age || (!self.dirty && current))
            .then(|| f.clone())
    }

    /// When an evaluation made now is out of date with time alone: soon while its rates
    /// decay or a program waits for a successor, at the history's next deadline, else after
    /// [`FINDINGS_STEADY_MAX_AGE`].
    fn stale_after(&self, decaying: bool, at: u64) -> Instant {
        let now = Instant::now();
        if decaying {
            return now + FINDINGS_MAX_AGE;
        }
        let steady = now + FINDINGS_STEADY_MAX_AGE;
        match self.history.next_change(at) {
            // Not sooner than while rates decay.
            Some(t) => {
                steady.min(now + Duration::from_secs(t.saturating_sub(at)).max(FINDINGS_MAX_AGE))
            }
            None => steady,
        }
    }

    /// An evaluation to run without the lock, when one is due (as for
    /// [`AdviceCache::findings`] with `min_age`) and none is running. Until
    /// [`AdviceCache::apply`], the findings are the last evaluation's.
    pub fn plan(&mut self, min_age: Duration, o: &Observed<'_>) -> Option<Evaluation> {
        if self.evaluating || self.reusable(min_age).is_some() {
            return None;
        }
        let mut inputs = self.inputs(o);
        inputs.live = self.live_sockets(o.procfs, &inputs.meta);
        let history = std::mem::replace(&mut self.history, advice::History::new(self.retention));
        self.evaluating = true;
        // What changes from here on makes the next evaluation due.
        self.dirty = false;
        Some(Evaluation { inputs, history })
    }

    /// Whether an evaluation runs without the lock ([`AdviceCache::plan`]).
    pub fn running(&self) -> bool {
        self.evaluating
    }

    /// Files what an [`Evaluation`] found; returns the findings.
    pub fn apply(&mut self, done: Evaluated) -> Arc<Findings> {
        let findings = Arc::new(done.findings);
        drop(self.replace(done.history, findings.clone(), done.decaying, done.at));
        findings
    }

    /// Files an evaluation as [`AdviceCache::apply`] and returns the one it replaces, for
    /// the caller to free after it let go of the collector's lock (10,000 findings take
    /// tens of milliseconds to free).
    pub fn apply_replacing(&mut self, done: Evaluated) -> Option<Arc<Findings>> {
        self.replace(
            done.history,
            Arc::new(done.findings),
            done.decaying,
            done.at,
        )
    }

    fn replace(
        &mut self,
        history: advice::History,
        findings: Arc<Findings>,
        decaying: bool,
        at: u64,
    ) -> Option<Arc<Findings>> {
        self.history = history;
        self.evaluating = false;
        self.stale_at = Some(self.stale_after(decaying, at));
        self.last
            .replace((Instant::now(), findings))
            .map(|(_, old)| old)
    }
}

impl AdviceCache {
    /// The sockets (UDP and TCP, as sock_diag shows them) of the live processes of programs
    /// whose costing socket is gone ([`advice::History::waiting`]): nothing when none waits.
    fn live_sockets(
        &mut self,
        procfs: &Procfs,
        meta: &BTreeMap<ProcRef, ProcMeta>,
    ) -> Vec<LiveSocket> {
        let waiting = self.history.waiting();
        if waiting.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut looked = 0;
        for (p, m) in meta {
            let program = (
                m.comm.clone(),
                m.container.clone(),
                m.pod.clone(),
                m.namespace.clone(),
            );
            let protos: Vec<Proto> = waiting
                .iter()
                .filter(|(w, _)| *w == program)
                .map(|(_, proto)| *proto)
                .collect();
            if protos.is_empty() || procfs.start_ticks(p.tgid) != Some(p.start_ticks) {
                continue;
            }
            looked += 1;
            if looked > LIVE_PROCESSES_MAX {
                break;
            }
            let inodes: foldhash::HashSet<u64> = procfs
                .socket_fds(p.tgid)
                .into_iter()
                .map(|(_, ino)| ino)
                .collect();
            let Some(netns) = procfs.netns(p.tgid) else {
                continue;
            };
            if inodes.is_empty() {
                continue;
            }
            let ns_path = procfs.pid_path(p.tgid, "ns/net");
            for proto in protos {
                let read = match proto {
                    Proto::Udp => self.diag.read_udp(u64::from(netns), &ns_path, &inodes),
                    Proto::Tcp => self.diag.read(u64::from(netns), &ns_path, &inodes),
                    _ => continue,
                };
                match read {
                    Ok(m) => out.extend(m.into_iter().map(|(inode, d)| LiveSocket {
                        owner: *p,
                        inode,
                        proto,
                        rcvbuf: i64::from(d.rcvbuf),
                        sndbuf: i64::from(d.sndbuf),
                        drops: u64::from(d.drops),
                    })),
                    Err(e) => tracing::debug!(pid = p.tgid, error = %e, "live sockets"),
                }
            }
        }
        out
    }
}

/// `UDP: inuse N` of `/proc/net/sockstat` (this namespace).
fn udp_sockets_in_use() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/net/sockstat").ok()?;
    let line = s.lines().find(|l| l.starts_with("UDP: "))?;
    let mut words = line.split_whitespace();
    while let Some(w) = words.next() {
        if w == "inuse" {
            return words.next()?.parse().ok();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::bpf::fake::FakeTable;
    use crate::signals::autotune::Autotune;
    use crate::signals::testkit::{Bench, gone_inode, me, my_proc};
    use bufscope_common::AutotuneVal;

    /// A process whose locked socket had its autotuning suppressed at a high RTT: the
    /// `tcp_autotune_suppressed` finding, on that process only.
    fn locked_socket(b: &mut Bench, kernel: &FakeTable<u64, Vec<AutotuneVal>>) -> Autotune {
        let mut room = Autotune::new(kernel.boxed(), 64);
        b.owners.set(gone_inode(30), me());
        kernel.set(
            gone_inode(30),
            vec![crate::signals::testkit::suppressed_at_190ms()],
        );
        room.poll(&mut b.poll());
        room
    }

    #[test]
    fn findings_are_reused_until_something_changed() {
        let mut b = Bench::new();
        let kernel = FakeTable::new(64);
        let room = locked_socket(&mut b, &kernel);
        let rooms: Vec<Box<dyn Signal>> = vec![Box::new(room)];
        let mut cache = AdviceCache::new(Duration::from_secs(60), Duration::from_secs(1800));
        let o = Observed {
            rooms: &rooms,
            store: &b.store,
            limits: b.limits,
            procfs: b.attr.procfs(),
        };
        let first = cache.findings(Duration::ZERO, &o);
        assert!(first.heads().any(|h| h.pid == my_proc().tgid), "{first:?}");
        let again = cache.findings(Duration::ZERO, &o);
        assert!(Arc::ptr_eq(&first, &again), "nothing changed: reused");
        cache.dirty();
        let young = cache.findings(Duration::from_secs(60), &o);
        assert!(Arc::ptr_eq(&first, &young), "younger than min_age: reused");
        let fresh = cache.findings(Duration::ZERO, &o);
        assert!(!Arc::ptr_eq(&first, &fresh), "changed: evaluated again");
    }

    #[test]
    fn an_evaluation_runs_without_the_cache_and_scrapes_reuse_the_last() {
        let mut b = Bench::new();
        let kernel = FakeTable::new(64);
        let room = locked_socket(&mut b, &kernel);
        let rooms: Vec<Box<dyn Signal>> = vec![Box::new(room)];
        let mut cache = AdviceCache::new(Duration::from_secs(60), Duration::from_secs(1800));
        let o = Observed {
            rooms: &rooms,
            store: &b.store,
            limits: b.limits,
            procfs: b.attr.procfs(),
        };
        let first = cache.latest(&o);
        assert!(
            !first.is_empty(),
            "no evaluation yet: the first scrape evaluates"
        );
        assert_eq!(cache.history.remembered(), first.len());
        cache.dirty();
        assert!(
            Arc::ptr_eq(&first, &cache.latest(&o)),
            "changed since: a scrape still shows the last evaluation"
        );
        let job = cache.plan(Duration::ZERO, &o).unwrap();
        assert_eq!(
            cache.history.remembered(),
            0,
            "the history went with the job"
        );
        assert!(
            cache.plan(Duration::ZERO, &o).is_none(),
            "one evaluation at a time"
        );
        cache.dirty();
        let meanwhile = cache.findings(Duration::ZERO, &o);
        assert!(
            Arc::ptr_eq(&first, &meanwhile),
            "while one runs, the last is reused, not evaluated with an empty history"
        );
        let done = cache.apply(job.run());
        assert!(!Arc::ptr_eq(&first, &done));
        assert_eq!(done.len(), first.len());
        assert_eq!(
            done.render().iter().map(|f| f.since).collect::<Vec<_>>(),
            first.render().iter().map(|f| f.since).collect::<Vec<_>>(),
            "the history came back: first seen kept"
        );
        assert_eq!(cache.history.remembered(), done.len());
        assert!(Arc::ptr_eq(&done, &cache.latest(&o)));
        assert!(
            cache.plan(Duration::ZERO, &o).is_some(),
            "changed while it ran: due again"
        );
    }

    /// With nothing decaying and nothing pending in the history, time alone does not make an
    /// evaluation out of date (an idle node is not re-evaluated every few seconds), up to
    /// FINDINGS_STEADY_MAX_AGE; decaying rates make it out of date after FINDINGS_MAX_AGE.
    #[test]
    fn an_evaluation_is_reused_while_only_time_passes_and_nothing_decays() {
        let mut b = Bench::new();
        let kernel = FakeTable::new(64);
        let room = locked_socket(&mut b, &kernel);
        let rooms: Vec<Box<dyn Signal>> = vec![Box::new(room)];
        let mut cache = AdviceCache::new(Duration::from_secs(60), Duration::from_secs(1800));
        let o = Observed {
            rooms: &rooms,
            store: &b.store,
            limits: b.limits,
            procfs: b.attr.procfs(),
        };
        let first = cache.findings(Duration::ZERO, &o);
        assert!(!first.is_empty());
        let (at, _) = cache.last.as_mut().unwrap();
        *at = at.checked_sub(FINDINGS_MAX_AGE * 6).unwrap();
        assert!(
            Arc::ptr_eq(&first, &cache.findings(Duration::ZERO, &o)),
            "older than FINDINGS_MAX_AGE, nothing decays: reused"
        );
        cache.stale_at = Some(Instant::now());
        assert!(
            !Arc::ptr_eq(&first, &cache.findings(Duration::ZERO, &o)),
            "past FINDINGS_STEADY_MAX_AGE: evaluated again"
        );
        let now = Instant::now();
        let decaying = cache.stale_after(true, advice::unix_now());
        assert!(decaying > now && decaying <= Instant::now() + FINDINGS_MAX_AGE);
        let steady = cache.stale_after(false, advice::unix_now());
        assert!(steady > now + FINDINGS_MAX_AGE);
    }

    #[test]
    fn inputs_carry_the_limits_and_every_rooms_part() {
        let mut b = Bench::new();
        let kernel = FakeTable::new(64);
        let room = locked_socket(&mut b, &kernel);
        let rooms: Vec<Box<dyn Signal>> = vec![Box::new(room)];
        let cache = AdviceCache::new(Duration::from_secs(30), Duration::from_secs(1800));
        let i = cache.inputs(&Observed {
            rooms: &rooms,
            store: &b.store,
            limits: b.limits,
            procfs: b.attr.procfs(),
        });
        assert_eq!(
            (i.rmem_max, i.window),
            (Some(4_194_304), Duration::from_secs(30))
        );
        assert_eq!(i.tunes.len(), 1);
        assert!(i.meta.contains_key(&my_proc()));
    }
}
