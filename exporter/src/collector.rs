//! The loop over the signals: `poll` (maps → store), `drain_events` (ring buffer → the room
//! that decodes each record kind), GC (bounded memory, `/proc` read outside the lock),
//! `findings` (advice inputs from every room, evaluated and cached) and `render` (text
//! exposition). It names no signal: each one is a [`Signal`] room under [`crate::signals`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::body::Bytes;

use foldhash::HashSet;
use std::time::{Duration, Instant, SystemTime};

use crate::advice::{self, Finding, Inputs, Report};
use crate::attribution::{Attributor, Procfs};
use crate::bpf::pins::LinkWatch;
use crate::bpf::{Records, RunStats, Stats};
use crate::exposition::{self, Created, Format, Health, selfmetrics};
use crate::kernel::BufferLimits;
use crate::signals::{self, AdviceCx, GcCx, PollCx, ProcStats, Signal, Store};
use crate::store::{ProcMeta, ProcRef, Who};
use crate::totals::Totals;

/// How long a pass over `/proc/*/fd` stays good for GC (see `Collector::gc_plan`).
const LIVE_TTL: Duration = Duration::from_secs(60);

/// How long an evaluation of the advice rules is reused while nothing it reads changed.
const FINDINGS_MAX_AGE: Duration = Duration::from_secs(5);

/// How long `/metrics` reuses an evaluation of the advice rules (the `bufscope_finding`
/// gauges) even when something changed; `/api/v1/findings` always re-evaluates.
const FINDINGS_MIN_AGE_SCRAPE: Duration = Duration::from_secs(1);

/// Timing knobs.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// How often maps are garbage-collected.
    pub gc_every: Duration,
    /// How long a map entry must be idle before it may be collected.
    pub idle: Duration,
}

/// The exporter's state.
pub struct Collector {
    /// Per-process counters.
    pub store: Store,
    /// Socket → process.
    pub attr: Attributor,
    /// The attached signals' rooms.
    signals: Vec<Box<dyn Signal>>,
    stats: Option<Stats>,
    /// Health facts for rendering.
    pub health: Health,
    /// Current `rmem_max`/`wmem_max`/`tcp_rmem`.
    pub limits: BufferLimits,
    timing: Timing,
    last_gc: Instant,
    /// Socket inodes held by any process, from the last pass over `/proc/*/fd`.
    live: Option<(Instant, HashSet<u64>)>,
    last_poll: Option<Instant>,
    /// Window over which advice measures rates.
    pub advice_window: Duration,
    /// The probes' event ring buffer, drained on every poll (so a scrape sees every event
    /// committed before it) and by the event task when the kernel signals it.
    events: Option<Box<dyn Records>>,
    warned_limits: bool,
    /// Created times of the counter series (OpenMetrics `_created`).
    created: Created,
    /// The last evaluation of the advice rules (see [`Collector::findings`]).
    findings_cache: Option<(Instant, Arc<Vec<Finding>>)>,
    /// Something the advice rules read changed since `findings_cache` was computed.
    advice_dirty: bool,
    /// With `--bpf.pin-path`: the pinned `TOTALS`, where the counters built from events are
    /// kept for the next bufscope ([`crate::totals`]).
    totals: Option<Totals>,
    /// How long each signal's last poll took.
    poll_durations: Vec<(&'static str, Duration)>,
    /// `--bpf.run-stats`: the kernel's run time and count of each probe's programs.
    run_stats: Option<RunStats>,
    /// With `--bpf.pin-path`: the pinned links, and when they were last checked.
    links: Option<(LinkWatch, Instant)>,
    /// Probes whose pinned link was removed or replaced since start, with why.
    lost: BTreeMap<&'static str, String>,
    /// When the last poll and drain completed, for `/healthz` (read without the lock).
    heartbeat: Arc<Heartbeat>,
    /// Bumped by everything that changes what [`Collector::render`] shows (a poll, a drain
    /// that read events, GC): concurrent scrapes of one generation share one body.
    generation: u64,
    /// The last body rendered: its generation, format and text.
    rendered: Option<(u64, Format, Bytes)>,
}

/// When the collector last completed a poll of the maps and a drain of the ring buffer,
/// readable without the collector's lock: `/healthz` must answer while a stuck collector
/// holds it.
#[derive(Debug)]
pub struct Heartbeat {
    start: Instant,
    /// Milliseconds after `start` when the last poll completed (0: none yet).
    poll_ms: AtomicU64,
    /// Likewise for the last drain of the ring buffer (every poll drains too).
    drain_ms: AtomicU64,
    /// Every probe that was attached lost its pinned link since.
    none_attached: AtomicBool,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            poll_ms: AtomicU64::new(0),
            drain_ms: AtomicU64::new(0),
            none_attached: AtomicBool::new(false),
        }
    }
}

