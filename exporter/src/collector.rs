//! Ties the probes' maps, attribution and the store together: `poll` (maps → store),
//! `handle_event` (ring buffer → store), `gc` (bounded memory) and `render` (text exposition).

use std::collections::BTreeMap;
use std::sync::Arc;

use foldhash::{HashMap, HashMapExt as _, HashSet, HashSetExt as _};
use std::time::{Duration, Instant, SystemTime};

use aya::maps::{MapData, PerCpuArray, RingBuf};
use bufscope_common::{EstablishedEvent, SockoptEvent, event_kind, stat};

use crate::advice::{self, Finding, Inputs, Report, SocketDrops, SocketOpt, TcpShape, TuneView};
use crate::attribution::Attributor;
use crate::kernel::BufferLimits;
use crate::metrics::{self, Health};
use crate::signals::{autotune::Autotune, drops::Drops, sockopt, tcp};
use crate::store::{BufOption, ProcMeta, ProcRef, Proto, Store, Who};

/// How long a pass over `/proc/*/fd` stays good for GC (see `Collector::gc_plan`).
const LIVE_TTL: Duration = Duration::from_secs(60);

/// How long an evaluation of the advice rules is reused while nothing it reads changed.
const FINDINGS_MAX_AGE: Duration = Duration::from_secs(5);

/// How long `/metrics` reuses an evaluation of the advice rules (the `bufscope_finding`
/// gauges) even when something changed; `/api/v1/findings` always re-evaluates.
const FINDINGS_MIN_AGE_SCRAPE: Duration = Duration::from_secs(1);

/// Most per-socket setsockopt notes kept for advice (oldest dropped first).
const MAX_NOTES: usize = 20_000;

/// Names of the `STATS` slots, in [`stat`] order, as the `cause` label says them.
const STAT_NAMES: [(u32, &str); 6] = [
    (stat::DROPS_MAP_FULL, "drops_map_full"),
    (stat::AUTOTUNE_MAP_FULL, "autotune_map_full"),
    (stat::RINGBUF_FULL, "ringbuf_full"),
    (stat::OWNERS_FULL, "owners_map_full"),
    (stat::FD_WALK_FAILED, "fd_walk_failed"),
    (stat::PENDING_FULL, "pending_map_full"),
];

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
    /// Drops signal (None when its probe is off).
    pub drops: Option<Drops>,
    /// Autotune signal (None when its probe is off).
    pub autotune: Option<Autotune>,
    stats: Option<PerCpuArray<MapData, u64>>,
    /// Health facts for rendering.
    pub health: Health,
    /// Current `rmem_max`/`wmem_max`.
    pub limits: BufferLimits,
    timing: Timing,
    last_gc: Instant,
    /// Socket inodes held by any process, from the last pass over `/proc/*/fd`.
    live: Option<(Instant, HashSet<u64>)>,
    last_poll: Option<Instant>,
    /// Last setsockopt per (socket, option), for advice.
    notes: HashMap<(u64, BufOption), SocketOpt>,
    /// Last shrunk connection per process: (actual, expected) scale.
    wscale_examples: HashMap<ProcRef, (u8, u8)>,
    /// Window over which advice measures rates.
    pub advice_window: Duration,
    /// The probes' event ring buffer, drained on every poll (so a scrape sees every event
    /// committed before it) and by the event task when the kernel signals it.
    events: Option<RingBuf<MapData>>,
    warned_limits: bool,
    /// Counter series already exposed at least once (see `zero_new_counters`).
    exposed: HashSet<String>,
    /// The last evaluation of the advice rules (see [`Collector::findings`]).
    findings_cache: Option<(Instant, Arc<Vec<Finding>>)>,
    /// Something the advice rules read changed since `findings_cache` was computed.
    advice_dirty: bool,
    /// `STATS` generations and limits the last poll saw (to tell whether it changed anything).
    last_seen: (Option<u64>, Option<u64>, BufferLimits),
}

