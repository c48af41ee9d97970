//! Per-key state of the drops room: cumulative counts, the latest buffer sizes, the owner,
//! and a short history of samples from which drop rates are measured.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::store::ProcRef;

/// What the last poll saw for one key.
#[derive(Clone, Debug)]
pub struct Seen {
    /// Cumulative packets.
    pub packets: u64,
    /// Cumulative skbs.
    pub skbs: u64,
    /// When the count last moved.
    pub changed: Instant,
    /// `sk_rcvbuf` at the latest drop.
    pub rcvbuf: i32,
    /// `sk_rmem_alloc` at the latest drop.
    pub rmem_alloc: i32,
    /// Who it was attributed to.
    pub owner: Option<ProcRef>,
    /// Device name (device drops).
    pub ifname: String,
    /// (time, cumulative packets) samples of the last [`HISTORY`], for rates.
    pub history: VecDeque<(Instant, u64)>,
    /// What each process was credited from this key (a shared socket's readers, a holder
    /// after another): what a closed socket leaves each of them when it is folded
    /// ([`super::Drops::fold`]).
    pub credited: Vec<(ProcRef, u64)>,
}

/// How much per-key history is kept for rates.
pub const HISTORY: Duration = crate::advice::MAX_WINDOW;

/// Spacing of the kept samples (rates are exact over [sample, now], with the window start
/// rounded down to a sample at most this much earlier).
pub const HISTORY_STEP: Duration = Duration::from_secs(10);

impl Seen {
    /// Records that `p` was credited `n` of this key's packets.
    pub fn credit(&mut self, p: ProcRef, n: u64) {
        match self.credited.iter_mut().find(|(q, _)| *q == p) {
            Some((_, v)) => *v += n,
            None => self.credited.push((p, n)),
        }
    }

    /// Packets per second over the last `window` (0 when nothing moved in it).
    pub fn rate(&self, window: Duration, now: Instant) -> f64 {
        let Some(&(t_last, last)) = self.history.back() else {
            return 0.0;
        };
        if now.duration_since(t_last) > window {
            return 0.0;
        }
        let since = now.checked_sub(window).unwrap_or(t_last);
        // The newest sample at or before the window start (or the oldest we have); samples
        // are in time order.
        let after = self.history.partition_point(|(t, _)| *t <= since);
        let base = self.history.get(after.saturating_sub(1)).copied();
        match base {
            Some((t0, v0)) if last > v0 => {
                let dt = now.duration_since(t0).as_secs_f64().max(1e-3);
                (last - v0) as f64 / dt
            }
            _ => 0.0,
        }
    }
}

impl Seen {
    /// Adds the sample (`now`, cumulative `packets`) to the history (`moved`: the count moved
    /// since the previous poll) and forgets samples older than [`HISTORY`].
    pub fn record(&mut self, now: Instant, packets: u64, moved: bool) {
        let history = &mut self.history;
        if moved || history.len() < 2 {
            // One sample per HISTORY_STEP at most (the newest one keeps moving): a socket
            // that drops on every poll would otherwise keep HISTORY / poll interval = 300
            // samples, 4.8 KiB per socket (48 MiB with 10,000 sockets).
            let n = history.len();
            let recent = n >= 2 && now.duration_since(history[n - 2].0) < HISTORY_STEP;
            match history.back_mut() {
                Some(last) if recent => *last = (now, packets),
                _ => history.push_back((now, packets)),
            }
        }
        while history.len() > 2
            && history
                .front()
                .is_some_and(|(t, _)| now.duration_since(*t) > HISTORY)
        {
            history.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(samples: &[(u64, u64)], now: Instant) -> Seen {
        Seen {
            packets: samples.last().map_or(0, |s| s.1),
            skbs: 0,
            changed: now,
            rcvbuf: 0,
            rmem_alloc: 0,
            credited: Vec::new(),
            owner: None,
            ifname: String::new(),
            history: samples
                .iter()
                .map(|(ago_ms, v)| (now - Duration::from_millis(*ago_ms), *v))
                .collect(),
        }
    }

    #[test]
    fn rate_over_window() {
        let now = Instant::now() + Duration::from_secs(600);
        // 1000 packets in the last 10 s, steady before.
        let s = seen(&[(70_000, 0), (10_000, 5000), (0, 6000)], now);
        assert!((s.rate(Duration::from_secs(60), now) - 6000.0 / 70.0).abs() < 1.0);
        assert!((s.rate(Duration::from_secs(10), now) - 100.0).abs() < 1.0);
        // Nothing moved within the window.
        let idle = seen(&[(200_000, 0), (120_000, 10)], now);
        assert_eq!(idle.rate(Duration::from_secs(60), now), 0.0);
    }
}