impl Heartbeat {
    fn beat(&self, which: &AtomicU64) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        which.store(ms.max(1), Ordering::Relaxed);
    }

    /// Whether every probe that attached has since lost its pinned link.
    pub fn none_attached(&self) -> bool {
        self.none_attached.load(Ordering::Relaxed)
    }

    /// Why the collector looks stuck: its last completed poll or drain (or its start, before
    /// the first) is more than `stale` ago. None while both are fresh.
    pub fn stale(&self, stale: Duration) -> Option<String> {
        let now = self.start.elapsed();
        [
            ("poll of the probes' maps", &self.poll_ms),
            ("drain of the event ring buffer", &self.drain_ms),
        ]
        .into_iter()
        .find_map(|(what, at)| {
            let ago = now.saturating_sub(Duration::from_millis(at.load(Ordering::Relaxed)));
            (ago > stale).then(|| {
                format!(
                    "the last successful {what} {} {:.1}s ago (more than {:.0}s): the collector \
                     is stuck",
                    if at.load(Ordering::Relaxed) == 0 {
                        "was never; bufscope started"
                    } else {
                        "ended"
                    },
                    ago.as_secs_f64(),
                    stale.as_secs_f64()
                )
            })
        })
    }
}

/// Fault injection for the integration tests, compiled into debug builds only (release
/// builds have none): `BUFSCOPE_DEBUG_FAULT=wedge-poll:SECS` makes the first poll that starts
/// SECS after start-up hang forever holding the collector's lock (as a hung `/proc` read or a
/// deadlock would); `panic-poll:SECS` makes it panic.
#[cfg(debug_assertions)]
fn debug_fault(since_start: Duration) {
    static FAULT: std::sync::OnceLock<Option<(String, Duration)>> = std::sync::OnceLock::new();
    let fault = FAULT.get_or_init(|| {
        let v = std::env::var("BUFSCOPE_DEBUG_FAULT").ok()?;
        let (kind, secs) = v.split_once(':')?;
        Some((kind.to_string(), Duration::from_secs(secs.parse().ok()?)))
    });
    match fault {
        Some((kind, after)) if since_start >= *after => match kind.as_str() {
            "wedge-poll" => {
                tracing::warn!("BUFSCOPE_DEBUG_FAULT: this poll never returns");
                loop {
                    std::thread::sleep(Duration::from_secs(3600));
                }
            }
            "panic-poll" => std::panic::panic_any("BUFSCOPE_DEBUG_FAULT: a panic in a poll"),
            _ => {}
        },
        _ => {}
    }
}

/// How often the pinned links are checked to still be this bufscope's.
const LINK_CHECK_EVERY: Duration = Duration::from_secs(1);

impl Collector {
    /// Assembles a collector.
    pub fn new(
        store: Store,
        attr: Attributor,
        signals: Vec<Box<dyn Signal>>,
        stats: Option<Stats>,
        health: Health,
        timing: Timing,
    ) -> Self {
        Self {
            store,
            attr,
            signals,
            stats,
            health,
            limits: BufferLimits::read(),
            timing,
            last_gc: Instant::now(),
            live: None,
            last_poll: None,
            advice_window: Duration::from_secs(60),
            warned_limits: false,
            created: Created::default(),
            events: None,
            findings_cache: None,
            advice_dirty: true,
            totals: None,
            poll_durations: Vec::new(),
            run_stats: None,
            links: None,
            lost: BTreeMap::new(),
            heartbeat: Arc::default(),
            generation: 0,
            rendered: None,
        }
    }

