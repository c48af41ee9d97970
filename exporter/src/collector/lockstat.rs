//! How long the collector's lock is held, by whom: every hold is timed when its guard drops
//! ([`Held`]) into a histogram per holder and a worst-in-the-last-minute gauge
//! (`bufscope_collector_lock_hold_seconds`, `bufscope_collector_lock_hold_max_seconds`). A
//! scrape waits for whoever holds the lock: these say who made it wait, and for how long.

use std::ops::{Deref, DerefMut};
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use prometheus::proto::{Bucket, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType};

use super::Collector;

/// Who holds the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Holder {
    /// An HTTP request (`/metrics`, the API, the status page): its poll and its answer.
    Request,
    /// The periodic poll of the maps.
    Poll,
    /// The drain of the event ring buffer.
    Drain,
    /// Garbage collection (its `/proc` pass runs without the lock).
    Gc,
    /// Applying what an owner look-up found (the look-up itself runs without the lock).
    Lookup,
}

impl Holder {
    const ALL: [Holder; 5] = [
        Holder::Request,
        Holder::Poll,
        Holder::Drain,
        Holder::Gc,
        Holder::Lookup,
    ];

    /// The `holder` label.
    pub fn name(self) -> &'static str {
        match self {
            Holder::Request => "request",
            Holder::Poll => "poll",
            Holder::Drain => "drain",
            Holder::Gc => "gc",
            Holder::Lookup => "lookup",
        }
    }
}

/// Upper bounds of the histogram's buckets, seconds.
pub const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// The window of the worst-hold gauge: the longest hold in the current and the previous
/// window of this length.
const MAX_WINDOW: Duration = Duration::from_secs(60);

/// One holder's holds.
#[derive(Clone, Debug, Default)]
struct Holds {
    /// Holds no longer than each bucket's bound (not cumulative; the exposition sums).
    buckets: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
    /// The longest hold in the current window and in the previous one.
    max_now: f64,
    max_before: f64,
}

/// Every holder's holds.
#[derive(Debug)]
pub struct LockStats {
    holds: [Holds; Holder::ALL.len()],
    window_start: Instant,
}

impl Default for LockStats {
    fn default() -> Self {
        Self {
            holds: Default::default(),
            window_start: Instant::now(),
        }
    }
}

impl LockStats {
    /// Records one hold of `held` by `who`, ending at `now`.
    pub fn record(&mut self, who: Holder, held: Duration, now: Instant) {
        self.roll(now);
        let secs = held.as_secs_f64();
        let h = &mut self.holds[who as usize];
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            h.buckets[i] += 1;
        }
        h.count += 1;
        h.sum += secs;
        h.max_now = h.max_now.max(secs);
    }

    /// Starts a new window when the current one is over (every record does; the exposition
    /// calls it first).
    pub fn roll(&mut self, now: Instant) {
        let age = now.saturating_duration_since(self.window_start);
        if age < MAX_WINDOW {
            return;
        }
        let idle_window = age >= MAX_WINDOW * 2;
        for h in &mut self.holds {
            h.max_before = if idle_window { 0.0 } else { h.max_now };
            h.max_now = 0.0;
        }
        self.window_start = now;
    }

    /// The longest hold by `who` in the last one to two minutes.
    pub fn worst(&self, who: Holder) -> Duration {
        let h = &self.holds[who as usize];
        Duration::from_secs_f64(h.max_now.max(h.max_before))
    }

    /// The two families (holders that never held the lock are left out).
    pub fn families(&self, out: &mut Vec<MetricFamily>) {
        let label = |who: Holder| {
            let mut l = LabelPair::default();
            l.set_name("holder".to_string());
            l.set_value(who.name().to_string());
            l
        };
        let mut hist = MetricFamily::default();
        hist.set_name("bufscope_collector_lock_hold_seconds".to_string());
        hist.set_help(
            "How long the collector's lock was held, by holder (a scrape waits for whoever \
             holds it)."
                .to_string(),
        );
        hist.set_field_type(MetricType::HISTOGRAM);
        let mut max = MetricFamily::default();
        max.set_name("bufscope_collector_lock_hold_max_seconds".to_string());
        max.set_help(
            "The longest hold of the collector's lock in the last one to two minutes, by holder."
                .to_string(),
        );
        max.set_field_type(MetricType::GAUGE);
        for who in Holder::ALL {
            let h = &self.holds[who as usize];
            if h.count == 0 {
                continue;
            }
            let mut hg = Histogram::default();
            let mut cumulative = 0;
            let buckets = BUCKETS
                .iter()
                .zip(h.buckets)
                .map(|(bound, n)| {
                    cumulative += n;
                    let mut b = Bucket::default();
                    b.set_upper_bound(*bound);
                    b.set_cumulative_count(cumulative);
                    b
                })
                .collect();
            hg.set_bucket(buckets);
            hg.set_sample_count(h.count);
            hg.set_sample_sum(h.sum);
            let mut m = Metric::default();
            m.set_label(vec![label(who)]);
            m.set_histogram(hg);
            hist.mut_metric().push(m);
            let mut g = Gauge::default();
            g.set_value(h.max_now.max(h.max_before));
            let mut m = Metric::default();
            m.set_label(vec![label(who)]);
            m.set_gauge(g);
            max.mut_metric().push(m);
        }
        if !hist.get_metric().is_empty() {
            out.push(hist);
            out.push(max);
        }
    }
}

