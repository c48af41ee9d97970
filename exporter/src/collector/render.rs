//! The render cache: every scrape of one generation (nothing changed since: they queued
//! behind one poll) shares one body per format; the OpenMetrics created times live here.

use std::time::Duration;

use axum::body::Bytes;
use prometheus::proto::MetricFamily;

use crate::advice::Findings;
use crate::attribution::procfs::Procfs;
use crate::exposition::{self, Created, Format, Health, selfmetrics};
use crate::signals::{self, Row, Signal, Store};

/// What one exposition shows, besides the rooms' families.
pub struct Exposed<'a> {
    /// The attached rooms.
    pub rooms: &'a [Box<dyn Signal>],
    /// Per-process counters.
    pub store: &'a Store,
    /// The identities shown ([`Store::rows`]).
    pub rows: &'a [Row],
    /// Health facts.
    pub health: &'a Health,
    /// The advice's findings.
    pub findings: &'a Findings,
    /// How long each room's last poll took.
    pub poll_durations: &'a [(&'static str, Duration)],
    /// (probe, run time ns, runs), with `--bpf.run-stats`.
    pub probe_runs: &'a [(&'static str, u64, u64)],
    /// The collector's own families (lock holds, ring backlog, look-ups).
    pub collector: Vec<MetricFamily>,
    /// `/proc` (`--path.procfs`): which processes still run (None: every tracked one is
    /// taken as running).
    pub procfs: Option<&'a Procfs>,
}

/// The last body rendered and the generation it shows.
#[derive(Default)]
pub struct RenderCache {
    /// Bumped by everything that changes what a render shows (a poll, a drain that read
    /// events, GC).
    generation: u64,
    /// The last body rendered: its generation, format and text.
    rendered: Option<(u64, Format, Bytes)>,
    /// Created times of the counter series (OpenMetrics `_created`).
    pub created: Created,
    /// OpenMetrics `_created` samples are rendered (`--web.openmetrics-created`).
    pub created_samples: bool,
}

impl RenderCache {
    /// What a render shows changed.
    pub fn changed(&mut self) {
        self.generation += 1;
    }

    /// The body in `format`: the last one when nothing changed since it was rendered in that
    /// format, else `render`'s (then kept).
    pub fn shared(
        &mut self,
        format: Format,
        render: impl FnOnce(Option<&mut Created>) -> String,
    ) -> Bytes {
        if let Some((generation, f, body)) = &self.rendered
            && *generation == self.generation
            && *f == format
        {
            return body.clone();
        }
        let created = self.created_samples.then_some(&mut self.created);
        let body = Bytes::from(render(created));
        self.rendered = Some((self.generation, format, body.clone()));
        body
    }
}

/// The exposition of `e` in `format`. Every sample is the counter's current value for every
/// client: nothing depends on who scraped before. OpenMetrics adds each counter's `_created`
/// time ([`Created`]) when `created` is given (`--web.openmetrics-created`).
pub fn render(e: &Exposed<'_>, format: Format, created: Option<&mut Created>) -> String {
    render_counted(e, format, created).0
}

/// [`render`], and the number of per-process series of identities with their own (the
/// budget's use).
pub fn render_counted(
    e: &Exposed<'_>,
    format: Format,
    created: Option<&mut Created>,
) -> (String, usize) {
    let fams = families(e);
    let used = own_series(&fams);
    let text = encode_as(e, format, created, &fams);
    (text, used)
}

/// The samples of per-process families on identities with series of their own (not the
/// overflow one, not `_unknown`).
pub fn own_series(fams: &[prometheus::proto::MetricFamily]) -> usize {
    fams.iter()
        .filter(|f| f.name() != "bufscope_finding" && f.name() != "bufscope_process_info")
        .flat_map(|f| f.get_metric())
        .filter(|m| {
            let labels = m.get_label();
            labels.first().is_some_and(|l| l.name() == "comm")
                && !labels.iter().any(|l| {
                    (l.name() == exposition::OVERFLOW_LABEL)
                        || (l.name() == "comm" && l.value() == crate::store::UNKNOWN_COMM)
                })
        })
        .count()
}

