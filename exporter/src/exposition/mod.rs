//! Prometheus exposition: families declared as data ([`Spec`]) and built by one builder
//! ([`Family`]), bufscope's own health ([`selfmetrics`]), the standard `process_*` metrics
//! and poll durations ([`process`]), and the two text formats with the
//! OpenMetrics `_created` bookkeeping ([`openmetrics`]).
//!
//! Families are built at scrape time from the store (no per-series objects to keep in sync,
//! so folding and expiry are just map operations). Every sample is the counter's current
//! value, whoever asks and however often: nothing in a value depends on earlier scrapes.

pub mod created;
pub mod openmetrics;
pub mod process;
pub mod selfmetrics;

use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};

use crate::store::{ProcStats, Row};

pub use created::{Created, created_times, unix_seconds};
pub use openmetrics::{Format, encode, encode_openmetrics};
pub use selfmetrics::{Health, MapFill, ProbeHealth, sync_late_probes};

/// The labels every per-process family starts with: the identity of a program and where it
/// runs (never a pid: [`crate::store::series`]), and the overflow marker.
pub const PROCESS_LABELS: &[&str] = &[
    "comm",
    "container",
    "pod",
    "namespace",
    "container_name",
    "cgroup",
    OVERFLOW_LABEL,
];

/// The label that marks a family's overflow series (as OpenTelemetry SDKs name theirs):
/// the counts of identities that got no series of their own.
pub const OVERFLOW_LABEL: &str = "otel_metric_overflow";

/// Labels left out of a sample when empty (processes outside Kubernetes pods, containers
/// for `cgroup`, every series but the overflow one for the marker): Prometheus reads an
/// absent label as an empty one, and a scrape is no longer for them.
pub const OMIT_EMPTY: &[&str] = &[
    "pod",
    "namespace",
    "container_name",
    "cgroup",
    OVERFLOW_LABEL,
];

/// The values of [`PROCESS_LABELS`] for an identity's row.
pub fn identity_labels<P>(row: &Row<P>) -> [&str; 7] {
    let m = &row.stats.meta;
    [
        m.comm.as_str(),
        m.container.as_str(),
        m.pod.as_str(),
        m.namespace.as_str(),
        m.container_name.as_str(),
        m.cgroup.as_str(),
        if row.overflow { "true" } else { "" },
    ]
}

/// Counter or gauge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (name ends in `_total`).
    Counter,
    /// A value now.
    Gauge,
}

/// A metric family as data: name, help, type and the labels its samples carry (after the
/// process labels, for a per-process family).
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    /// Family name.
    pub name: &'static str,
    /// `# HELP` text.
    pub help: &'static str,
    /// Counter or gauge.
    pub kind: Kind,
    /// Label names.
    pub labels: &'static [&'static str],
}