    /// With `--bpf.pin-path`: keeps the counters built from events in the pinned `TOTALS`
    /// from now on; `adopted` (the maps come from an earlier bufscope): first gives each
    /// live process the counts kept there (the same pid and start time; the entries of
    /// processes gone meanwhile are deleted).
    pub fn set_totals(&mut self, mut totals: Totals, adopted: bool) {
        if adopted {
            let mut restored = 0usize;
            for (p, kept) in totals.read() {
                if !self.attr.alive(&p) || self.attr.proc_from_pid(p.tgid) != Some(p) {
                    continue;
                }
                let attr = &self.attr;
                let s = self.store.proc_mut(Who::Proc(p), || attr.meta(&p));
                for t in &kept {
                    s.parts.restore(t);
                }
                restored += 1;
            }
            tracing::info!(
                processes = restored,
                "event-built counters (setsockopt, TCP) go on from the pinned TOTALS"
            );
        }
        let store = &self.store;
        totals.retain(|p| store.get(p).is_some());
        self.totals = Some(totals);
    }

    /// Writes the counters built from events of the processes that counted since the last
    /// write to the pinned `TOTALS` (nothing without `--bpf.pin-path`).
    fn flush_totals(&mut self) {
        let Some(t) = &mut self.totals else {
            return;
        };
        let now = Instant::now();
        let since = t.since();
        let changed = self
            .store
            .procs()
            .filter(|(_, s)| since.is_none_or(|at| s.last_active >= at))
            .map(|(p, s)| (*p, s.parts.totals()));
        t.flush(changed, now);
    }

    /// When the last poll and drain completed (for `/healthz`).
    pub fn heartbeat(&self) -> Arc<Heartbeat> {
        self.heartbeat.clone()
    }

    /// With `--bpf.pin-path`: the pinned links to check on every poll ([`LinkWatch`]); a probe
    /// that lost one is reported detached from then on.
    pub fn watch_links(&mut self, links: LinkWatch) {
        self.links = Some((links, Instant::now()));
    }

    /// Checks the pinned links (at most every [`LINK_CHECK_EVERY`]): a probe whose link is
    /// gone or replaced no longer counts, so `bufscope_probe_attached` says 0 and the log why.
    fn check_links(&mut self) {
        let Some((watch, at)) = self.links.as_mut() else {
            return;
        };
        if at.elapsed() < LINK_CHECK_EVERY {
            return;
        }
        *at = Instant::now();
        let lost = watch.check();
        if lost.is_empty() {
            return;
        }
        for (probe, why) in lost {
            tracing::warn!(
                probe,
                "probe detached: {why}; it no longer counts (restart bufscope to attach it again)"
            );
            for p in self.health.probes.iter_mut().filter(|p| p.0 == probe) {
                p.2 = false;
            }
            self.lost.insert(probe, why);
        }
        let attached = self.health.probes.iter().any(|p| p.2);
        self.heartbeat
            .none_attached
            .store(!attached, Ordering::Relaxed);
    }

    /// Why probe `name` stopped counting since start (its pinned link was removed or
    /// replaced), if it did.
    pub fn lost_probe(&self, name: &str) -> Option<&str> {
        self.lost.get(name).map(String::as_str)
    }

    /// With adopted pins (counting went on since `since`, Unix seconds): the series read from
    /// the pinned maps get their `_created` from then, not from this start.
    pub fn pinned_since(&mut self, since: f64) {
        let families = self
            .signals
            .iter()
            .flat_map(|s| s.map_counters().iter().copied())
            .collect();
        self.created.pinned_since(since, families);
    }

    /// `--bpf.run-stats`: reads the probes' run time from `r`.
    pub fn set_run_stats(&mut self, r: RunStats) {
        self.run_stats = Some(r);
    }

    /// (probe, run time ns, runs) of each probe, when `--bpf.run-stats` is on (else empty).
    pub fn probe_runs(&self) -> Vec<(&'static str, u64, u64)> {
        self.run_stats
            .as_ref()
            .map(RunStats::read)
            .unwrap_or_default()
    }

    /// Hands the event ring buffer to the collector.
    pub fn set_events(&mut self, rb: Box<dyn Records>) {
        self.events = Some(rb);
    }

