//! The two text formats `/metrics` speaks, chosen by content negotiation ([`Format`]):
//! Prometheus text 0.0.4 (the `prometheus` crate's encoder) and OpenMetrics 1.0.0, where each
//! counter sample is followed by its `_created` sample ([`super::Created`]). Both escape label values
//! (`comm` is attacker-controlled text).
//!
//! A short burst still shows as an increase in Prometheus when the series existed at 0 before
//! it (a process known to hold a UDP socket gets its drop series at 0, see
//! `store::Store::placeholder`) or when Prometheus ingests created timestamps.

use prometheus::proto::{LabelPair, MetricFamily, MetricType};

/// The exposition formats `/metrics` answers in, chosen from the request's `Accept` header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text format 0.0.4 (no created timestamps): curl, browsers, anything that
    /// does not ask for OpenMetrics.
    Text,
    /// OpenMetrics text; each counter sample is followed by its `_created` sample. `v1`: the
    /// client accepts version 1.0.0 (else only 0.0.1, Prometheus before 2.33; same text).
    OpenMetrics {
        /// Answer as version 1.0.0 (else 0.0.1).
        v1: bool,
    },
}

impl Format {
    /// The format an `Accept` header prefers: OpenMetrics when it ranks it above the text
    /// format (every Prometheus since 2.5 does), else text. Unparseable or missing: text.
    pub fn negotiate(accept: Option<&str>) -> Self {
        let Some(accept) = accept else {
            return Self::Text;
        };
        // (quality, version 1.0.0 acceptable) of OpenMetrics; quality of the text format.
        let (mut om_q, mut om_v1, mut om_q_v1, mut text_q) = (-1.0f32, false, -1.0f32, -1.0f32);
        for range in accept.split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let (mut q, mut version) = (1.0f32, None);
            for p in parts {
                if let Some((k, v)) = p.split_once('=') {
                    let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().trim_matches('"'));
                    match k.as_str() {
                        "q" => q = v.parse().unwrap_or(0.0),
                        "version" => version = Some(v.to_string()),
                        _ => {}
                    }
                }
            }
            match media.as_str() {
                "application/openmetrics-text" => {
                    let v1 = version.as_deref().is_none_or(|v| v.starts_with("1."));
                    om_q = om_q.max(q);
                    if v1 && q > 0.0 {
                        om_v1 = true;
                        om_q_v1 = om_q_v1.max(q);
                    }
                }
                "text/plain" | "text/*" | "*/*" => text_q = text_q.max(q),
                _ => {}
            }
        }
        if om_q > 0.0 && om_q >= text_q {
            // Prefer 1.0.0 unless the client ranks 0.0.1 strictly higher.
            Self::OpenMetrics {
                v1: om_v1 && om_q_v1 >= om_q,
            }
        } else {
            Self::Text
        }
    }

    /// The `Content-Type` of an answer in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Text => "text/plain; version=0.0.4; charset=utf-8",
            Self::OpenMetrics { v1: true } => {
                "application/openmetrics-text; version=1.0.0; charset=utf-8"
            }
            Self::OpenMetrics { v1: false } => {
                "application/openmetrics-text; version=0.0.1; charset=utf-8"
            }
        }
    }
}

/// Escapes a label value (both formats) or an OpenMetrics `HELP` text.
fn escape(s: &str, quote: bool, out: &mut String) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

/// An OpenMetrics number.
fn om_number(v: f64, out: &mut String) {
    use std::fmt::Write as _;
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        let _ = write!(out, "{}", v as i64);
    } else {
        let _ = write!(out, "{v}");
    }
}

fn om_labels(labels: &[LabelPair], out: &mut String) {
    if labels.is_empty() {
        return;
    }
    out.push('{');
    for (i, l) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(l.name());
        out.push_str("=\"");
        escape(l.value(), true, out);
        out.push('"');
    }
    out.push('}');
}

