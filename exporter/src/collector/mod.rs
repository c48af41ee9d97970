//! The collector: the running rooms and the typed parts that drive them, made by one builder
//! ([`Config::build`]). It names no signal: each one is a [`Signal`] room under
//! [`crate::signals`].
//!
//! | part | module | what |
//! |---|---|---|
//! | [`PollLoop`](poll::PollLoop) | [`poll`] | reads every room's maps (timed), the sysctl limits first |
//! | [`RingDispatch`](ring::RingDispatch) | [`ring`] | ring-buffer records → the room of their kind |
//! | [`AdviceCache`](advice::AdviceCache) | [`advice`] | the rooms' advice inputs, the findings reused while nothing changed |
//! | [`Gc`](gc::Gc) | [`gc`] | exited processes and closed sockets leave; `/proc` read outside the lock |
//! | [`RenderCache`](render::RenderCache) | [`render`] | one body per generation and format, shared by concurrent scrapes |
//! | [`PinnedState`](pinned::PinnedState) | [`pinned`] | `--bpf.pin-path`: `TOTALS` written and restored, pinned links watched |
//! | [`Heartbeat`] | [`heartbeat`] | when the last poll and drain completed, for `/healthz` without the lock |
//! | [`LockStats`](lockstat::LockStats) | [`lockstat`] | how long each holder held the collector's lock ([`lock_as`]) |
//! | [`fresh`], [`background`] | `cycle` | a request's poll; the poll task's poll, GC and owner look-ups, `/proc` passes between two holds |
//!
//! Debug builds also have [`fault`] (the integration tests' wedged or panicking poll).

pub mod advice;
mod cycle;
#[cfg(debug_assertions)]
mod fault;
pub mod gc;
mod heartbeat;
pub mod lockstat;
pub mod pinned;
pub mod poll;
pub mod render;
pub mod ring;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use axum::body::Bytes;

use crate::advice::{Findings, Inputs, Report, Selection};
use crate::attribution::Attributor;
use crate::bpf::ring::RingPositions;
use crate::bpf::{Records, RunStats, Stats};
use crate::exposition::{Format, Health};
use crate::kernel::BufferLimits;
use crate::signals::{PollCx, Signal, Store};

use advice::{AdviceCache, Observed};
pub use advice::{Evaluated, Evaluation};
pub use cycle::{background, fresh, report};
use gc::Gc;
pub use gc::{GcPlan, GcScan, Timing};
pub use heartbeat::Heartbeat;
use lockstat::LockStats;
pub use lockstat::{Held, Holder};
use pinned::{PinnedState, Pins};
use poll::PollLoop;
use render::{Exposed, RenderCache};
use ring::RingDispatch;

/// How often the poll task evaluates the advice rules, at most, while what they read keeps
/// changing (without the collector's lock: [`Collector::advice_plan`]). `/metrics` shows the
/// last evaluation (the `bufscope_finding` gauges); `/api/v1/findings` re-evaluates.
const FINDINGS_EVERY_POLL: Duration = Duration::from_secs(5);

/// Everything a collector is made of, gathered by `bufscope run` (or a test) and built in one
/// call.
pub struct Config {
    /// Per-process counters.
    pub store: Store,
    /// Socket → process.
    pub attr: Attributor,
    /// The attached rooms, in list order.
    pub rooms: Vec<Box<dyn Signal>>,
    /// The probes' `STATS` (None: unreadable; every poll then reads every map).
    pub stats: Option<Stats>,
    /// The event ring buffer (None: nothing to drain).
    pub events: Option<Box<dyn Records>>,
    /// The kernel's positions in that ring buffer (its backlog), when they could be mapped.
    pub ring_positions: Option<RingPositions>,
    /// Health facts known at start (version, kernel, probes, pins).
    pub health: Health,
    /// GC timing.
    pub timing: Timing,
    /// Window over which advice measures rates.
    pub advice_window: Duration,
    /// How long resolved findings are kept (`--advice.resolved-retention`).
    pub advice_retention: Duration,
    /// `--bpf.pin-path`: `TOTALS` and the pinned links.
    pub pins: Option<Pins>,
    /// With adopted pins: when the pinned maps began counting (Unix seconds), the
    /// `_created` of the series read from them.
    pub pinned_since: Option<f64>,
    /// `--bpf.run-stats`: the kernel's run time and count of each probe's programs.
    pub run_stats: Option<RunStats>,
    /// `--web.openmetrics-created`: OpenMetrics counter samples are followed by their
    /// `_created` sample (off: none, and Prometheus 2.x stores no `_created` series).
    pub created_samples: bool,
}