impl Collector {
    /// Assembles a collector.
    pub fn new(
        store: Store,
        attr: Attributor,
        drops: Option<Drops>,
        autotune: Option<Autotune>,
        stats: Option<PerCpuArray<MapData, u64>>,
        health: Health,
        timing: Timing,
    ) -> Self {
        Self {
            store,
            attr,
            drops,
            autotune,
            stats,
            health,
            limits: BufferLimits::read(),
            timing,
            last_gc: Instant::now(),
            live: None,
            last_poll: None,
            notes: HashMap::new(),
            wscale_examples: HashMap::new(),
            advice_window: Duration::from_secs(60),
            warned_limits: false,
            exposed: HashSet::new(),
            events: None,
            findings_cache: None,
            advice_dirty: true,
            last_seen: (None, None, BufferLimits::default()),
        }
    }

    /// Hands the event ring buffer to the collector.
    pub fn set_events(&mut self, rb: RingBuf<MapData>) {
        self.events = Some(rb);
    }

    /// Handles every event waiting in the ring buffer; returns how many.
    pub fn drain_events(&mut self) -> usize {
        let Some(mut rb) = self.events.take() else {
            return 0;
        };
        let mut n = 0;
        while let Some(item) = rb.next() {
            self.handle_event(&item);
            n += 1;
        }
        self.events = Some(rb);
        if n > 0 {
            self.advice_dirty = true;
        }
        n
    }

    /// When the last read of the maps started.
    pub fn last_poll_started(&self) -> Option<Instant> {
        self.last_poll
    }

    /// Reads every map into the store.
    pub fn poll(&mut self) {
        self.last_poll = Some(Instant::now());
        self.drain_events();
        self.limits = BufferLimits::read();
        if self.limits.rmem_max.is_none() && !self.warned_limits {
            self.warned_limits = true;
            tracing::warn!(
                "cannot read net.core.rmem_max/wmem_max from this network namespace (kernels before \
                 6.11 hide them in containers): clamp advice will say \"unknown\"; run with \
                 hostNetwork to see them"
            );
        }
        // Read before the maps: a count that lands meanwhile moves them for the next poll.
        let drops_gen = self.stat_total(stat::DROPS_SEEN);
        let autotune_gen = self.stat_total(stat::AUTOTUNE_SEEN);
        let seen = (drops_gen, autotune_gen, self.limits);
        let pending = self.drops.as_ref().is_some_and(|d| d.pending());
        if seen != self.last_seen || drops_gen.is_none() || autotune_gen.is_none() || pending {
            self.advice_dirty = true;
        }
        self.last_seen = seen;
        if let Some(d) = self.drops.as_mut() {
            d.poll_if_changed(drops_gen, &mut self.attr, &mut self.store);
        }
        if let Some(a) = self.autotune.as_mut() {
            a.poll_if_changed(autotune_gen, &mut self.attr, &mut self.store);
        }
        self.read_stats();
    }

    /// Whether GC is due (the poll task runs it, see [`Collector::gc_plan`]).
    pub fn gc_due(&self) -> bool {
        self.last_gc.elapsed() >= self.timing.gc_every
    }

    /// One `STATS` slot summed over CPUs (None when the map cannot be read).
    fn stat_total(&self, idx: u32) -> Option<u64> {
        let vals = self.stats.as_ref()?.get(&idx, 0).ok()?;
        Some(vals.iter().sum())
    }

    fn read_stats(&mut self) {
        let Some(stats) = self.stats.as_ref() else {
            return;
        };
        self.health.bpf_lost = STAT_NAMES
            .iter()
            .map(|(idx, name)| {
                let v = stats
                    .get(idx, 0)
                    .map(|vals| vals.iter().sum::<u64>())
                    .unwrap_or(0);
                (*name, v)
            })
            .collect();
        self.health.rmem_max = self.limits.rmem_max;
        self.health.wmem_max = self.limits.wmem_max;
    }