/// Renders families as OpenMetrics text: counter families are named without `_total` and
/// each `_total` sample is followed by its `_created` sample (`created`, one per counter
/// sample in order, from [`Created::stamp`]); gauges named `*_info` with value 1 are `info`
/// families; the text ends with `# EOF`.
pub fn encode_openmetrics(families: &[MetricFamily], created: &[f64]) -> String {
    let mut out = String::with_capacity(64 * 1024);
    let mut cts = created.iter();
    for mf in families {
        let name = mf.name();
        let kind = mf.get_field_type();
        let (family, typ) = match kind {
            MetricType::COUNTER => (name.strip_suffix("_total").unwrap_or(name), "counter"),
            MetricType::HISTOGRAM => (name, "histogram"),
            _ if name.ends_with("_info")
                && mf
                    .get_metric()
                    .iter()
                    .all(|m| m.get_gauge().get_value() == 1.0) =>
            {
                (name.strip_suffix("_info").unwrap_or(name), "info")
            }
            _ => (name, "gauge"),
        };
        out.push_str("# HELP ");
        out.push_str(family);
        out.push(' ');
        escape(mf.help(), true, &mut out);
        out.push_str("\n# TYPE ");
        out.push_str(family);
        out.push(' ');
        out.push_str(typ);
        out.push('\n');
        for m in mf.get_metric() {
            let value = match kind {
                MetricType::COUNTER => m.get_counter().get_value(),
                _ => m.get_gauge().get_value(),
            };
            match typ {
                "counter" => {
                    out.push_str(family);
                    out.push_str("_total");
                    om_labels(m.get_label(), &mut out);
                    out.push(' ');
                    om_number(value, &mut out);
                    out.push('\n');
                    if let Some(ct) = cts.next() {
                        out.push_str(family);
                        out.push_str("_created");
                        om_labels(m.get_label(), &mut out);
                        out.push(' ');
                        om_number(*ct, &mut out);
                        out.push('\n');
                    }
                }
                "histogram" => om_histogram(family, m, &mut out),
                "info" => {
                    out.push_str(family);
                    out.push_str("_info");
                    om_labels(m.get_label(), &mut out);
                    out.push_str(" 1\n");
                }
                _ => {
                    out.push_str(family);
                    om_labels(m.get_label(), &mut out);
                    out.push(' ');
                    om_number(value, &mut out);
                    out.push('\n');
                }
            }
        }
    }
    out.push_str("# EOF\n");
    out
}

