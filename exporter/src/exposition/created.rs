//! OpenMetrics `_created`: when each counter series was created (its last known 0), fixed
//! once given and the same for every client; with adopted pins, when the pinned maps began
//! counting.

use std::time::SystemTime;

use prometheus::proto::{LabelPair, MetricFamily, MetricType};

use crate::store::{Parts, Row, Store};

/// Unix seconds of `t` (0 before the epoch).
pub fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// When each counter series was created, for OpenMetrics `_created` samples (Prometheus with
/// `--enable-feature=created-timestamp-zero-ingestion` stores a 0 at that time, so a series
/// that appears with its first count still shows that count as an increase).
///
/// A series' created time is the latest moment bufscope knows it was 0: when its identity was
/// made ([`crate::store::Series::born`]), or, for a series that appeared later in an identity
/// already exposed, the previous OpenMetrics exposition (it was absent then). It is fixed
/// once given and the same for every client; a series that leaves (its identity had no
/// process for the retention window) and comes back gets a new one, which is a reset.
#[derive(Debug)]
pub struct Created {
    /// Series (hash of name and labels) → Unix seconds.
    at: foldhash::HashMap<u64, f64>,
    /// When the previous OpenMetrics exposition was made.
    last: Option<f64>,
    hasher: foldhash::quality::FixedState,
    /// With adopted pins: the counters read from pinned maps were 0 when the maps were made,
    /// not when this bufscope started ([`Created::pinned_since`]).
    pinned: Option<PinnedSince>,
}

/// When pinned maps began counting, and which families they feed.
#[derive(Clone, Debug)]
struct PinnedSince {
    /// The maps' creation (Unix seconds).
    since: f64,
    /// Counter families read from the maps ([`crate::signals::Signal::map_counters`]).
    families: Vec<&'static str>,
}

impl Default for Created {
    fn default() -> Self {
        Self {
            at: foldhash::HashMap::default(),
            last: None,
            hasher: foldhash::quality::FixedState::with_seed(0x6275_6673),
            pinned: None,
        }
    }
}

impl Created {
    /// With pins kept from an earlier bufscope: the series of `families` (read from the
    /// pinned maps, which count since `since`, Unix seconds) get `since` as created time, so
    /// that a restart is no reset (a 0 stored at the restart would make the adopted total
    /// look like a burst).
    pub fn pinned_since(&mut self, since: f64, families: Vec<&'static str>) {
        self.pinned = Some(PinnedSince { since, families });
    }

    fn key(&self, name: &str, labels: &[LabelPair]) -> u64 {
        use std::hash::{BuildHasher as _, Hash as _, Hasher as _};
        let mut h = self.hasher.build_hasher();
        name.hash(&mut h);
        for l in labels {
            l.name().hash(&mut h);
            l.value().hash(&mut h);
        }
        h.finish()
    }

    /// The created time of every counter sample of `fams`, in order (families, then samples):
    /// kept from before, or new ones for series not seen at the previous call. `born` gives,
    /// by identity ([`identity_key`] of its labels), when it was made (others: the
    /// exporter's start).
    pub fn stamp(
        &mut self,
        fams: &[MetricFamily],
        born: &foldhash::HashMap<String, f64>,
        started: f64,
        now: f64,
    ) -> Vec<f64> {
        self.stamp_with(fams, born, None, started, now)
    }

    /// [`Created::stamp`], with (for the families read from pinned maps, and every identity
    /// an earlier bufscope left) the zero time `pinned`: when the maps began counting.
    fn stamp_with(
        &mut self,
        fams: &[MetricFamily],
        born: &foldhash::HashMap<String, f64>,
        pinned: Option<f64>,
        started: f64,
        now: f64,
    ) -> Vec<f64> {
        let mut next = foldhash::HashMap::default();
        next.reserve(self.at.len());
        let mut out = Vec::new();
        for mf in fams {
            if mf.get_field_type() != MetricType::COUNTER {
                continue;
            }
            let from_pins = pinned.filter(|_| {
                self.pinned
                    .as_ref()
                    .is_some_and(|p| p.families.contains(&mf.name()))
            });
            for m in mf.get_metric() {
                let key = self.key(mf.name(), m.get_label());
                let ct = match (self.at.get(&key), from_pins) {
                    (Some(ct), _) => *ct,
                    // Counting went on while no bufscope ran: no "absent at the last
                    // exposition".
                    (None, Some(since)) => since.min(now),
                    (None, None) => {
                        let born = born
                            .get(&identity_key(m.get_label()))
                            .copied()
                            .unwrap_or(started);
                        // Never after now: the zero must come before the first sample.
                        born.max(self.last.unwrap_or(started)).min(now)
                    }
                };
                next.insert(key, ct);
                out.push(ct);
            }
        }
        self.at = next;
        self.last = Some(now);
        out
    }

    /// Number of series with a created time (self-check, tests).
    pub fn len(&self) -> usize {
        self.at.len()
    }

    /// True when no series has one yet.
    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }
}

/// The identity a sample's labels name (the values of [`super::PROCESS_LABELS`], absent ones
/// empty), as a map key.
pub fn identity_key(labels: &[LabelPair]) -> String {
    let mut key = String::new();
    for name in super::PROCESS_LABELS {
        if let Some(l) = labels.iter().find(|l| l.name() == *name) {
            key.push_str(l.value());
        }
        key.push('\u{1}');
    }
    key
}

/// [`identity_key`] of a row.
pub fn row_key<P>(row: &Row<P>) -> String {
    let mut key = String::new();
    for v in super::identity_labels(row) {
        key.push_str(v);
        key.push('\u{1}');
    }
    key
}

/// The created time of every counter sample of `fams` (see [`Created::stamp`]), with each
/// identity's birth from `rows`.
pub fn created_times<P: Parts>(
    created: &mut Created,
    store: &Store<P>,
    rows: &[Row<P>],
    fams: &[MetricFamily],
) -> Vec<f64> {
    let born: foldhash::HashMap<String, f64> = rows
        .iter()
        .map(|r| (row_key(r), unix_seconds(r.stats.born)))
        .collect();
    let pinned = created.pinned.as_ref().map(|p| p.since);
    created.stamp_with(
        fams,
        &born,
        pinned,
        unix_seconds(store.started()),
        unix_seconds(SystemTime::now()),
    )
}
