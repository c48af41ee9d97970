//! bufscope's own health, next to the signals' families: findings, probe status, losses, map
//! fill, cardinality, the sysctls that bound buffer requests, pins, build.

use prometheus::proto::MetricFamily;

use super::{Family, PROCESS_LABELS, Spec, identity_labels};
use crate::advice::Findings;
use crate::bpf::pins::PinsReport;
use crate::store::series::OVERFLOW;
use crate::store::{Admission, Parts, ProcRef, Row, Store};

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
    /// Attached after start by its room ([`crate::signals::Signal::attached_late`]): listed
    /// only while attached.
    pub late: bool,
}

/// Lists the probes `rooms` attached after start while they are attached, and drops those
/// they detached again (see [`crate::signals::Signal::attached_late`]).
pub fn sync_late_probes<'a>(
    probes: &mut Vec<ProbeHealth>,
    rooms: impl Iterator<Item = (&'static str, Option<&'a str>)>,
) {
    for (probe, hooks) in rooms {
        let at = probes.iter().position(|p| p.probe == probe);
        match (hooks, at) {
            (Some(hooks), None) => probes.push(ProbeHealth {
                probe: probe.to_string(),
                hooks: hooks.to_string(),
                attached: true,
                pinned: false,
                late: true,
            }),
            (None, Some(i)) if probes[i].late => {
                probes.remove(i);
            }
            _ => {}
        }
    }
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
    /// Processes refused pod labels, by reason.
    pub pod_labels_refused: Vec<(&'static str, u64)>,
}

const FINDING: Spec = Spec::gauge(
    "bufscope_finding",
    "Active findings per identity (program and place), kind and severity (the value: how many, one per socket and buffer direction for the per-socket kinds, one per process for the others; resolved ones are not counted); /api/v1/findings and `bufscope explain` name the processes and sockets and say what to change.",
    &["kind", "severity"],
);
const PROCESS_INFO: Spec = Spec::gauge(
    "bufscope_process_info",
    "The processes behind an identity's series (1 per long-lived process or process with a finding, within --max-series): join on the identity labels with group_left(pid).",
    &["pid"],
);
const SERIES_BUDGET: Spec = Spec::gauge(
    "bufscope_series_budget",
    "--max-series: the per-process series this node may show (identities' counters, and a fifth of it for bufscope_process_info).",
    &[],
);
const SERIES: Spec = Spec::gauge(
    "bufscope_series",
    "Per-process series shown now (the counters of identities with series of their own).",
    &[],
);
const SERIES_IDENTITIES: Spec = Spec::gauge(
    "bufscope_series_identities",
    "Identities (program and place) with series of their own.",
    &[],
);
const SERIES_OVERFLOW: Spec = Spec::counter(
    "bufscope_series_overflow_processes_total",
    "Processes whose counts went to the overflow series (otel_metric_overflow=\"true\") because their identity got no series of its own (--max-series or --max-processes reached).",
    &[],
);
const POD_LABELS_REFUSED: Spec = Spec::counter(
    "bufscope_pod_labels_refused_total",
    "Processes whose cgroup looked like a kubelet's pod but was not the kubelet's own (a user-delegated subtree, outside the kubelet's root, another layout, a directory not owned by root): they keep their own cgroup, no pod labels.",
    &["reason"],
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
    "Processes tracked one by one (status page, API; bounded by --max-processes).",
    &[],
);
const FOLDED: Spec = Spec::counter(
    "bufscope_folded_processes_total",
    "Processes that left the per-process detail because --max-processes was reached (their counts stay on their identity's series).",
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
/// attributed. A probe's unknown-attribution series, a cause's lost-events series and a
/// reason's refused-pod-label series are shown once they count, not at 0 (the node's series
/// budget): the first two alerts are on sustained rates, which a series born non-zero does
/// not hide, and the third also fires on a series born non-zero (`x > 0 unless x offset 15m`).
pub fn families<P: Parts>(
    store: &Store<P>,
    health: &Health,
    findings: &Findings,
    attributed: impl Iterator<Item = &'static str>,
    alive: &dyn Fn(&ProcRef) -> bool,
    out: &mut Vec<MetricFamily>,
) {
    findings_family(store, findings, out);
    process_info(store, findings, alive, out);
    probes_family(health, out);
    let mut f = ATTRIBUTION_UNKNOWN.family();
    for probe in attributed {
        let v = store.attribution_unknown.get(probe).copied().unwrap_or(0);
        if v > 0 {
            f.push(&[probe], v as f64);
        }
    }
    f.done(out);
    let mut f = EVENTS_LOST.family();
    for (cause, v) in health.bpf_lost.iter().filter(|(_, v)| *v > 0) {
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
    single(&SERIES_BUDGET, store.budget as f64, out);
    single(&SERIES, store.series_used as f64, out);
    single(&SERIES_IDENTITIES, store.own_identities() as f64, out);
    single(&SERIES_OVERFLOW, store.overflowed as f64, out);
    let mut f = POD_LABELS_REFUSED.family();
    for (reason, n) in health.pod_labels_refused.iter().filter(|(_, n)| *n > 0) {
        f.push(&[reason], *n as f64);
    }
    f.done(out);
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

/// The identity row (labels only) of process `p`'s series, when it is shown.
fn shown_identity<P: Parts>(store: &Store<P>, p: &ProcRef) -> Option<Row<()>> {
    let s = store.get(p)?;
    let id = store.identity(s.series)?;
    let overflow = s.series == OVERFLOW;
    (overflow || id.admission == Admission::Own).then(|| {
        let mut stats = crate::store::ProcStats::new_row(id.meta.clone());
        stats.series = s.series;
        Row {
            id: s.series,
            overflow,
            stats,
        }
    })
}

/// `bufscope_finding`: per identity shown, kind and severity (no pid, no socket: bounded by
/// the identities × kinds × severities), how many active findings its processes have.
/// Findings may be up to a second old (see `Collector::findings`): only those of processes
/// tracked now count; resolved and gone ones do not.
fn findings_family<P: Parts>(store: &Store<P>, findings: &Findings, out: &mut Vec<MetricFamily>) {
    let by_pid: foldhash::HashMap<u32, ProcRef> =
        store.procs().map(|(p, _)| (p.tgid, *p)).collect();
    // Counted per process first: its identity is looked up once, not once per finding
    // (10,000 sockets' findings of 1,000 processes).
    let mut per_pid: foldhash::HashMap<(u32, &str, &str), u64> = foldhash::HashMap::default();
    for x in findings.heads().filter(|x| x.active()) {
        *per_pid
            .entry((x.pid, x.kind, x.severity.as_str()))
            .or_default() += 1;
    }
    let mut rows: foldhash::HashMap<u32, Option<Row<()>>> = foldhash::HashMap::default();
    let mut counts: std::collections::BTreeMap<(u64, &str, &str), (Row<()>, u64)> =
        std::collections::BTreeMap::new();
    for ((pid, kind, severity), n) in per_pid {
        let row = rows
            .entry(pid)
            .or_insert_with(|| by_pid.get(&pid).and_then(|p| shown_identity(store, p)));
        let Some(row) = row else {
            continue;
        };
        counts
            .entry((row.id, kind, severity))
            .or_insert_with(|| (row.clone(), 0))
            .1 += n;
    }
    let mut f = Family::new(&FINDING, [PROCESS_LABELS, FINDING.labels].concat());
    for ((_, kind, severity), (row, n)) in &counts {
        let base = identity_labels(row);
        f.push_values(base.iter().copied().chain([*kind, *severity]), *n as f64);
    }
    f.done(out);
}

/// How long a process must have run to get a `bufscope_process_info` series without a
/// finding: longer than a cron job or a health check, so that short-lived processes leave no
/// series of their own.
pub const INFO_MIN_AGE_SECS: f64 = 60.0;

/// How long a process with a finding must have run to get one: a process that lives for a
/// moment and drops leaves no series of its own either.
pub const INFO_MIN_AGE_FINDING_SECS: f64 = 10.0;

/// `bufscope_process_info{<identity>,pid} 1`: the processes that matter behind the shown
/// identities — those with an active finding (running for [`INFO_MIN_AGE_FINDING_SECS`]), then
/// those running for [`INFO_MIN_AGE_SECS`], oldest first — at most [`Store::info_budget`].
/// "Running" is asked of `alive` (its `/proc` entry, same start time): a short-lived process
/// stays in the store until GC notices it exited, and its age would otherwise keep growing
/// past the threshold (300 processes of a churn got info series of their own that way).
fn process_info<P: Parts>(
    store: &Store<P>,
    findings: &Findings,
    alive: &dyn Fn(&ProcRef) -> bool,
    out: &mut Vec<MetricFamily>,
) {
    let with_finding: foldhash::HashSet<u32> = findings
        .heads()
        .filter(|f| f.active())
        .map(|f| f.pid)
        .collect();
    let uptime = std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok());
    let hz = crate::attribution::procfs::clk_tck().max(1) as f64;
    let mut picked: Vec<(bool, u64, ProcRef)> = store
        .procs()
        .filter(|(_, s)| s.exited.is_none())
        .filter_map(|(p, _)| {
            let age = uptime.map_or(0.0, |u| u - p.start_ticks as f64 / hz);
            let finding = with_finding.contains(&p.tgid) && age >= INFO_MIN_AGE_FINDING_SECS;
            (finding || age >= INFO_MIN_AGE_SECS).then_some((!finding, p.start_ticks, *p))
        })
        .collect();
    picked.sort_unstable();
    let mut f = Family::new(
        &PROCESS_INFO,
        [PROCESS_LABELS, PROCESS_INFO.labels].concat(),
    );
    let mut n = 0;
    for (_, _, p) in picked {
        if n >= store.info_budget() {
            break;
        }
        let Some(row) = shown_identity(store, &p).filter(|r| !r.overflow) else {
            continue;
        };
        if !alive(&p) {
            continue;
        }
        let pid = p.tgid.to_string();
        let base = identity_labels(&row);
        f.push_values(base.iter().copied().chain([pid.as_str()]), 1.0);
        n += 1;
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::advice::Finding;
    use crate::exposition::encode;
    use crate::signals::Store;
    use crate::store::{ProcMeta, Who};
    use std::time::Duration;

    /// A probe a room attached late is listed (1) while attached and gone once its room
    /// keeps it off again; a probe the loader attached (or left detached) is never touched.
    #[test]
    fn late_probes_are_listed_while_attached() {
        let at_start = ProbeHealth {
            probe: "drops".into(),
            hooks: "tp_btf/kfree_skb".into(),
            ..ProbeHealth::default()
        };
        let mut probes = vec![at_start.clone()];
        let render = |probes: &[ProbeHealth]| {
            let mut out = Vec::new();
            probes_family(
                &Health {
                    probes: probes.to_vec(),
                    ..Health::default()
                },
                &mut out,
            );
            encode(&out).unwrap()
        };
        sync_late_probes(
            &mut probes,
            [("drops", None), ("wireguard", None)].into_iter(),
        );
        assert_eq!(probes, vec![at_start.clone()]);
        sync_late_probes(
            &mut probes,
            [("drops", None), ("wireguard", Some("tp_btf/consume_skb"))].into_iter(),
        );
        assert!(
            render(&probes).contains(
                "bufscope_probe_attached{probe=\"wireguard\",hook=\"tp_btf/consume_skb\"} 1"
            ),
            "{}",
            render(&probes)
        );
        // Listed once, however many polls see it attached.
        sync_late_probes(
            &mut probes,
            [("wireguard", Some("tp_btf/consume_skb"))].into_iter(),
        );
        assert_eq!(probes.len(), 2);
        sync_late_probes(&mut probes, [("wireguard", None)].into_iter());
        assert_eq!(probes, vec![at_start]);
    }

    fn proc(tgid: u32) -> Who {
        // Started a tick after boot: long-lived.
        Who::Proc(ProcRef {
            tgid,
            start_ticks: 1,
        })
    }

    /// The info series name the long-lived processes of shown identities, at most a fifth
    /// of the budget, with the identity's labels and the pid; the budget's gauges say how
    /// full it is.
    #[test]
    fn process_info_is_bounded_and_joinable() {
        let mut store = Store::new(100, Duration::from_secs(60)).with_series_budget(10);
        let wg = || ProcMeta {
            comm: "wireguard-go".into(),
            cgroup: "system.slice/wg.service".into(),
            ..ProcMeta::default()
        };
        for pid in [101, 102, 103] {
            store.proc_mut(proc(pid), wg).parts.tcp_state.established += 1;
        }
        store.admit(|_| 1);
        store.series_used = 1;
        let mut out = Vec::new();
        families(
            &store,
            &Health::default(),
            &Findings::default(),
            std::iter::empty(),
            &|_| true,
            &mut out,
        );
        let text = encode(&out).unwrap();
        let info: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("bufscope_process_info{"))
            .collect();
        assert_eq!(info.len(), 2, "a fifth of 10: {info:?}");
        assert!(
            info[0].starts_with(
                r#"bufscope_process_info{comm="wireguard-go",container="",cgroup="system.slice/wg.service",pid="#
            ),
            "{info:?}"
        );
        assert!(text.contains("bufscope_series_budget 10\n"), "{text}");
        assert!(text.contains("bufscope_series 1\n"), "{text}");
        assert!(text.contains("bufscope_series_identities 1\n"), "{text}");
        assert!(
            text.contains("bufscope_series_overflow_processes_total 0\n"),
            "{text}"
        );
    }

    /// A process with a finding gets its info series once it has run
    /// [`INFO_MIN_AGE_FINDING_SECS`], one without only after [`INFO_MIN_AGE_SECS`]: a process
    /// that lives for a moment and drops leaves no series of its own.
    #[test]
    fn a_finding_shortens_the_age_not_to_zero() {
        let uptime: f64 = std::fs::read_to_string("/proc/uptime")
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let hz = crate::attribution::procfs::clk_tck() as f64;
        // Started `ago` seconds before now.
        let started = |tgid: u32, ago: f64| {
            Who::Proc(ProcRef {
                tgid,
                start_ticks: ((uptime - ago) * hz) as u64,
            })
        };
        let mut store = Store::new(100, Duration::from_secs(60)).with_series_budget(100);
        let meta = || ProcMeta {
            comm: "resolver".into(),
            ..ProcMeta::default()
        };
        // 201: a moment old with a finding; 202: 30 s with one; 203: 30 s without.
        for (pid, ago) in [(201, 1.0), (202, 30.0), (203, 30.0)] {
            store
                .proc_mut(started(pid, ago), meta)
                .parts
                .tcp_state
                .established += 1;
        }
        store.admit(|_| 1);
        let finding = |pid: u32| Finding {
            kind: "udp_rcvbuf_drops",
            severity: bufscope_api::Severity::Warning,
            process: bufscope_api::ProcessRef {
                pid,
                ..Default::default()
            },
            socket: None,
            summary: String::new(),
            fix: String::new(),
            evidence: Default::default(),
            rule: "",
            guard: None,
            verdict: None,
            story: None,
            fixes: Vec::new(),
            resolved: None,
            since: 0,
            changed_at: 0,
        };
        let mut out = Vec::new();
        families(
            &store,
            &Health::default(),
            &Findings::from(vec![
                finding(201),
                finding(202),
                Finding {
                    verdict: Some(bufscope_api::Verdict::Resolved),
                    ..finding(203)
                },
            ]),
            std::iter::empty(),
            &|_| true,
            &mut out,
        );
        let text = encode(&out).unwrap();
        let pids: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("bufscope_process_info{"))
            .filter_map(|l| l.split("pid=\"").nth(1)?.split('"').next())
            .collect();
        assert_eq!(pids, ["202"], "{text}");
        // The identity's findings are shown all the same, counted: the two active ones, not
        // the resolved one (which gives 203 no info series either).
        let finding_lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(r#"bufscope_finding{comm="resolver""#))
            .collect();
        assert_eq!(finding_lines.len(), 1, "{text}");
        assert!(finding_lines[0].ends_with(" 2"), "{text}");
    }

    /// A process whose identity went to the overflow series has no info series.
    #[test]
    fn no_info_for_the_overflow() {
        let mut store = Store::new(100, Duration::from_secs(60)).with_series_budget(1);
        store
            .proc_mut(proc(7), || ProcMeta {
                comm: "late".into(),
                ..ProcMeta::default()
            })
            .parts
            .tcp_state
            .established = 1;
        // Its two series do not fit a budget of one.
        store.admit(|_| 2);
        let mut out = Vec::new();
        families(
            &store,
            &Health::default(),
            &Findings::default(),
            std::iter::empty(),
            &|_| true,
            &mut out,
        );
        let text = encode(&out).unwrap();
        assert!(!text.contains("bufscope_process_info{"), "{text}");
        assert!(
            text.contains("bufscope_series_overflow_processes_total 1\n"),
            "{text}"
        );
    }
}