/// One histogram's samples: cumulative `_bucket`s (ending at `+Inf`), `_count`, `_sum`.
fn om_histogram(family: &str, m: &prometheus::proto::Metric, out: &mut String) {
    let h = m.get_histogram();
    let bucket = |le: &str, n: u64, out: &mut String| {
        let mut labels = m.get_label().to_vec();
        let mut l = LabelPair::default();
        l.set_name("le".to_string());
        l.set_value(le.to_string());
        labels.push(l);
        out.push_str(family);
        out.push_str("_bucket");
        om_labels(&labels, out);
        out.push(' ');
        om_number(n as f64, out);
        out.push('\n');
    };
    for b in h.get_bucket() {
        let mut le = String::new();
        om_number(b.upper_bound(), &mut le);
        if !le.contains('.') && !le.contains('I') && !le.contains('N') {
            // OpenMetrics bounds are floats: "1.0", not "1".
            le.push_str(".0");
        }
        bucket(&le, b.cumulative_count(), out);
    }
    bucket("+Inf", h.get_sample_count(), out);
    for (suffix, v) in [
        ("_count", h.get_sample_count() as f64),
        ("_sum", h.get_sample_sum()),
    ] {
        out.push_str(family);
        out.push_str(suffix);
        om_labels(m.get_label(), out);
        out.push(' ');
        om_number(v, out);
        out.push('\n');
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
    use crate::exposition::{Created, Health, Spec, created_times, selfmetrics, unix_seconds};
    use crate::store::Parts;
    use crate::store::{ProcMeta, ProcRef, Who};
    use std::collections::BTreeMap;
    use std::time::Duration;
    use std::time::SystemTime;

    /// Drops by reason, as a signal's part would count them.
    #[derive(Clone, Debug, Default)]
    struct T(BTreeMap<&'static str, u64>);

    impl Parts for T {
        fn absorb(&mut self, o: &Self) {
            for (k, v) in &o.0 {
                *self.0.entry(k).or_default() += v;
            }
        }

        fn has_counts(&self) -> bool {
            !self.0.is_empty()
        }

        fn after_exec(&self) -> Self {
            Self::default()
        }
    }

    type Store = crate::store::Store<T>;

    const DROPS: Spec = Spec::counter(
        "bufscope_socket_drops_total",
        "Packets dropped because a socket buffer or queue was full.",
        &["proto", "reason"],
    );

    /// What the collector renders: a per-process family, then bufscope's own.
    /// The identities shown (every pending one admitted).
    fn shown(store: &mut Store) -> Vec<crate::store::Row<T>> {
        store.admit(|_| 1);
        store.rows()
    }

    fn families(
        store: &mut Store,
        health: &Health,
        findings: &crate::advice::Findings,
    ) -> Vec<MetricFamily> {
        let procs = shown(store);
        let mut out = Vec::new();
        DROPS.per_process(&procs, &mut out, |s: &crate::store::ProcStats<T>, emit| {
            for (reason, v) in &s.parts.0 {
                emit(&["udp", reason], *v as f64);
            }
        });
        selfmetrics::families(
            store,
            health,
            findings,
            ["drops"].into_iter(),
            &|_| true,
            &mut out,
        );
        out
    }

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
            cgroup: "/".into(),
            ..ProcMeta::default()
        });
        s.parts.0.insert("SOCKET_RCVBUFF", 5);
        let text = encode(&families(
            &mut store,
            &Health::default(),
            &Default::default(),
        ))
        .unwrap();
        assert!(
            text.contains(r#"bufscope_socket_drops_total{comm="a\"b\\c\nd",container="",cgroup="/",proto="udp",reason="SOCKET_RCVBUFF"} 5"#),
            "{text}"
        );
        // Every sample is on one line: no raw newline inside a label value.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("bufscope_"), "broken line: {line:?}");
        }
    }

    fn store_with(comm: &str, drops: u64) -> Store {
        let mut store = Store::new(10, Duration::from_secs(60));
        let who = Who::Proc(ProcRef {
            tgid: 42,
            start_ticks: 7,
        });
        let s = store.proc_mut(who, || ProcMeta {
            comm: comm.into(),
            container: String::new(),
            cgroup: "/".into(),
            ..ProcMeta::default()
        });
        s.parts.0.insert("SOCKET_RCVBUFF", drops);
        store
    }

    fn health() -> Health {
        Health {
            version: "1.2.3".into(),
            kernel: "6.18".into(),
            ..Health::default()
        }
    }

    #[test]
    fn negotiation_follows_the_accept_header() {
        let om1 = Format::OpenMetrics { v1: true };
        // What Prometheus 2.42 sends.
        assert_eq!(
            Format::negotiate(Some(
                "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
            )),
            om1
        );
        // Prometheus before 2.33: only 0.0.1.
        assert_eq!(
            Format::negotiate(Some(
                "application/openmetrics-text; version=0.0.1,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
            )),
            Format::OpenMetrics { v1: false }
        );
        // Prometheus 3 with protobuf first (not served here), then OpenMetrics.
        assert_eq!(
            Format::negotiate(Some(
                "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.5,application/openmetrics-text;version=1.0.0;q=0.4,text/plain;version=0.0.4;q=0.2"
            )),
            om1
        );
        for text in [
            None,
            Some("*/*"),
            Some("text/plain"),
            Some("text/plain;version=0.0.4,application/openmetrics-text;q=0.5"),
            Some("application/openmetrics-text;q=0"),
            Some("application/json"),
            Some(";;;,=,q=x"),
        ] {
            assert_eq!(Format::negotiate(text), Format::Text, "{text:?}");
        }
        assert!(
            om1.content_type()
                .starts_with("application/openmetrics-text; version=1.0.0")
        );
        assert!(
            Format::Text
                .content_type()
                .starts_with("text/plain; version=0.0.4")
        );
    }

    #[test]
    fn openmetrics_has_created_samples_escaping_and_eof() {
        let mut store = store_with("a\"b\\c\nd", 5);
        // One event without an owner: its series (and HELP) is shown once it counts.
        store.attribution_unknown.insert("drops", 1);
        let fams = families(&mut store, &health(), &Default::default());
        let rows = store.rows();
        let mut created = Created::default();
        let cts = created_times(&mut created, &store, &rows, &fams);
        let text = encode_openmetrics(&fams, &cts);
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(
            text.contains("# TYPE bufscope_socket_drops counter\n"),
            "{text}"
        );
        let total = r#"bufscope_socket_drops_total{comm="a\"b\\c\nd",container="",cgroup="/",proto="udp",reason="SOCKET_RCVBUFF"} 5"#;
        let created_line = r#"bufscope_socket_drops_created{comm="a\"b\\c\nd",container="",cgroup="/",proto="udp",reason="SOCKET_RCVBUFF"} "#;
        let lines: Vec<&str> = text.lines().collect();
        let i = lines.iter().position(|l| *l == total).unwrap();
        let ct: f64 = lines[i + 1]
            .strip_prefix(created_line)
            .unwrap()
            .parse()
            .unwrap();
        let born = unix_seconds(rows[0].stats.born);
        assert_eq!(ct, born, "a new identity's series were 0 when it was made");
        // Info and gauge families; HELP escapes the double quote.
        assert!(text.contains("# TYPE bufscope_build info\nbufscope_build_info{version=\"1.2.3\",kernel=\"6.18\"} 1\n"), "{text}");
        assert!(
            text.contains(
                "# TYPE bufscope_tracked_processes gauge\nbufscope_tracked_processes 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"(counted under comm=\"_unknown\")"#),
            "{text}"
        );
        // Every counter sample has its _created, every other line is a sample or metadata.
        let totals = lines.iter().filter(|l| l.contains("_total")).count();
        let createds = lines.iter().filter(|l| l.contains("_created")).count();
        assert_eq!(totals, createds);
        assert_eq!(cts.len(), totals);
    }

    #[test]
    fn created_times_are_stable_and_new_series_start_after_the_last_exposition() {
        let mut store = store_with("a", 5);
        let mut created = Created::default();
        let fams = families(&mut store, &health(), &Default::default());
        let first = created_times(&mut created, &store, &store.rows(), &fams);
        let started = unix_seconds(store.started());
        // Self-metrics count since the exporter started.
        let fams_names: Vec<&str> = fams
            .iter()
            .filter(|f| f.get_field_type() == MetricType::COUNTER)
            .flat_map(|f| f.get_metric().iter().map(move |_| f.name()))
            .collect();
        let i = fams_names
            .iter()
            .position(|n| *n == "bufscope_folded_processes_total")
            .unwrap();
        assert_eq!(first[i], started);
        std::thread::sleep(Duration::from_millis(20));
        // A second exposition: same created times.
        let fams = families(&mut store, &health(), &Default::default());
        let again = created_times(&mut created, &store, &store.rows(), &fams);
        assert_eq!(first, again);
        let before_new = unix_seconds(SystemTime::now());
        std::thread::sleep(Duration::from_millis(20));
        // A new series of a process exposed before: created at the previous exposition
        // (it was absent then), not at the process's entry.
        let who = Who::Proc(ProcRef {
            tgid: 42,
            start_ticks: 7,
        });
        store
            .proc_mut(who, Default::default)
            .parts
            .0
            .insert("PROTO_MEM", 3);
        let fams = families(&mut store, &health(), &Default::default());
        let third = created_times(&mut created, &store, &store.rows(), &fams);
        let text = encode_openmetrics(&fams, &third);
        let line = text
            .lines()
            .find(|l| l.starts_with("bufscope_socket_drops_created") && l.contains("PROTO_MEM"))
            .unwrap();
        let ct: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(
            ct > first[0] && ct <= before_new,
            "{ct} vs {} .. {before_new}",
            first[0]
        );
        // A series that went away and came back is new again.
        let mut c2 = Created::default();
        let fams = families(&mut store, &health(), &Default::default());
        created_times(&mut c2, &store, &store.rows(), &fams);
        assert_eq!(c2.len(), created.len());
        created_times(&mut c2, &Store::new(10, Duration::from_secs(1)), &[], &[]);
        assert!(c2.is_empty());
    }
}
