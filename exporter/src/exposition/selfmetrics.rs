//! bufscope's own health, next to the signals' families: findings, probe status, losses, map
//! fill, cardinality, the sysctls that bound buffer requests, pins, build.

use prometheus::proto::MetricFamily;

use super::Spec;
use crate::advice::Finding;
use crate::bpf::pins::PinsReport;
use crate::store::{Parts, Store};

/// One probe's state (`bufscope_probe_attached`, `bufscope_probe_pinned`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProbeHealth {
    /// Its name.
    pub probe: String,
    /// The hooks of the variant in use.
    pub hooks: String,
    /// Attached (and, with pins, its links still this bufscope's).
    pub attached: bool,
    /// Its links are pinned.
    pub pinned: bool,
}

/// Fill level of a room's BPF map (`bufscope_bpf_map_entries{map}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapFill {
    /// Map name.
    pub map: &'static str,
    /// Entries now (as of the last poll).
    pub entries: u64,
    /// Capacity.
    pub max_entries: u64,
}

/// Health facts rendered next to the per-process families.
#[derive(Clone, Debug, Default)]
pub struct Health {
    /// bufscope version.
    pub version: String,
    /// Kernel release.
    pub kernel: String,
    /// Every configured probe.
    pub probes: Vec<ProbeHealth>,
    /// Probe-side loss counters by cause (`STATS`).
    pub bpf_lost: Vec<(&'static str, u64)>,
    /// The rooms' maps.
    pub map_entries: Vec<MapFill>,
    /// `net.core.rmem_max` now (None: unreadable here).
    pub rmem_max: Option<i64>,
    /// `net.core.wmem_max` now (None: unreadable here).
    pub wmem_max: Option<i64>,
    /// `--bpf.pin-path`: what the start found and did (None: nothing pinned).
    pub pins: Option<PinsReport>,
}

const FINDING: Spec = Spec::gauge(
    "bufscope_finding",
    "Active findings per program, kind and severity (the value: how many, one per socket and buffer direction for the per-socket kinds, one per process for the others; resolved ones are not counted); /api/v1/findings and `bufscope explain` name the sockets and say what to change.",
    &[
        "comm",
        "container",
        "pod",
        "namespace",
        "container_name",
        "kind",
        "severity",
    ],
);
const PROBE_ATTACHED: Spec = Spec::gauge(
    "bufscope_probe_attached",
    "Whether a probe is attached (1) or not (0); see the log for why.",
    &["probe", "hook"],
);
const ATTRIBUTION_UNKNOWN: Spec = Spec::counter(
    "bufscope_attribution_unknown_total",
    "Events that could not be attributed to a process (counted under comm=\"_unknown\").",
    &["probe"],
);
const EVENTS_LOST: Spec = Spec::counter(
    "bufscope_bpf_events_lost_total",
    "Events the probes could not record, by cause (a full map or ring buffer).",
    &["cause"],
);
const MAP_ENTRIES: Spec = Spec::gauge(
    "bufscope_bpf_map_entries",
    "Entries in a BPF map.",
    &["map"],
);
const MAP_MAX_ENTRIES: Spec = Spec::gauge(
    "bufscope_bpf_map_max_entries",
    "Capacity of a BPF map.",
    &["map"],
);
const TRACKED: Spec = Spec::gauge(
    "bufscope_tracked_processes",
    "Processes with their own series (bounded by --max-processes).",
    &[],
);
const FOLDED: Spec = Spec::counter(
    "bufscope_folded_processes_total",
    "Processes folded into comm=\"_other\" because --max-processes was reached.",
    &[],
);
const RMEM_MAX: Spec = Spec::gauge(
    "bufscope_net_core_rmem_max_bytes",
    "net.core.rmem_max: the ceiling SO_RCVBUF requests are clamped to (the kernel doubles it).",
    &[],
);
const WMEM_MAX: Spec = Spec::gauge(
    "bufscope_net_core_wmem_max_bytes",
    "net.core.wmem_max: the ceiling SO_SNDBUF requests are clamped to (the kernel doubles it).",
    &[],
);
const PINS_INFO: Spec = Spec::gauge(
    "bufscope_bpf_pins_info",
    "--bpf.pin-path: what this start did with the pins (created, adopted: counting went on \
     while bufscope was down, upgraded: maps kept and programs replaced, replaced: maps of \
     another layout were replaced and their counts restarted).",
    &["path", "outcome", "layout", "replaced"],
);
const PINS_CREATED: Spec = Spec::gauge(
    "bufscope_bpf_pins_created_timestamp_seconds",
    "When the pinned maps were created: the counters count from then on.",
    &[],
);
const PROBE_PINNED: Spec = Spec::gauge(
    "bufscope_probe_pinned",
    "Whether the probe's links are pinned (1: it keeps counting while bufscope is not \
     running; the guard and the setsockopt program it shares only with --guard.persist).",
    &["probe"],
);
const BUILD_INFO: Spec = Spec::gauge(
    "bufscope_build_info",
    "bufscope version and the kernel it runs on.",
    &["version", "kernel"],
);

/// A family of one sample without labels.
fn single(spec: &Spec, value: f64, out: &mut Vec<MetricFamily>) {
    let mut f = spec.family();
    f.push(&[], value);
    f.done(out);
}

/// bufscope's own families: the findings (of processes tracked now), probe health, losses,
/// map fill, cardinality, sysctls, pins and build. `attributed`: the probes whose events are
/// attributed (each gets an unknown-attribution series, 0 included).
pub fn families<P: Parts>(
    store: &Store<P>,
    health: &Health,
    findings: &[Finding],
    attributed: impl Iterator<Item = &'static str>,
    out: &mut Vec<MetricFamily>,
) {
    findings_family(store, findings, out);
    probes_family(health, out);
    let mut f = ATTRIBUTION_UNKNOWN.family();
    for probe in attributed {
        let v = store.attribution_unknown.get(probe).copied().unwrap_or(0);
        f.push(&[probe], v as f64);
    }
    f.done(out);
    let mut f = EVENTS_LOST.family();
    for (cause, v) in &health.bpf_lost {
        f.push(&[cause], *v as f64);
    }
    f.done(out);
    let mut entries = MAP_ENTRIES.family();
    let mut max = MAP_MAX_ENTRIES.family();
    for m in &health.map_entries {
        entries.push(&[m.map], m.entries as f64);
        max.push(&[m.map], m.max_entries as f64);
    }
    entries.done(out);
    max.done(out);
    single(&TRACKED, store.len() as f64, out);
    single(&FOLDED, store.folded as f64, out);
    if let Some(v) = health.rmem_max {
        single(&RMEM_MAX, v as f64, out);
    }
    if let Some(v) = health.wmem_max {
        single(&WMEM_MAX, v as f64, out);
    }
    pins_families(health, out);
    let mut f = BUILD_INFO.family();
    f.push(&[&health.version, &health.kernel], 1.0);
    f.done(out);
}

/// `bufscope_finding`: per program (no pid, no socket: bounded by programs × kinds ×
/// severities), how many active findings of processes tracked now.
fn findings_family<P: Parts>(store: &Store<P>, findings: &[Finding], out: &mut Vec<MetricFamily>) {
    let mut f = FINDING.family();
    // Findings may be up to a second old (see `Collector::findings`): count only those of
    // processes tracked now, so the finding series stay within --max-processes too.
    let tracked: foldhash::HashSet<u32> = store.procs().map(|(p, _)| p.tgid).collect();
    let mut counts: std::collections::BTreeMap<[&str; 7], u64> = std::collections::BTreeMap::new();
    for x in findings.iter().filter(|x| {
        tracked.contains(&x.process.pid)
            && !matches!(
                x.verdict,
                Some(bufscope_api::Verdict::Resolved | bufscope_api::Verdict::Gone)
            )
    }) {
        *counts
            .entry([
                x.process.comm.as_str(),
                x.process.container.as_str(),
                x.process.pod.as_str(),
                x.process.namespace.as_str(),
                x.process.container_name.as_str(),
                x.kind,
                x.severity.as_str(),
            ])
            .or_default() += 1;
    }
    for (labels, n) in &counts {
        f.push(labels, *n as f64);
    }
    f.done(out);
}

/// `bufscope_probe_attached{probe,hook}`.
fn probes_family(health: &Health, out: &mut Vec<MetricFamily>) {
    let mut f = PROBE_ATTACHED.family();
    for p in &health.probes {
        f.push(&[&p.probe, &p.hooks], if p.attached { 1.0 } else { 0.0 });
    }
    f.done(out);
}

/// With `--bpf.pin-path`: what the start did with the pins, since when they count, which
/// probes outlive bufscope.
fn pins_families(health: &Health, out: &mut Vec<MetricFamily>) {
    let Some(p) = &health.pins else {
        return;
    };
    let mut f = PINS_INFO.family();
    let layout = p.layout.to_string();
    f.push(&[&p.path, p.outcome, &layout, &p.replaced.join(",")], 1.0);
    f.done(out);
    single(&PINS_CREATED, p.since_unix as f64, out);
    let mut f = PROBE_PINNED.family();
    for probe in &health.probes {
        f.push(
            &[&probe.probe],
            if probe.attached && probe.pinned {
                1.0
            } else {
                0.0
            },
        );
    }
    f.done(out);
}
