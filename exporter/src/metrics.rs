//! Prometheus exposition of the [`Store`] and of bufscope's own health.
//!
//! Families are built at scrape time from the store (no per-series objects to keep in sync,
//! so folding and expiry are just map operations) and encoded with the `prometheus` crate's
//! text encoder, which escapes label values (`comm` is attacker-controlled text).

use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};

use crate::advice::Finding;
use crate::store::{ProcStats, Store};

/// A family under construction.
struct Family {
    mf: MetricFamily,
}

impl Family {
    fn new(name: &str, help: &str, kind: MetricType) -> Self {
        let mut mf = MetricFamily::default();
        mf.set_name(name.to_string());
        mf.set_help(help.to_string());
        mf.set_field_type(kind);
        Self { mf }
    }

    fn push(&mut self, labels: &[(&str, &str)], value: f64) {
        let pairs = labels
            .iter()
            .map(|(k, v)| {
                let mut l = LabelPair::default();
                l.set_name(k.to_string());
                l.set_value(v.to_string());
                l
            })
            .collect();
        let mut m = Metric::default();
        m.set_label(pairs);
        match self.mf.get_field_type() {
            MetricType::COUNTER => {
                let mut c = Counter::default();
                c.set_value(value);
                m.set_counter(c);
            }
            _ => {
                let mut g = Gauge::default();
                g.set_value(value);
                m.set_gauge(g);
            }
        }
        self.mf.mut_metric().push(m);
    }

    fn done(self, out: &mut Vec<MetricFamily>) {
        if !self.mf.get_metric().is_empty() {
            out.push(self.mf);
        }
    }
}