impl Config {
    /// A collector over `store` and `attr` with no room, GC every minute of entries idle
    /// for 30 s, advice over a minute, no pins (the rest is set by the caller).
    pub fn new(store: Store, attr: Attributor) -> Self {
        Self {
            store,
            attr,
            rooms: Vec::new(),
            stats: None,
            events: None,
            ring_positions: None,
            health: Health::default(),
            timing: Timing {
                gc_every: Duration::from_secs(60),
                idle: Duration::from_secs(30),
            },
            advice_window: Duration::from_secs(60),
            advice_retention: crate::advice::history::DEFAULT_RETENTION,
            pins: None,
            pinned_since: None,
            run_stats: None,
            created_samples: false,
        }
    }

    /// The collector.
    pub fn build(self) -> Collector {
        let Self {
            mut store,
            mut attr,
            rooms,
            stats,
            events,
            ring_positions,
            health,
            timing,
            advice_window,
            advice_retention,
            pins,
            pinned_since,
            run_stats,
            created_samples,
        } = self;
        let pinned = PinnedState::new(pins, &mut attr, &mut store);
        let mut render = RenderCache::default();
        render.created_samples = created_samples;
        if let Some(since) = pinned_since {
            let families = rooms
                .iter()
                .flat_map(|s| s.map_counters().iter().copied())
                .collect();
            render.created.pinned_since(since, families);
        }
        Collector {
            store,
            attr,
            health,
            limits: BufferLimits::read(),
            rooms,
            stats,
            poll: PollLoop::default(),
            ring: RingDispatch::new(events, ring_positions),
            advice: AdviceCache::new(advice_window, advice_retention),
            gc: Gc::new(timing),
            render,
            pinned,
            heartbeat: Arc::default(),
            run_stats,
            lock_stats: LockStats::default(),
        }
    }
}

/// The exporter's state: the rooms and the parts that drive them.
pub struct Collector {
    /// Per-process counters.
    pub store: Store,
    /// Socket → process.
    pub attr: Attributor,
    /// Health facts for rendering.
    pub health: Health,
    /// Current `rmem_max`/`wmem_max`/`tcp_rmem`.
    pub limits: BufferLimits,
    rooms: Vec<Box<dyn Signal>>,
    stats: Option<Stats>,
    poll: PollLoop,
    ring: RingDispatch,
    advice: AdviceCache,
    gc: Gc,
    render: RenderCache,
    pinned: PinnedState,
    heartbeat: Arc<Heartbeat>,
    run_stats: Option<RunStats>,
    /// How long each holder held the lock ([`Held`] records into it).
    lock_stats: LockStats,
}

/// The context the rooms read the kernel's records with (field by field: the parts that
/// drive the rooms stay borrowable).
macro_rules! poll_cx {
    ($c:ident) => {
        PollCx {
            attr: &mut $c.attr,
            store: &mut $c.store,
            limits: $c.limits,
            stats: $c.stats.as_ref(),
        }
    };
}

impl Collector {
    /// When the last poll and drain completed (for `/healthz`).
    pub fn heartbeat(&self) -> Arc<Heartbeat> {
        self.heartbeat.clone()
    }

    /// Why probe `name` stopped counting since start (its pinned link was removed or
    /// replaced), if it did.
    pub fn lost_probe(&self, name: &str) -> Option<&str> {
        self.pinned.lost(name)
    }

    /// (probe, run time ns, runs) of each probe, when `--bpf.run-stats` is on (else empty).
    pub fn probe_runs(&self) -> Vec<(&'static str, u64, u64)> {
        self.run_stats
            .as_ref()
            .map(RunStats::read)
            .unwrap_or_default()
    }

    /// Handles every event waiting in the ring buffer; returns how many.
    pub fn drain_events(&mut self) -> usize {
        let n = self.ring.drain(&mut self.rooms, &mut poll_cx!(self));
        if n > 0 {
            self.advice.dirty();
            // Processes whose events showed a new name (an exec): their labels follow.
            self.attr.apply_renames(&mut self.store);
            // Right after the records left the ring buffer: a restart loses none of them.
            self.pinned.flush(&self.store);
            self.render.changed();
        }
        self.heartbeat.drained();
        n
    }

    /// Hands one ring-buffer record to the room that decodes its kind.
    pub fn dispatch(&mut self, bytes: &[u8]) {
        ring::dispatch(&mut self.rooms, bytes, &mut poll_cx!(self));
    }