    /// Handles every event waiting in the ring buffer; returns how many.
    pub fn drain_events(&mut self) -> usize {
        let Some(mut rb) = self.events.take() else {
            return 0;
        };
        let n = rb.drain(&mut |record| self.dispatch(record));
        self.events = Some(rb);
        if n > 0 {
            self.advice_dirty = true;
            // Processes whose events showed a new name (an exec): their labels follow.
            self.attr.apply_renames(&mut self.store);
            // Right after the records left the ring buffer: a restart loses none of them.
            self.flush_totals();
            self.generation += 1;
        }
        self.heartbeat.beat(&self.heartbeat.drain_ms);
        n
    }

    /// Hands one ring-buffer record to the room that decodes its kind.
    pub fn dispatch(&mut self, bytes: &[u8]) {
        let Some(kind) = bytes
            .get(..4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        else {
            return;
        };
        let mut cx = PollCx {
            attr: &mut self.attr,
            store: &mut self.store,
            limits: self.limits,
            stats: self.stats.as_ref(),
        };
        match self
            .signals
            .iter_mut()
            .find(|s| s.event_kinds().contains(&kind))
        {
            Some(s) => s.on_event(kind, bytes, &mut cx),
            None => tracing::debug!("unknown event kind {kind}"),
        }
    }

    /// When the last read of the maps started.
    pub fn last_poll_started(&self) -> Option<Instant> {
        self.last_poll
    }

    /// Reads every room's maps into the store.
    pub fn poll(&mut self) {
        #[cfg(debug_assertions)]
        debug_fault(self.heartbeat.start.elapsed());
        self.last_poll = Some(Instant::now());
        self.generation += 1;
        self.check_links();
        self.drain_events();
        let limits = BufferLimits::read();
        if limits.rmem_max.is_none() && !self.warned_limits {
            self.warned_limits = true;
            tracing::warn!(
                "cannot read net.core.rmem_max/wmem_max from this network namespace (kernels before \
                 6.11 hide them in containers): clamp advice will say \"unknown\"; run with \
                 hostNetwork to see them"
            );
        }
        if limits != self.limits {
            self.advice_dirty = true;
        }
        self.limits = limits;
        let mut cx = PollCx {
            attr: &mut self.attr,
            store: &mut self.store,
            limits,
            stats: self.stats.as_ref(),
        };
        self.poll_durations.clear();
        for s in &mut self.signals {
            let started = Instant::now();
            if s.poll(&mut cx) {
                self.advice_dirty = true;
            }
            self.poll_durations.push((s.name(), started.elapsed()));
        }
        self.flush_totals();
        if let Some(stats) = &self.stats {
            self.health.bpf_lost = stats.lost();
        }
        self.health.rmem_max = self.limits.rmem_max;
        self.health.wmem_max = self.limits.wmem_max;
        self.heartbeat.beat(&self.heartbeat.poll_ms);
    }

    /// Whether GC is due (the poll task runs it, see [`Collector::gc_plan`]).
    pub fn gc_due(&self) -> bool {
        self.last_gc.elapsed() >= self.timing.gc_every
    }

    /// The advice rules' view of what was observed: common facts, then each room's part.
    pub fn advice_inputs(&self) -> Inputs {
        let meta: BTreeMap<ProcRef, ProcMeta> = self
            .store
            .procs()
            .map(|(p, s)| (*p, s.meta.clone()))
            .collect();
        let mut inputs = Inputs {
            meta,
            rmem_max: self.limits.rmem_max,
            wmem_max: self.limits.wmem_max,
            tcp_rmem_max: self
                .limits
                .tcp_rmem_max
                .unwrap_or(advice::TCP_RMEM_MAX_DEFAULT),
            window: self.advice_window,
            ..Inputs::default()
        };
        let cx = AdviceCx {
            store: &self.store,
            now: Instant::now(),
            window: self.advice_window,
        };
        for s in &self.signals {
            s.advise(&cx, &mut inputs);
        }
        inputs
    }

    /// Findings for tracked processes (those folded or unknown are not actionable).
    ///
    /// Evaluating the rules walks every socket that ever dropped (10,000 of them cost more
    /// than the rest of a scrape), so the result is reused until something it depends on
    /// changes (a poll that read new counts, an event, GC, new sysctl limits) or
    /// [`FINDINGS_MAX_AGE`] passes (drop rates decay with time alone). `min_age`: reuse an
    /// evaluation younger than this even if something changed (the rules measure rates over
    /// a minute; scrapes that come in bursts need not each re-evaluate them).
    pub fn findings(&mut self, min_age: Duration) -> Arc<Vec<Finding>> {
        if let Some((at, f)) = &self.findings_cache {
            let age = at.elapsed();
            if age < min_age || (!self.advice_dirty && age < FINDINGS_MAX_AGE) {
                return f.clone();
            }
        }
        let inputs = self.advice_inputs();
        // A set, not a scan of every tracked process per finding (1,000 × 1,000 per scrape).
        let tracked: HashSet<u32> = inputs.meta.keys().map(|p| p.tgid).collect();
        let findings: Arc<Vec<Finding>> = Arc::new(
            advice::evaluate(&inputs)
                .into_iter()
                .filter(|f| tracked.contains(&f.process.pid))
                .collect(),
        );
        self.findings_cache = Some((Instant::now(), findings.clone()));
        self.advice_dirty = false;
        findings
    }

    /// The `/api/v1/findings` document.
    pub fn report(&mut self) -> Report {
        Report {
            version: advice::SCHEMA_VERSION,
            generated_at: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            findings: self.findings(Duration::ZERO).as_ref().clone(),
        }
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
        self.last_gc = Instant::now();
        let idle = self.timing.idle;
        let candidates: Vec<u64> = self
            .signals
            .iter()
            .flat_map(|s| s.gc_candidates(idle))
            .collect();
        // A pass over every `/proc/<pid>/fd` is the expensive part of GC (≈13,000 readlinks
        // with 1,000 processes holding 10,000 sockets), so the last pass is reused for up to
        // LIVE_TTL while every GC candidate (an idle map entry) was live in it: a closed
        // socket's entry then goes at most that much later.
        let reuse = self.live.as_ref().is_some_and(|(at, live)| {
            at.elapsed() < LIVE_TTL && candidates.iter().all(|i| live.contains(i))
        });
        GcPlan {
            procfs: self.attr.procfs().clone(),
            procs: self.store.tracked(),
            scan_sockets: !reuse,
        }
    }

    /// Applies what [`GcPlan::scan`] found.
    pub fn gc_apply(&mut self, scan: GcScan) {
        self.advice_dirty = true;
        self.generation += 1;
        let dead: HashSet<ProcRef> = scan.dead.into_iter().collect();
        self.store.expire(|p| !dead.contains(p));
        if let Some(live) = scan.live {
            self.live = Some((scan.at, live));
        }
        let empty = HashSet::default();
        let live = self.live.as_ref().map_or(&empty, |(_, l)| l);
        let mut cx = GcCx {
            live,
            idle: self.timing.idle,
            retention: self.store.retention(),
            attr: &mut self.attr,
            store: &self.store,
        };
        let mut removed = 0;
        let mut referenced = HashSet::default();
        for s in &mut self.signals {
            removed += s.gc(&mut cx);
            s.referenced(&mut referenced);
        }
        let store = &self.store;
        self.attr
            .retain_procs(|p| store.get(p).is_some() || referenced.contains(p));
        if let Some(t) = &mut self.totals {
            t.retain(|p| store.get(p).is_some());
        }
        if removed > 0 {
            tracing::debug!(removed, "garbage-collected map entries of closed sockets");
        }
    }

    /// [`Collector::render`], shared: scrapes that find nothing changed since the last body in
    /// this format was rendered (they queued behind one poll) get that body, not a new one.
    pub fn render_shared(&mut self, format: Format) -> Bytes {
        if let Some((generation, f, body)) = &self.rendered
            && *generation == self.generation
            && *f == format
        {
            return body.clone();
        }
        let body = Bytes::from(self.render(format));
        self.rendered = Some((self.generation, format, body.clone()));
        body
    }

    /// The exposition in `format`. Every sample is the counter's current value for every
    /// client: nothing depends on who scraped before. OpenMetrics adds each counter's
    /// `_created` time ([`Created`]).
    pub fn render(&mut self, format: Format) -> String {
        self.health.map_entries = self
            .signals
            .iter()
            .filter_map(|s| s.map_fill())
            .map(|m| (m.map, m.entries, m.max_entries))
            .collect();
        let findings = self.findings(FINDINGS_MIN_AGE_SCRAPE);
        let procs: Vec<(String, &ProcStats)> = self.store.iter().collect();
        let mut fams = signals::families(&self.signals, &procs);
        drop(procs);
        selfmetrics::families(
            &self.store,
            &self.health,
            findings.as_slice(),
            signals::attributed(),
            &mut fams,
        );
        exposition::process::families(
            exposition::process::read_self().as_ref(),
            &self.poll_durations,
            &self.probe_runs(),
            &mut fams,
        );
        match format {
            Format::Text => exposition::encode(&fams).unwrap_or_else(|e| {
                tracing::error!("encoding metrics: {e}");
                String::new()
            }),
            Format::OpenMetrics { .. } => {
                let created = exposition::created_times(&mut self.created, &self.store, &fams);
                exposition::encode_openmetrics(&fams, &created)
            }
        }
    }
}

/// Locks the collector shared by the daemon's tasks. A poisoned lock means a thread panicked
/// in the middle of an update (the daemon's panic hook ends the process before that can be
/// seen; this is the second line): the state cannot be trusted, so the process exits for its
/// supervisor to restart it instead of serving errors forever.
pub fn lock(c: &Mutex<Collector>) -> MutexGuard<'_, Collector> {
    match c.lock() {
        Ok(g) => g,
        Err(_) => {
            tracing::error!("the collector's state was left half-updated by a panic: exiting");
            std::process::abort();
        }
    }
}