/// Health facts rendered next to the per-process families.
#[derive(Clone, Debug, Default)]
pub struct Health {
    /// bufscope version.
    pub version: String,
    /// Kernel release.
    pub kernel: String,
    /// (probe, hook description, attached).
    pub probes: Vec<(String, String, bool)>,
    /// Probe-side loss counters by reason (`STATS`).
    pub bpf_lost: Vec<(&'static str, u64)>,
    /// Map fill level by map name: (entries, max entries).
    pub map_entries: Vec<(&'static str, u64, u64)>,
    /// `net.core.rmem_max` now (None: unreadable here).
    pub rmem_max: Option<i64>,
    /// `net.core.wmem_max` now (None: unreadable here).
    pub wmem_max: Option<i64>,
}

/// Receives (extra labels, value) for one sample.
pub type Emit<'a> = dyn FnMut(&[(&str, &str)], f64) + 'a;

/// Builds one per-process counter family: `f` is called for each process with an `emit` that
/// adds a sample labelled `comm`, `pid`, `container` plus the extra labels it is given. The
/// family is left out when no process emitted anything.
pub fn per_process(
    name: &str,
    help: &str,
    procs: &[(String, &ProcStats)],
    out: &mut Vec<MetricFamily>,
    f: impl Fn(&ProcStats, &mut Emit<'_>),
) {
    let mut fam = Family::new(name, help, MetricType::COUNTER);
    for (pid, s) in procs {
        let base = [
            ("comm", s.meta.comm.as_str()),
            ("pid", pid.as_str()),
            ("container", s.meta.container.as_str()),
        ];
        f(s, &mut |extra, v| {
            let mut labels: Vec<(&str, &str)> = base.to_vec();
            labels.extend_from_slice(extra);
            fam.push(&labels, v);
        });
    }
    fam.done(out);
}

/// Builds every metric family: each signal's per-process families, the findings, and
/// bufscope's own health.
pub fn families(store: &Store, health: &Health, findings: &[Finding]) -> Vec<MetricFamily> {
    let mut out = Vec::new();
    let procs: Vec<(String, &ProcStats)> = store.iter().collect();
    crate::signals::families(&procs, &mut out);

    let mut f = Family::new(
        "bufscope_finding",
        "Active findings (1 per process and kind); /api/v1/findings and `bufscope explain` say what to change.",
        MetricType::GAUGE,
    );
    // Findings may be up to a second old (see `Collector::findings`): show only those of
    // processes tracked now, so the finding series stay within --max-processes too.
    let tracked: foldhash::HashSet<u32> = store.procs().map(|(p, _)| p.tgid).collect();
    for x in findings.iter().filter(|x| tracked.contains(&x.process.pid)) {
        let pid = x.process.pid.to_string();
        f.push(
            &[
                ("comm", x.process.comm.as_str()),
                ("pid", pid.as_str()),
                ("container", x.process.container.as_str()),
                ("kind", x.kind),
                ("severity", x.severity.as_str()),
            ],
            1.0,
        );
    }
    f.done(&mut out);

    let mut f = Family::new(
        "bufscope_probe_attached",
        "Whether a probe is attached (1) or not (0); see the log for why.",
        MetricType::GAUGE,
    );
    for (probe, hook, on) in &health.probes {
        f.push(
            &[("probe", probe), ("hook", hook)],
            if *on { 1.0 } else { 0.0 },
        );
    }
    f.done(&mut out);

    let mut f = Family::new(
        "bufscope_attribution_unknown_total",
        "Events that could not be attributed to a process (counted under comm=\"_unknown\").",
        MetricType::COUNTER,
    );
    for probe in crate::signals::ATTRIBUTED {
        let v = store.attribution_unknown.get(probe).copied().unwrap_or(0);
        f.push(&[("probe", probe)], v as f64);
    }
    f.done(&mut out);

    let mut f = Family::new(
        "bufscope_bpf_events_lost_total",
        "Events the probes could not record, by cause (a full map or ring buffer).",
        MetricType::COUNTER,
    );
    for (cause, v) in &health.bpf_lost {
        f.push(&[("cause", cause)], *v as f64);
    }
    f.done(&mut out);

    let mut f = Family::new(
        "bufscope_bpf_map_entries",
        "Entries in a BPF map.",
        MetricType::GAUGE,
    );
    for (map, n, _) in &health.map_entries {
        f.push(&[("map", map)], *n as f64);
    }
    f.done(&mut out);
    let mut f = Family::new(
        "bufscope_bpf_map_max_entries",
        "Capacity of a BPF map.",
        MetricType::GAUGE,
    );
    for (map, _, max) in &health.map_entries {
        f.push(&[("map", map)], *max as f64);
    }
    f.done(&mut out);

    let mut f = Family::new(
        "bufscope_tracked_processes",
        "Processes with their own series (bounded by --max-processes).",
        MetricType::GAUGE,
    );
    f.push(&[], store.len() as f64);
    f.done(&mut out);
    let mut f = Family::new(
        "bufscope_folded_processes_total",
        "Processes folded into comm=\"_other\" because --max-processes was reached.",
        MetricType::COUNTER,
    );
    f.push(&[], store.folded as f64);
    f.done(&mut out);

    let mut f = Family::new(
        "bufscope_net_core_rmem_max_bytes",
        "net.core.rmem_max: the ceiling SO_RCVBUF requests are clamped to (the kernel doubles it).",
        MetricType::GAUGE,
    );
    if let Some(v) = health.rmem_max {
        f.push(&[], v as f64);
    }
    f.done(&mut out);
    let mut f = Family::new(
        "bufscope_net_core_wmem_max_bytes",
        "net.core.wmem_max: the ceiling SO_SNDBUF requests are clamped to (the kernel doubles it).",
        MetricType::GAUGE,
    );
    if let Some(v) = health.wmem_max {
        f.push(&[], v as f64);
    }
    f.done(&mut out);

    let mut f = Family::new(
        "bufscope_build_info",
        "bufscope version and the kernel it runs on.",
        MetricType::GAUGE,
    );
    f.push(
        &[("version", &health.version), ("kernel", &health.kernel)],
        1.0,
    );
    f.done(&mut out);
    out
}

/// Shows every counter series at 0 the first time it is exposed; its real value follows at
/// the next scrape. Without this a series is born non-zero and `rate()`/`increase()` never
/// see its first burst (e.g. the only drops of a short flood).
#[derive(Default)]
pub struct NewSeries {
    exposed: foldhash::HashSet<String>,
}

impl NewSeries {
    /// Zeroes the counters of `fams` not exposed by the previous call.
    pub fn zero(&mut self, fams: &mut [MetricFamily]) {
        use foldhash::HashSetExt as _;
        let mut seen = foldhash::HashSet::with_capacity(self.exposed.len());
        for mf in fams.iter_mut() {
            if mf.get_field_type() != MetricType::COUNTER {
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
                    let mut c = Counter::default();
                    c.set_value(0.0);
                    m.set_counter(c);
                }
                seen.insert(key);
            }
        }
        self.exposed = seen;
    }
}

/// Renders families in the Prometheus text format (0.0.4).
pub fn encode(families: &[MetricFamily]) -> Result<String, prometheus::Error> {
    use prometheus::Encoder as _;
    let mut buf = Vec::new();
    prometheus::TextEncoder::new().encode(families, &mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::store::{ProcMeta, ProcRef, Proto, Who};
    use std::time::Duration;

    #[test]
    fn hostile_comm_is_escaped() {
        let mut store = Store::new(10, Duration::from_secs(60));
        let who = Who::Proc(ProcRef {
            tgid: 42,
            start_ticks: 7,
        });
        let s = store.proc_mut(who, || ProcMeta {
            comm: "a\"b\\c\nd".into(),
            container: String::new(),
        });
        s.drops.add(Proto::Udp, "SOCKET_RCVBUFF", 5);
        let text = encode(&families(&store, &Health::default(), &[])).unwrap();
        assert!(
            text.contains(r#"bufscope_socket_drops_total{comm="a\"b\\c\nd",pid="42",container="",proto="udp",reason="SOCKET_RCVBUFF"} 5"#),
            "{text}"
        );
        // Every sample is on one line: no raw newline inside a label value.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("bufscope_"), "broken line: {line:?}");
        }
    }
}