    /// When the last read of the maps started.
    pub fn last_poll_started(&self) -> Option<std::time::Instant> {
        self.poll.started()
    }

    /// Reads every room's maps into the store (the ring buffer drained first).
    pub fn poll(&mut self) {
        #[cfg(debug_assertions)]
        fault::at_poll(self.heartbeat.since_start());
        self.poll.start();
        self.attr.new_poll();
        self.render.changed();
        if let Some(any) = self.pinned.check_links(&mut self.health) {
            self.heartbeat.set_none_attached(!any);
        }
        self.drain_events();
        let limits = self.poll.limits(BufferLimits::read());
        if limits != self.limits {
            self.advice.dirty();
        }
        self.limits = limits;
        if self.poll.rooms(&mut self.rooms, &mut poll_cx!(self)) {
            self.advice.dirty();
        }
        crate::exposition::sync_late_probes(
            &mut self.health.probes,
            self.rooms.iter().map(|r| (r.name(), r.attached_late())),
        );
        self.pinned.flush(&self.store);
        if let Some(stats) = &self.stats {
            self.health.bpf_lost = stats.lost();
        }
        self.health.rmem_max = self.limits.rmem_max;
        self.health.wmem_max = self.limits.wmem_max;
        self.heartbeat.polled();
    }

    /// Whether GC is due (the poll task runs it, see [`Collector::gc_plan`]).
    pub fn gc_due(&self) -> bool {
        self.gc.due()
    }

    /// The advice rules' view of what was observed: common facts, then each room's part.
    pub fn advice_inputs(&self) -> Inputs {
        self.advice.inputs(&Observed {
            rooms: &self.rooms,
            store: &self.store,
            limits: self.limits,
            procfs: self.attr.procfs(),
        })
    }

    /// Findings for tracked processes, reused while nothing they read changed (see
    /// [`AdviceCache::findings`]).
    pub fn findings(&mut self, min_age: Duration) -> Arc<Findings> {
        let o = Observed {
            rooms: &self.rooms,
            store: &self.store,
            limits: self.limits,
            procfs: self.attr.procfs(),
        };
        self.advice.findings(min_age, &o)
    }

    /// The evaluation of the advice rules to run without the lock, when one is due (the poll
    /// task's, [`background`]): findings are evaluated while nobody reads them too, so a
    /// finding that cost and stopped after a fix is seen resolved (their past lives in the
    /// advice history), and no scrape waits for an evaluation.
    pub fn advice_plan(&mut self) -> Option<Evaluation> {
        let o = Observed {
            rooms: &self.rooms,
            store: &self.store,
            limits: self.limits,
            procfs: self.attr.procfs(),
        };
        self.advice.plan(FINDINGS_EVERY_POLL, &o)
    }

    /// Whether the poll task is evaluating the advice rules without the lock.
    pub fn advice_running(&self) -> bool {
        self.advice.running()
    }

    /// Files what an evaluation run without the lock found; the next scrape shows it.
    /// Returns the evaluation it replaced: drop it after the lock is released (freeing
    /// 10,000 findings under the lock made every scrape behind it wait).
    #[must_use = "free the replaced findings after releasing the lock"]
    pub fn advice_apply(&mut self, done: Evaluated) -> Option<Arc<Findings>> {
        self.render.changed();
        self.advice.apply_replacing(done)
    }

    /// The `/api/v1/findings` document.
    pub fn report(&mut self) -> Report {
        tell(&self.findings(Duration::ZERO), &Selection::default())
    }

    /// Expires exited processes and deletes map entries of closed sockets, all under one
    /// borrow (tests; the exporter splits it so that `/proc` is read without the lock).
    pub fn gc(&mut self) {
        let plan = self.gc_plan();
        let scan = plan.scan();
        self.gc_apply(scan);
    }

    /// What GC must look up in `/proc`: taken under the collector lock, cheap.
    pub fn gc_plan(&mut self) -> GcPlan {
        self.gc.plan(&self.rooms, &self.attr, &self.store)
    }

    /// Applies what [`GcPlan::scan`] found.
    pub fn gc_apply(&mut self, scan: GcScan) {
        self.advice.dirty();
        self.render.changed();
        // Identities not decided yet are decided before any can expire unseen.
        self.admit();
        self.gc
            .apply(scan, &mut self.rooms, &mut self.attr, &mut self.store);
        self.pinned.retain(&self.store);
    }