/// The collector, locked by `who`: the hold is timed when this drops.
pub struct Held<'a> {
    guard: MutexGuard<'a, Collector>,
    who: Holder,
    since: Instant,
}

impl<'a> Held<'a> {
    pub(super) fn new(guard: MutexGuard<'a, Collector>, who: Holder) -> Self {
        Self {
            guard,
            who,
            since: Instant::now(),
        }
    }
}

impl Deref for Held<'_> {
    type Target = Collector;

    fn deref(&self) -> &Collector {
        &self.guard
    }
}

impl DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Collector {
        &mut self.guard
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let now = Instant::now();
        let held = now.saturating_duration_since(self.since);
        self.guard.lock_stats.record(self.who, held, now);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn holds_land_in_their_bucket_and_the_worst_is_kept_for_a_window() {
        let mut s = LockStats::default();
        let t0 = s.window_start;
        s.record(Holder::Poll, Duration::from_millis(3), t0);
        s.record(Holder::Poll, Duration::from_millis(30), t0);
        s.record(Holder::Request, Duration::from_micros(100), t0);
        assert_eq!(s.worst(Holder::Poll), Duration::from_millis(30));
        let mut out = Vec::new();
        s.families(&mut out);
        let hist = &out[0];
        assert_eq!(
            hist.get_metric().len(),
            2,
            "request and poll; no empty holders"
        );
        let poll = hist
            .get_metric()
            .iter()
            .find(|m| m.get_label()[0].value() == "poll")
            .unwrap()
            .get_histogram();
        assert_eq!(poll.get_sample_count(), 2);
        let le = |bound: f64| {
            poll.get_bucket()
                .iter()
                .find(|b| b.upper_bound() == bound)
                .unwrap()
                .cumulative_count()
        };
        assert_eq!((le(0.0025), le(0.005), le(0.025), le(0.05)), (0, 1, 1, 2));
        // A minute later the worst is still shown; two quiet minutes later it is gone.
        s.record(Holder::Poll, Duration::from_millis(1), t0 + MAX_WINDOW);
        assert_eq!(s.worst(Holder::Poll), Duration::from_millis(30));
        s.record(Holder::Poll, Duration::from_millis(1), t0 + MAX_WINDOW * 4);
        assert_eq!(s.worst(Holder::Poll), Duration::from_millis(1));
    }
}
