//! How long the collector's lock is held, by whom: every hold is timed when its guard drops
//! ([`Held`]) into one histogram of every holder's holds and a worst-in-the-last-minute gauge
//! per holder (`bufscope_collector_lock_hold_seconds`,
//! `bufscope_collector_lock_hold_max_seconds{holder}`). A scrape waits for whoever holds the
//! lock: the histogram says how long scrapes may wait, the gauges who made them wait. One
//! histogram, not one per holder: its 11 series are a fixed part of the node's series budget
//! (five per-holder histograms were 85).

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

/// Upper bounds of the histogram's buckets, seconds: sub-millisecond holds (a request that
/// finds its body rendered), the few milliseconds of a poll, the 20 ms a hold should stay
/// under, and the long tail.
pub const BUCKETS: [f64; 8] = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.25, 1.0];

/// The window of the worst-hold gauge: the longest hold in the current and the previous
/// window of this length.
const MAX_WINDOW: Duration = Duration::from_secs(60);

/// One holder's worst holds.
#[derive(Clone, Copy, Debug, Default)]
struct Worst {
    /// It held the lock at least once (its gauge is shown from then on).
    held: bool,
    /// The longest hold in the current window and in the previous one.
    max_now: f64,
    max_before: f64,
}

/// Every hold, and each holder's worst.
#[derive(Debug)]
pub struct LockStats {
    /// Holds no longer than each bucket's bound (not cumulative; the exposition sums).
    buckets: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
    worst: [Worst; Holder::ALL.len()],
    window_start: Instant,
}

impl Default for LockStats {
    fn default() -> Self {
        Self {
            buckets: [0; BUCKETS.len()],
            count: 0,
            sum: 0.0,
            worst: Default::default(),
            window_start: Instant::now(),
        }
    }
}

impl LockStats {
    /// Records one hold of `held` by `who`, ending at `now`.
    pub fn record(&mut self, who: Holder, held: Duration, now: Instant) {
        self.roll(now);
        let secs = held.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            self.buckets[i] += 1;
        }
        self.count += 1;
        self.sum += secs;
        let w = &mut self.worst[who as usize];
        w.held = true;
        w.max_now = w.max_now.max(secs);
    }

    /// Starts a new window when the current one is over (every record does; the exposition
    /// calls it first).
    pub fn roll(&mut self, now: Instant) {
        let age = now.saturating_duration_since(self.window_start);
        if age < MAX_WINDOW {
            return;
        }
        let idle_window = age >= MAX_WINDOW * 2;
        for w in &mut self.worst {
            w.max_before = if idle_window { 0.0 } else { w.max_now };
            w.max_now = 0.0;
        }
        self.window_start = now;
    }

    /// The longest hold by `who` in the last one to two minutes.
    pub fn worst(&self, who: Holder) -> Duration {
        let w = &self.worst[who as usize];
        Duration::from_secs_f64(w.max_now.max(w.max_before))
    }

    /// The two families (holders that never held the lock have no gauge; nothing before the
    /// first hold).
    pub fn families(&self, out: &mut Vec<MetricFamily>) {
        if self.count == 0 {
            return;
        }
        let mut hist = MetricFamily::default();
        hist.set_name("bufscope_collector_lock_hold_seconds".to_string());
        hist.set_help(
            "How long the collector's lock was held, every holder's holds (a scrape waits for \
             whoever holds it; bufscope_collector_lock_hold_max_seconds says who)."
                .to_string(),
        );
        hist.set_field_type(MetricType::HISTOGRAM);
        let mut hg = Histogram::default();
        let mut cumulative = 0;
        let buckets = BUCKETS
            .iter()
            .zip(self.buckets)
            .map(|(bound, n)| {
                cumulative += n;
                let mut b = Bucket::default();
                b.set_upper_bound(*bound);
                b.set_cumulative_count(cumulative);
                b
            })
            .collect();
        hg.set_bucket(buckets);
        hg.set_sample_count(self.count);
        hg.set_sample_sum(self.sum);
        let mut m = Metric::default();
        m.set_histogram(hg);
        hist.mut_metric().push(m);
        out.push(hist);
        let mut max = MetricFamily::default();
        max.set_name("bufscope_collector_lock_hold_max_seconds".to_string());
        max.set_help(
            "The longest hold of the collector's lock in the last one to two minutes, by holder."
                .to_string(),
        );
        max.set_field_type(MetricType::GAUGE);
        for who in Holder::ALL {
            let w = &self.worst[who as usize];
            if !w.held {
                continue;
            }
            let mut l = LabelPair::default();
            l.set_name("holder".to_string());
            l.set_value(who.name().to_string());
            let mut g = Gauge::default();
            g.set_value(w.max_now.max(w.max_before));
            let mut m = Metric::default();
            m.set_label(vec![l]);
            m.set_gauge(g);
            max.mut_metric().push(m);
        }
        out.push(max);
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
        let mut empty = Vec::new();
        s.families(&mut empty);
        assert!(empty.is_empty(), "nothing before the first hold");
        let t0 = s.window_start;
        s.record(Holder::Poll, Duration::from_millis(3), t0);
        s.record(Holder::Poll, Duration::from_millis(30), t0);
        s.record(Holder::Request, Duration::from_micros(100), t0);
        assert_eq!(s.worst(Holder::Poll), Duration::from_millis(30));
        let mut out = Vec::new();
        s.families(&mut out);
        let hist = &out[0];
        assert_eq!(hist.get_metric().len(), 1, "one histogram, no holder label");
        let h = hist.get_metric()[0].get_histogram();
        assert!(hist.get_metric()[0].get_label().is_empty());
        assert_eq!(h.get_sample_count(), 3);
        let le = |bound: f64| {
            h.get_bucket()
                .iter()
                .find(|b| b.upper_bound() == bound)
                .unwrap()
                .cumulative_count()
        };
        assert_eq!((le(0.001), le(0.0025), le(0.005), le(0.05)), (1, 1, 2, 3));
        let holders: Vec<&str> = out[1]
            .get_metric()
            .iter()
            .map(|m| m.get_label()[0].value())
            .collect();
        assert_eq!(holders, ["request", "poll"], "only holders that held it");
        // A minute later the worst is still shown; two quiet minutes later it is gone.
        s.record(Holder::Poll, Duration::from_millis(1), t0 + MAX_WINDOW);
        assert_eq!(s.worst(Holder::Poll), Duration::from_millis(30));
        s.record(Holder::Poll, Duration::from_millis(1), t0 + MAX_WINDOW * 4);
        assert_eq!(s.worst(Holder::Poll), Duration::from_millis(1));
    }
}