impl Spec {
    /// A counter family.
    pub const fn counter(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Self {
        Self::new(Kind::Counter, name, help, labels)
    }

    /// A gauge family.
    pub const fn gauge(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Self {
        Self::new(Kind::Gauge, name, help, labels)
    }

    const fn new(
        kind: Kind,
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Self {
        Self {
            name,
            help,
            kind,
            labels,
        }
    }

    /// An empty family of this spec, whose samples carry its labels.
    pub fn family(&self) -> Family {
        Family::new(self, self.labels.to_vec())
    }

    /// Builds this family per identity: `f` is called for each row (an identity's counters,
    /// its processes summed) with an `emit` that adds a sample labelled with the identity's
    /// labels plus the spec's labels, whose values it is given in order. The family is left
    /// out when no row emitted anything.
    pub fn per_process<P>(
        &self,
        rows: &[Row<P>],
        out: &mut Vec<MetricFamily>,
        f: impl Fn(&ProcStats<P>, &mut dyn FnMut(&[&str], f64)),
    ) {
        let mut names = PROCESS_LABELS.to_vec();
        names.extend_from_slice(self.labels);
        let mut fam = Family::new(self, names);
        for row in rows {
            let base = identity_labels(row);
            f(&row.stats, &mut |extra, v| {
                fam.push_values(base.iter().chain(extra).copied(), v);
            });
        }
        fam.done(out);
    }

    /// [`Spec::per_process`] for a family without further labels: `value` of each process
    /// for which it is Some.
    pub fn per_process_value<P>(
        &self,
        procs: &[Row<P>],
        out: &mut Vec<MetricFamily>,
        value: impl Fn(&ProcStats<P>) -> Option<u64>,
    ) {
        self.per_process(procs, out, |s, emit| {
            if let Some(v) = value(s) {
                emit(&[], v as f64);
            }
        });
    }
}

/// A family under construction.
pub struct Family {
    mf: MetricFamily,
    labels: Vec<&'static str>,
}

impl Family {
    fn new(spec: &Spec, labels: Vec<&'static str>) -> Self {
        let mut mf = MetricFamily::default();
        mf.set_name(spec.name.to_string());
        mf.set_help(spec.help.to_string());
        mf.set_field_type(match spec.kind {
            Kind::Counter => MetricType::COUNTER,
            Kind::Gauge => MetricType::GAUGE,
        });
        Self { mf, labels }
    }

    /// Adds a sample whose label values are `values`, in the order of the labels (extra
    /// values are ignored, missing ones are empty; an empty one of [`OMIT_EMPTY`] is left
    /// out).
    pub fn push(&mut self, values: &[&str], value: f64) {
        self.push_values(values.iter().copied(), value);
    }

    /// [`Family::push`] with the label values from an iterator.
    pub fn push_values<'v>(&mut self, values: impl Iterator<Item = &'v str>, value: f64) {
        let mut values = values.fuse();
        let pairs = self
            .labels
            .iter()
            .filter_map(|name| {
                let value = values.next().unwrap_or("");
                if value.is_empty() && OMIT_EMPTY.contains(name) {
                    return None;
                }
                let mut l = LabelPair::default();
                l.set_name((*name).to_string());
                l.set_value(value.to_string());
                Some(l)
            })
            .collect();
        let mut m = Metric::default();
        m.set_label(pairs);
        if self.mf.get_field_type() == MetricType::COUNTER {
            let mut c = Counter::default();
            c.set_value(value);
            m.set_counter(c);
        } else {
            let mut g = Gauge::default();
            g.set_value(value);
            m.set_gauge(g);
        }
        self.mf.mut_metric().push(m);
    }

    /// Adds the family to `out` when it has samples.
    pub fn done(self, out: &mut Vec<MetricFamily>) {
        if !self.mf.get_metric().is_empty() {
            out.push(self.mf);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn labels_follow_the_spec() {
        const S: Spec = Spec::gauge("x", "help", &["a", "b"]);
        let mut f = S.family();
        f.push(&["1", "2"], 3.0);
        f.push(&["only"], 4.0);
        let mut out = Vec::new();
        f.done(&mut out);
        let text = encode(&out).unwrap();
        assert!(text.contains("x{a=\"1\",b=\"2\"} 3"), "{text}");
        assert!(text.contains("x{a=\"only\",b=\"\"} 4"), "{text}");
        let mut none = Vec::new();
        S.family().done(&mut none);
        assert!(none.is_empty(), "a family without samples is left out");
    }

    #[test]
    fn identity_labels_only_when_known() {
        const K: Spec = Spec::gauge("k", "help", &["kind"]);
        let mut f = Family::new(&K, [PROCESS_LABELS, K.labels].concat());
        f.push(&["wg", "ab", "gw-0", "vpn", "wg", "", "", "x"], 1.0);
        f.push(
            &["sshd", "", "", "", "", "system.slice/ssh.service", "", "y"],
            1.0,
        );
        f.push(&["_other", "", "", "", "", "", "true", "z"], 1.0);
        let mut out = Vec::new();
        f.done(&mut out);
        let text = encode(&out).unwrap();
        assert!(
            text.contains(r#"k{comm="wg",container="ab",pod="gw-0",namespace="vpn",container_name="wg",kind="x"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"k{comm="sshd",container="",cgroup="system.slice/ssh.service",kind="y"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"k{comm="_other",container="",otel_metric_overflow="true",kind="z"} 1"#
            ),
            "{text}"
        );
    }
}