/// The `/proc` lookups one GC pass needs (see [`Collector::gc_plan`]).
pub struct GcPlan {
    procfs: Procfs,
    procs: Vec<ProcRef>,
    scan_sockets: bool,
}

/// What [`GcPlan::scan`] found.
pub struct GcScan {
    dead: Vec<ProcRef>,
    live: Option<HashSet<u64>>,
    at: Instant,
}

impl GcPlan {
    /// Reads `/proc` (no collector state involved: run it without the lock, so scrapes are
    /// not held up by thousands of readlinks).
    pub fn scan(self) -> GcScan {
        let at = Instant::now();
        let dead = self
            .procs
            .into_iter()
            // Gone, or its pid now belongs to another process (a different start time).
            .filter(|p| self.procfs.start_ticks(p.tgid) != Some(p.start_ticks))
            .collect();
        let live = self
            .scan_sockets
            .then(|| self.procfs.all_socket_holders().into_keys().collect());
        GcScan { dead, live, at }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collector() -> Collector {
        Collector::new(
            Store::new(10, Duration::from_secs(300)),
            Attributor::new(Procfs::new(std::path::Path::new("/proc")), None),
            Vec::new(),
            None,
            Health::default(),
            Timing {
                gc_every: Duration::from_secs(60),
                idle: Duration::from_secs(30),
            },
        )
    }

    #[test]
    fn scrapes_of_one_generation_share_one_body() {
        let mut c = collector();
        let a = c.render_shared(Format::Text);
        let b = c.render_shared(Format::Text);
        assert_eq!(a.as_ptr(), b.as_ptr(), "the same body, not a copy");
        let om = c.render_shared(Format::OpenMetrics { v1: true });
        assert_ne!(om.as_ptr(), a.as_ptr(), "another format is rendered");
        c.poll();
        let after = c.render_shared(Format::Text);
        assert_ne!(after.as_ptr(), a.as_ptr(), "a poll renders anew");
    }

    #[test]
    fn heartbeat_names_what_stopped() {
        let c = collector();
        let h = c.heartbeat();
        assert_eq!(h.stale(Duration::from_secs(10)), None, "fresh at start");
        std::thread::sleep(Duration::from_millis(20));
        let why = h.stale(Duration::from_millis(10)).unwrap_or_default();
        assert!(why.contains("poll") && why.contains("was never"), "{why}");
        h.beat(&h.poll_ms);
        let why = h.stale(Duration::from_millis(10)).unwrap_or_default();
        assert!(why.contains("drain of the event ring buffer"), "{why}");
    }
}