    /// The exposition in `format`, shared: scrapes that find nothing changed since the last
    /// body in this format was rendered (they queued behind one poll) get that body.
    pub fn render_shared(&mut self, format: Format) -> Bytes {
        self.health.map_entries = self.rooms.iter().filter_map(|s| s.map_fill()).collect();
        self.health.pod_labels_refused = self.attr.pod_labels_refused();
        // The poll task's last evaluation: evaluating 10,000 sockets' findings here made every
        // scrape after a poll hold the lock for a few hundred milliseconds.
        let findings = {
            let o = Observed {
                rooms: &self.rooms,
                store: &self.store,
                limits: self.limits,
                procfs: self.attr.procfs(),
            };
            self.advice.latest(&o)
        };
        let runs = self.probe_runs();
        self.admit();
        let rows = self.store.rows();
        self.lock_stats.roll(std::time::Instant::now());
        let mut own = Vec::new();
        self.lock_stats.families(&mut own);
        self.ring.families(&mut own);
        self.attr.lookup_families(&mut own);
        let e = Exposed {
            rooms: &self.rooms,
            store: &self.store,
            rows: &rows,
            health: &self.health,
            findings: &findings,
            poll_durations: self.poll.durations(),
            probe_runs: &runs,
            collector: own,
            procfs: Some(self.attr.procfs()),
        };
        let used = std::cell::Cell::new(None);
        let body = self.render.shared(format, |created| {
            let (text, n) = render::render_counted(&e, format, created);
            used.set(Some(n));
            text
        });
        if let Some(n) = used.get() {
            self.store.series_used = n;
        }
        body
    }

    /// Decides the identities not decided yet: series of their own while they fit the
    /// budget, else the overflow series ([`Store::admit`]).
    fn admit(&mut self) {
        let rooms = &self.rooms;
        if self.store.admit(|row| render::series_of(rooms, row)) {
            self.render.changed();
        }
    }
}

/// The `/api/v1/findings` document of an evaluation: the findings `sel` asks for, told here
/// where they are served (an evaluation keeps them as numbers), without the collector's lock
/// when the caller let go of it ([`report`]).
fn tell(findings: &Findings, sel: &Selection) -> Report {
    Report {
        version: crate::advice::SCHEMA_VERSION,
        generated_at: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        findings: findings.render_selected(sel),
    }
}

/// Locks the collector shared by the daemon's tasks for an HTTP request ([`lock_as`]).
pub fn lock(c: &Mutex<Collector>) -> Held<'_> {
    lock_as(c, Holder::Request)
}

