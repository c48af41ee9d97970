//! When the collector last completed a poll and a drain, readable without its lock.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// When the collector last completed a poll of the maps and a drain of the ring buffer,
/// readable without the collector's lock: `/healthz` must answer while a stuck collector
/// holds it.
#[derive(Debug)]
pub struct Heartbeat {
    start: Instant,
    /// Milliseconds after `start` when the last poll completed (0: none yet).
    poll_ms: AtomicU64,
    /// Likewise for the last drain of the ring buffer (every poll drains too).
    drain_ms: AtomicU64,
    /// Every probe that was attached lost its pinned link since.
    none_attached: AtomicBool,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            poll_ms: AtomicU64::new(0),
            drain_ms: AtomicU64::new(0),
            none_attached: AtomicBool::new(false),
        }
    }
}

impl Heartbeat {
    fn beat(&self, which: &AtomicU64) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        which.store(ms.max(1), Ordering::Relaxed);
    }

    /// A poll completed.
    pub fn polled(&self) {
        self.beat(&self.poll_ms);
    }

    /// A drain of the ring buffer completed.
    pub fn drained(&self) {
        self.beat(&self.drain_ms);
    }

    /// How long ago the collector started.
    pub fn since_start(&self) -> Duration {
        self.start.elapsed()
    }

    /// Records whether every probe that attached has since lost its pinned link.
    pub fn set_none_attached(&self, none: bool) {
        self.none_attached.store(none, Ordering::Relaxed);
    }

    /// Whether every probe that attached has since lost its pinned link.
    pub fn none_attached(&self) -> bool {
        self.none_attached.load(Ordering::Relaxed)
    }

    /// Why the collector looks stuck: its last completed poll or drain (or its start, before
    /// the first) is more than `stale` ago. None while both are fresh.
    pub fn stale(&self, stale: Duration) -> Option<String> {
        let now = self.start.elapsed();
        [
            ("poll of the probes' maps", &self.poll_ms),
            ("drain of the event ring buffer", &self.drain_ms),
        ]
        .into_iter()
        .find_map(|(what, at)| {
            let ago = now.saturating_sub(Duration::from_millis(at.load(Ordering::Relaxed)));
            (ago > stale).then(|| {
                format!(
                    "the last successful {what} {} {:.1}s ago (more than {:.0}s): the collector \
                     is stuck",
                    if at.load(Ordering::Relaxed) == 0 {
                        "was never; bufscope started"
                    } else {
                        "ended"
                    },
                    ago.as_secs_f64(),
                    stale.as_secs_f64()
                )
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeat_names_what_stopped() {
        let h = Heartbeat::default();
        assert_eq!(h.stale(Duration::from_secs(10)), None, "fresh at start");
        std::thread::sleep(Duration::from_millis(20));
        let why = h.stale(Duration::from_millis(10)).unwrap_or_default();
        assert!(why.contains("poll") && why.contains("was never"), "{why}");
        h.polled();
        let why = h.stale(Duration::from_millis(10)).unwrap_or_default();
        assert!(why.contains("drain of the event ring buffer"), "{why}");
        h.drained();
        assert_eq!(h.stale(Duration::from_millis(10)), None);
    }

    #[test]
    fn none_attached_is_shared() {
        let h = Heartbeat::default();
        assert!(!h.none_attached());
        h.set_none_attached(true);
        assert!(h.none_attached());
    }
}