/// How many series `row` would have (an identity not decided yet: [`Store::admit`]).
pub fn series_of(rooms: &[Box<dyn Signal>], row: &Row) -> usize {
    signals::families(rooms, std::slice::from_ref(row))
        .iter()
        .map(|f| f.get_metric().len())
        .sum()
}

fn encode_as(
    e: &Exposed<'_>,
    format: Format,
    created: Option<&mut Created>,
    fams: &[MetricFamily],
) -> String {
    match format {
        Format::Text => exposition::encode(fams).unwrap_or_else(|err| {
            tracing::error!("encoding metrics: {err}");
            String::new()
        }),
        Format::OpenMetrics { .. } => {
            let times = created.map_or_else(Vec::new, |c| {
                exposition::created_times(c, e.store, e.rows, fams)
            });
            exposition::encode_openmetrics(fams, &times)
        }
    }
}

/// Every family: the rooms', bufscope's own health, its own cost.
fn families(e: &Exposed<'_>) -> Vec<MetricFamily> {
    let mut fams = signals::families(e.rooms, e.rows);
    let alive = |p: &crate::store::ProcRef| {
        e.procfs
            .is_none_or(|fs| fs.start_ticks(p.tgid) == Some(p.start_ticks))
    };
    selfmetrics::families(
        e.store,
        e.health,
        e.findings,
        signals::attributed(),
        &alive,
        &mut fams,
    );
    exposition::process::families(
        exposition::process::read_self().as_ref(),
        e.poll_durations,
        e.probe_runs,
        &mut fams,
    );
    fams.extend(e.collector.iter().cloned());
    fams
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signals::testkit::Bench;

    #[test]
    fn scrapes_of_one_generation_share_one_body() {
        let mut c = RenderCache::default();
        let mut n = 0;
        let mut render = |_: Option<&mut Created>| {
            n += 1;
            format!("body {n}")
        };
        let a = c.shared(Format::Text, &mut render);
        let b = c.shared(Format::Text, &mut render);
        assert_eq!(a.as_ptr(), b.as_ptr(), "the same body, not a copy");
        let om = c.shared(Format::OpenMetrics { v1: true }, &mut render);
        assert_ne!(om.as_ptr(), a.as_ptr(), "another format is rendered");
        c.changed();
        let after = c.shared(Format::Text, &mut render);
        assert_eq!(&after[..], b"body 3", "a change renders anew");
    }

    /// bufscope's own families are there with no room attached, in both formats.
    #[test]
    fn renders_the_health_families_without_rooms() {
        let b = Bench::new();
        let health = Health {
            version: "9.9".into(),
            kernel: "6.18".into(),
            ..Health::default()
        };
        let e = Exposed {
            rooms: &[],
            store: &b.store,
            rows: &[],
            health: &health,
            findings: &Findings::default(),
            poll_durations: &[("drops", Duration::from_millis(2))],
            probe_runs: &[],
            collector: Vec::new(),
            procfs: None,
        };
        let mut created = Created::default();
        let text = render(&e, Format::Text, Some(&mut created));
        assert!(
            text.contains(r#"bufscope_build_info{version="9.9",kernel="6.18"} 1"#),
            "{text}"
        );
        assert!(
            text.contains("bufscope_signal_poll_duration_seconds"),
            "{text}"
        );
        let om = render(&e, Format::OpenMetrics { v1: true }, Some(&mut created));
        assert!(om.ends_with("# EOF\n"), "{om}");
        assert!(om.contains("_created"), "{om}");
        let plain = render(&e, Format::OpenMetrics { v1: true }, None);
        assert!(!plain.contains("_created"), "{plain}");
    }
}