/// Locks the collector shared by the daemon's tasks; the hold is timed, as `who`'s, when the
/// guard drops (`bufscope_collector_lock_hold_seconds`). A poisoned lock means a thread
/// panicked in the middle of an update (the daemon's panic hook ends the process before that
/// can be seen; this is the second line): the state cannot be trusted, so the process exits
/// for its supervisor to restart it instead of serving errors forever.
pub fn lock_as(c: &Mutex<Collector>, who: Holder) -> Held<'_> {
    let guard: MutexGuard<'_, Collector> = match c.lock() {
        Ok(g) => g,
        Err(_) => {
            tracing::error!("the collector's state was left half-updated by a panic: exiting");
            std::process::abort();
        }
    };
    Held::new(guard, who)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::bpf::fake::{FakeRing, FakeTable};
    use crate::signals::autotune::Autotune;
    use crate::signals::setsockopt::Setsockopt;
    use crate::signals::testkit::{Bench, gone_inode, me, my_proc};
    use bufscope_common::{AutotuneVal, IPPROTO_TCP, SO_RCVBUF, SockoptEvent, event_kind};

    /// A collector whose one room has a socket with its autotuning suppressed at a high RTT
    /// (the `tcp_autotune_suppressed` finding).
    fn with_a_finding() -> (Mutex<Collector>, FakeTable<u64, Vec<AutotuneVal>>) {
        let b = Bench::new();
        let kernel = FakeTable::new(16);
        b.owners.set(gone_inode(60), me());
        kernel.set(
            gone_inode(60),
            vec![crate::signals::testkit::suppressed_at_190ms()],
        );
        let rooms: Vec<Box<dyn Signal>> = vec![Box::new(Autotune::new(kernel.boxed(), 16))];
        let c = Config {
            rooms,
            ..Config::new(b.store, b.attr)
        }
        .build();
        (Mutex::new(c), kernel)
    }

    /// The poll task evaluates the findings without the lock; a scrape meanwhile renders the
    /// last evaluation instead of evaluating (or waiting); `/api/v1/findings` waits for the
    /// running evaluation and evaluates after it.
    #[test]
    fn findings_are_evaluated_off_the_lock_and_scrapes_never_evaluate() {
        let (c, _kernel) = with_a_finding();
        background(&c);
        let first = {
            let mut held = lock(&c);
            let g: &mut Collector = &mut held;
            assert!(!g.advice_running());
            let f = g.advice.latest(&Observed {
                rooms: &g.rooms,
                store: &g.store,
                limits: g.limits,
                procfs: g.attr.procfs(),
            });
            assert!(
                f.heads().any(|h| h.pid == my_proc().tgid),
                "the background cycle evaluated: {f:?}"
            );
            f
        };
        // Due again (something changed, older than FINDINGS_EVERY_POLL): taken off the lock.
        let job = {
            let mut held = lock_as(&c, Holder::Poll);
            let g: &mut Collector = &mut held;
            g.advice.dirty();
            g.advice.plan(
                Duration::ZERO,
                &Observed {
                    rooms: &g.rooms,
                    store: &g.store,
                    limits: g.limits,
                    procfs: g.attr.procfs(),
                },
            )
        }
        .unwrap();
        let body = lock(&c).render_shared(Format::Text);
        let text = String::from_utf8_lossy(&body);
        assert!(
            text.contains("bufscope_finding{") && text.contains("tcp_autotune_suppressed"),
            "the last evaluation rendered while one runs: {text}"
        );
        std::thread::scope(|s| {
            let api = s.spawn(|| report(&c, std::time::Instant::now(), &Selection::default()));
            std::thread::sleep(Duration::from_millis(100));
            assert!(!api.is_finished(), "waits for the running evaluation");
            drop(lock_as(&c, Holder::Poll).advice_apply(job.run()));
            let r = api.join().unwrap();
            let f = r
                .findings
                .iter()
                .find(|f| f.process.pid == my_proc().tgid)
                .unwrap();
            let first = first.render();
            let was = first
                .iter()
                .find(|f| f.process.pid == my_proc().tgid)
                .unwrap();
            assert_eq!(f.since, was.since, "evaluated with the history put back");
        });
    }

    /// A collector built in one call from fakes: a poll drains the ring buffer first, reads
    /// the maps, and every scrape of one generation shares one body.
    #[test]
    fn built_once_polls_drains_and_renders() {
        let b = Bench::new();
        let ring = FakeRing::default();
        let kernel = FakeTable::new(16);
        b.owners.set(gone_inode(50), me());
        kernel.set(
            gone_inode(50),
            vec![AutotuneVal {
                grow_events: 2,
                suppressed: 2,
                ..AutotuneVal::default()
            }],
        );
        let mut c = Config {
            rooms: vec![
                Box::new(Setsockopt::new()),
                Box::new(Autotune::new(kernel.boxed(), 16)),
            ],
            events: Some(Box::new(ring.clone())),
            ..Config::new(b.store, b.attr)
        }
        .build();
        ring.push_pod(&SockoptEvent {
            kind: event_kind::SOCKOPT,
            optname: SO_RCVBUF,
            owner: me(),
            requested: 65536,
            applied: 65536,
            optlen: 4,
            rcvbuf_after: 131_072,
            proto: IPPROTO_TCP,
            ..Default::default()
        });
        let first = c.render_shared(Format::Text);
        c.poll();
        assert!(c.last_poll_started().is_some());
        let s = c.store.get(&my_proc()).unwrap();
        assert_eq!(s.parts.autotune.suppressed, 2);
        assert_eq!(
            s.parts
                .setsockopt
                .calls
                .values()
                .map(|x| x.calls)
                .sum::<u64>(),
            1
        );
        let a = c.render_shared(Format::Text);
        assert_ne!(a.as_ptr(), first.as_ptr(), "a poll renders anew");
        let again = c.render_shared(Format::Text);
        assert_eq!(a.as_ptr(), again.as_ptr(), "the same body, not a copy");
        let text = String::from_utf8_lossy(&a);
        assert!(
            text.contains("bufscope_tcp_autotune_suppressed_total{"),
            "{text}"
        );
        assert!(
            text.contains(r#"bufscope_bpf_map_entries{map="AUTOTUNE"} 1"#),
            "{text}"
        );
        assert!(!c.report().findings.is_empty());
        c.gc();
    }
}