    /// Handles one ring-buffer record.
    pub fn handle_event(&mut self, bytes: &[u8]) {
        let Some(kind) = bytes
            .get(..4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        else {
            return;
        };
        match kind {
            event_kind::SOCKOPT => {
                if let Some(ev) = read::<SockoptEvent>(bytes)
                    && let Some(Who::Proc(p)) =
                        sockopt::handle(&ev, &mut self.attr, &mut self.store)
                {
                    self.note_sockopt(&ev, p);
                }
            }
            event_kind::ESTABLISHED => {
                if let Some(ev) = read::<EstablishedEvent>(bytes) {
                    // Unknown rmem_max: judge by tcp_rmem[2] alone (never a false "shrunk").
                    let rmem_max = self.limits.rmem_max.unwrap_or(0);
                    let who = tcp::handle(&ev, rmem_max, &mut self.attr, &mut self.store);
                    if let (Who::Proc(p), true) = (who, tcp::shrunk(&ev, rmem_max)) {
                        let expected = tcp::expected_wscale(ev.tcp_rmem_max as i64, rmem_max);
                        self.wscale_examples.insert(p, (ev.rcv_wscale, expected));
                    }
                }
            }
            other => tracing::debug!("unknown event kind {other}"),
        }
    }

    fn note_sockopt(&mut self, ev: &SockoptEvent, owner: ProcRef) {
        let Some(option) = BufOption::from_optname(ev.optname) else {
            return;
        };
        if self.notes.len() >= MAX_NOTES && !self.notes.contains_key(&(ev.inode, option)) {
            // Bounded: forget an arbitrary old note rather than grow without limit.
            if let Some(k) = self.notes.keys().next().copied() {
                self.notes.remove(&k);
            }
        }
        let effective = match option {
            BufOption::Sndbuf | BufOption::SndbufForce => ev.sndbuf_after,
            _ => ev.rcvbuf_after,
        };
        self.notes.insert(
            (ev.inode, option),
            SocketOpt {
                owner,
                inode: ev.inode,
                proto: Proto::from_ip(ev.proto),
                option,
                requested: ev.requested as i64,
                effective: effective as i64,
                ret: ev.ret,
                clamped: sockopt::clamped(ev),
            },
        );
    }

    /// The advice rules' view of what was observed.
    pub fn advice_inputs(&self) -> Inputs {
        let now = Instant::now();
        let mut meta: BTreeMap<ProcRef, ProcMeta> = BTreeMap::new();
        let mut tcp = Vec::new();
        for (p, s) in self.store.procs() {
            meta.insert(*p, s.meta.clone());
            let locks = s.rcvbuf_locks.get(&Proto::Tcp).copied().unwrap_or(0);
            if s.tcp_established > 0 || locks > 0 {
                tcp.push((
                    *p,
                    TcpShape {
                        established: s.tcp_established,
                        shrunk: s.tcp_wscale_shrunk,
                        example: self.wscale_examples.get(p).copied(),
                        locks,
                    },
                ));
            }
        }
        let mut names: HashMap<u16, Arc<str>> = HashMap::new();
        let drops = self
            .drops
            .as_ref()
            .map(|d| {
                d.seen()
                    .map(|(k, s)| SocketDrops {
                        owner: s.owner,
                        inode: k.inode,
                        proto: Proto::from_ip(k.proto),
                        reason: names
                            .entry(k.reason)
                            .or_insert_with(|| d.reasons().name(k.reason).into())
                            .clone(),
                        packets: s.packets,
                        rate: s.rate(self.advice_window, now),
                        rcvbuf: s.rcvbuf,
                        ifname: s.ifname.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let tunes = self
            .autotune
            .as_ref()
            .map(|a| {
                a.sockets()
                    .map(|(ino, t)| TuneView {
                        owner: t.owner,
                        inode: *ino,
                        suppressed: t.suppressed,
                        rtt_us: t.rtt_us,
                        rcvbuf: t.rcvbuf,
                        copied: t.copied,
                        interval_us: t.interval_us,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let tcp_rmem_max = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_rmem")
            .ok()
            .and_then(|s| s.split_whitespace().nth(2).and_then(|v| v.parse().ok()))
            .unwrap_or(6_291_456);
        Inputs {
            drops,
            opts: self.notes.values().cloned().collect(),
            tcp,
            tunes,
            meta,
            rmem_max: self.limits.rmem_max,
            wmem_max: self.limits.wmem_max,
            tcp_rmem_max,
            window: self.advice_window,
        }
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

    /// The status page's data (`/api/v1/status`): per-process table and health.
    pub fn status(&self, probes: &[crate::probes::ProbeStatus]) -> serde_json::Value {
        use serde_json::json;
        let mut rows = Vec::new();
        for (pid, s) in self.store.iter() {
            let mut drops = serde_json::Map::new();
            let mut total = 0u64;
            for ((proto, reason), v) in &s.drops {
                total += v;
                drops.insert(format!("{}/{reason}", proto.as_str()), json!(v));
            }
            let (mut calls, mut clamped, mut failed) = (0u64, 0u64, 0u64);
            for c in s.sockopt.values() {
                calls += c.calls;
                clamped += c.clamped;
                failed += c.failed;
            }
            rows.push(json!({
                "pid": pid,
                "comm": s.meta.comm,
                "container": s.meta.container,
                "drops": drops,
                "drops_total": total,
                "setsockopt": calls,
                "clamped": clamped,
                "failed": failed,
                "rcvbuf_locks": s.rcvbuf_locks.values().sum::<u64>(),
                "tcp_established": s.tcp_established,
                "tcp_wscale_shrunk": s.tcp_wscale_shrunk,
                "tcp_autotune_suppressed": s.tcp_autotune_suppressed,
            }));
        }
        let probes: Vec<_> = probes
            .iter()
            .map(|p| {
                json!({
                    "probe": p.spec.name,
                    "hooks": p.hooks(),
                    "what": p.spec.what,
                    "attached": p.attached,
                    "error": p.error,
                })
            })
            .collect();
        json!({
            "version": self.health.version,
            "kernel": self.health.kernel,
            "generated_at": SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
            "net_core_rmem_max": self.limits.rmem_max,
            "net_core_wmem_max": self.limits.wmem_max,
            "processes": rows,
            "probes": probes,
            "attribution_unknown": self.store.attribution_unknown,
            "bpf_events_lost": self.health.bpf_lost.iter().map(|(k, v)| (k.to_string(), *v)).collect::<BTreeMap<_, _>>(),
            "tracked_processes": self.store.len(),
        })
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
        let mut candidates = self
            .drops
            .as_ref()
            .map(|d| d.idle_inodes(idle))
            .unwrap_or_default();
        if let Some(a) = self.autotune.as_ref() {
            candidates.extend(a.idle_inodes(idle));
        }
        // A pass over every `/proc/<pid>/fd` is the expensive part of GC (≈13,000 readlinks
        // with 1,000 processes holding 10,000 sockets), so the last pass is reused for up to
        // LIVE_TTL while every GC candidate (an idle map entry) was live in it: a closed
        // socket's entry then goes at most that much later.
        let reuse = self.live.as_ref().is_some_and(|(at, live)| {
            at.elapsed() < LIVE_TTL && candidates.iter().all(|i| live.contains(i))
        });
        GcPlan {
            procfs: self.attr.procfs().clone(),
            procs: self.store.running(),
            scan_sockets: !reuse,
        }
    }

    /// Applies what [`GcPlan::scan`] found.
    pub fn gc_apply(&mut self, scan: GcScan) {
        self.advice_dirty = true;
        let dead: HashSet<ProcRef> = scan.dead.into_iter().collect();
        self.store.expire(|p| !dead.contains(p));
        if let Some(live) = scan.live {
            self.live = Some((scan.at, live));
        }
        let empty = HashSet::new();
        let live = self.live.as_ref().map_or(&empty, |(_, l)| l);
        let mut removed = 0;
        if let Some(d) = self.drops.as_mut() {
            removed += d.gc(live, self.timing.idle, &mut self.attr);
        }
        if let Some(a) = self.autotune.as_mut() {
            removed += a.gc(live, self.timing.idle);
        }
        self.notes.retain(|(ino, _), _| live.contains(ino));
        let store = &self.store;
        self.wscale_examples.retain(|p, _| store.get(p).is_some());
        // One pass over the drop keys (not one per cached process: with 1,000 processes and
        // 10,000 sockets that was 10 M comparisons per GC).
        let owners: HashSet<ProcRef> = self
            .drops
            .as_ref()
            .map(|d| d.seen().filter_map(|(_, s)| s.owner).collect())
            .unwrap_or_default();
        self.attr
            .retain_procs(|p| store.get(p).is_some() || owners.contains(p));
        if removed > 0 {
            tracing::debug!(removed, "garbage-collected map entries of closed sockets");
        }
        // What churn freed (exited processes, closed sockets) goes back to the kernel instead
        // of staying in the allocator's arenas.
        crate::probes::trim_heap();
    }

    /// Prometheus text exposition.
    pub fn render(&mut self, map_sizes: &crate::probes::MapSizes) -> String {
        self.health.map_entries = vec![
            (
                "DROPS",
                self.drops.as_ref().map_or(0, |d| d.entries() as u64),
                map_sizes.drops as u64,
            ),
            (
                "AUTOTUNE",
                self.autotune.as_ref().map_or(0, |a| a.entries() as u64),
                map_sizes.autotune as u64,
            ),
        ];
        let findings = self.findings(FINDINGS_MIN_AGE_SCRAPE);
        let mut fams = metrics::families(&self.store, &self.health, findings.as_slice());
        self.zero_new_counters(&mut fams);
        metrics::encode(&fams).unwrap_or_else(|e| {
            tracing::error!("encoding metrics: {e}");
            String::new()
        })
    }
}

impl Collector {
    /// Shows every counter series at 0 the first time it is exposed; its real value follows at
    /// the next scrape. Without this a series is born non-zero and `rate()`/`increase()` never
    /// see its first burst (e.g. the only drops of a short flood).
    fn zero_new_counters(&mut self, fams: &mut [prometheus::proto::MetricFamily]) {
        let mut seen = HashSet::with_capacity(self.exposed.len());
        for mf in fams.iter_mut() {
            if mf.get_field_type() != prometheus::proto::MetricType::COUNTER {
                continue;
            }
            let name = mf.name().to_string();
            for m in mf.mut_metric().iter_mut() {
                let mut key = name.clone();
                for l in m.get_label() {
                    key.push('\u{0}');
                    key.push_str(l.name());
                    key.push('=');
                    key.push_str(l.value());
                }
                if !self.exposed.contains(&key) {
                    let mut c = prometheus::proto::Counter::default();
                    c.set_value(0.0);
                    m.set_counter(c);
                }
                seen.insert(key);
            }
        }
        self.exposed = seen;
    }
}

/// Reads a `#[repr(C)]` POD event from the start of `bytes`.
fn read<T: Copy>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: length checked; T is a #[repr(C)] integer-only type from bufscope-common, valid
    // for any bit pattern; read_unaligned handles the ring buffer's 8-byte alignment.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const T) })
}

/// The `/proc` lookups one GC pass needs (see [`Collector::gc_plan`]).
pub struct GcPlan {
    procfs: crate::attribution::Procfs,
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
