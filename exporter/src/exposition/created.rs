//! OpenMetrics `_created`: when each counter series was created (its last known 0), fixed
//! once given and the same for every client; with adopted pins, when the pinned maps began
//! counting.

use std::time::SystemTime;

use prometheus::proto::{LabelPair, MetricFamily, MetricType};

use crate::store::{Parts, Store};

/// Unix seconds of `t` (0 before the epoch).
pub fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// When each counter series was created, for OpenMetrics `_created` samples (Prometheus with
/// `--enable-feature=created-timestamp-zero-ingestion` stores a 0 at that time, so a series
/// that appears with its first count still shows that count as an increase).
///
/// A series' created time is the latest moment bufscope knows it was 0: when its process's
/// entry was made ([`ProcStats::born`]), or, for a series that appeared later in a process
/// already exposed, the previous OpenMetrics exposition (it was absent then). It is fixed
/// once given and the same for every client; a series that leaves (its process exited past
/// retention or was folded) and comes back gets a new one, which is a reset.
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
    /// The system's boot (Unix seconds, `btime` of /proc/stat).
    boot: f64,
    /// Clock ticks per second (`/proc/<pid>/stat` start times).
    hz: f64,
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
    /// pinned maps, which count since `since`, Unix seconds) get, as created time, the later of
    /// `since` and their process's start, so that a restart is no reset (a 0 stored at the
    /// restart would make the adopted total look like a burst).
    pub fn pinned_since(&mut self, since: f64, families: Vec<&'static str>) {
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("btime "))
                    .and_then(|v| v.trim().parse::<f64>().ok())
            })
            .unwrap_or(0.0);
        self.pinned = Some(PinnedSince {
            since,
            boot,
            hz: crate::attribution::procfs::clk_tck() as f64,
            families,
        });
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
    /// by `pid` label value, when that process's entry was made (`""`: the exporter's start).
    pub fn stamp(
        &mut self,
        fams: &[MetricFamily],
        born: &foldhash::HashMap<String, f64>,
        started: f64,
        now: f64,
    ) -> Vec<f64> {
        self.stamp_with(fams, born, None, started, now)
    }

    /// [`Created::stamp`], with (for the families read from pinned maps) each process's
    /// zero time from `pinned_born` and `pinned_started` for the pseudo-processes.
    fn stamp_with(
        &mut self,
        fams: &[MetricFamily],
        born: &foldhash::HashMap<String, f64>,
        pinned_born: Option<(&foldhash::HashMap<String, f64>, f64)>,
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
            let from_pins = pinned_born.filter(|_| {
                self.pinned
                    .as_ref()
                    .is_some_and(|p| p.families.contains(&mf.name()))
            });
            let (born, started, last) = match from_pins {
                // Counting went on while no bufscope ran: no "absent at the last exposition".
                Some((b, s)) => (b, s, None),
                None => (born, started, self.last),
            };
            for m in mf.get_metric() {
                let key = self.key(mf.name(), m.get_label());
                let ct = match self.at.get(&key) {
                    Some(ct) => *ct,
                    None => {
                        let pid = m
                            .get_label()
                            .iter()
                            .find(|l| l.name() == "pid")
                            .map(|l| l.value());
                        let born = pid.and_then(|p| born.get(p)).copied().unwrap_or(started);
                        // Never after now: the zero must come before the first sample.
                        born.max(last.unwrap_or(started)).min(now)
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

/// The created time of every counter sample of `fams` (see [`Created::stamp`]), with each
/// process's entry time from `store`.
pub fn created_times<P: Parts>(
    created: &mut Created,
    store: &Store<P>,
    fams: &[MetricFamily],
) -> Vec<f64> {
    let born: foldhash::HashMap<String, f64> = store
        .iter()
        .map(|(pid, s)| (pid, unix_seconds(s.born)))
        .collect();
    let pinned: Option<(foldhash::HashMap<String, f64>, f64)> = created.pinned.as_ref().map(|p| {
        let zero = store
            .procs()
            .map(|(r, _)| {
                let start = p.boot + r.start_ticks as f64 / p.hz.max(1.0);
                (r.tgid.to_string(), p.since.max(start))
            })
            .collect();
        (zero, p.since)
    });
    created.stamp_with(
        fams,
        &born,
        pinned.as_ref().map(|(z, s)| (z, *s)),
        unix_seconds(store.started()),
        unix_seconds(SystemTime::now()),
    )
}
