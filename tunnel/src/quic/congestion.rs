//! `--congestion tunnel`: the QUIC transport's default congestion controller.
//!
//! A tunnel carries flows that run their own congestion control. quinn's CUBIC, as it comes,
//! starts a connection at 10 packets and grows it in slow start; until its window catches up,
//! the tunnelled packets wait in quinn's buffers. An inner TCP flow that is itself in slow start
//! sees its RTT rise while it is still far below the path's capacity. Linux's CUBIC (its default
//! TCP congestion control) takes that rise for a filling bottleneck queue: HyStart ends slow
//! start, and CUBIC then grows the window by a few packets per RTT. Measured in the lab at
//! 190 ms / 200 Mbit/s with one inner CUBIC flow: 18–111 Mbit/s in datagram mode and 40–127 in
//! stream mode, with 0 retransmits, where WireGuard over UDP carried 185 (docs/tunnel.md,
//! "Congestion control"). BBR inner flows hid it: they do not leave startup on delay.
//!
//! [`Tunnel`] is CUBIC with a *window floor*: it starts at the floor (no slow start below it)
//! and never falls below it, whatever it loses. Above the floor it is CUBIC: it grows while
//! acknowledgements come, backs off to 0.7× on a loss, and quinn paces at 1.25 × window / RTT,
//! so a GSO batch does not leave the host as one line-rate burst. The floor is, in datagram
//! mode, the higher of (in stream mode, the lower, see below):
//!
//! - the policy's UDP buffer for the path (7 MiB, or the BDP of `--target-bandwidth` ×
//!   `--target-rtt`): the most the tunnel would hold in a socket buffer anyway;
//! - two bandwidth-delay products of what the path delivered: the highest delivery rate of the
//!   last ten round trips × the minimum RTT × 2. The inner flows keep the bottleneck queue
//!   full, so the RTT is up to twice the minimum and the link needs two BDPs in flight; CUBIC's
//!   back-off after a loss burst would otherwise leave quinn pacing below the link for a second
//!   or two. It follows what the path delivered, so it cannot hold the window above the link
//!   for long: if the path slows down, within ten round trips the floor does too.
//!
//! Below the floor, congestion control is left to the inner flows, as WireGuard over UDP leaves
//! all of it. Persistent congestion (every packet lost over several PTOs: the path is gone)
//! forgets the delivery rate; the policy's floor stays.
//!
//! In stream mode the delivery rate *caps* the policy's floor instead of raising it. The inner
//! flows see no losses there (quinn retransmits them) and never back off, so CUBIC is the only
//! controller that does. Two delivered BDPs as a lower bound are, at 190 ms / 200 Mbit/s, the
//! link's BDP plus its whole bottleneck buffer, and only made more losses to retransmit (at
//! 190 ms, 157–172 Mbit/s in five runs against 163–189 in four without it, on the
//! single-stream framing; on the 32-stream framing 164.9–180.4 Mbit/s with 1,166–1,749 packets
//! lost per direction, and after the start in congestion avoidance 181.8 / 169.3 with 2,261 and
//! 3,747 lost against 186.8 / 178.3 with none). As an upper bound they matter where the path is
//! short: at 50 ms / 200 Mbit/s the policy's 7 MiB is 5.8 BDPs, and stream mode lost 32–45% of
//! its packets at that floor; capped at two BDPs (about 2.5 MB), 1.7–5.2% in four A/B runs,
//! with one inner CUBIC flow ≥ 90% of the link in 5 of 8 transfers against 3 of 8; the cap is
//! now 1.6 BDPs (`CAP_BDPS`, docs/tunnel.md, "The floor at 50 ms"). The cap holds while the
//! path idles ([`DeliveryFloor::holding`]). The floor's loss bursts once closed
//! stream-mode connections (more than 1,024 holes in one stream's buffer, quinn's limit);
//! stream mode now puts its data in chunks on streams of their own, so that it cannot
//! (`super::streams`), and
//! `tunnel` is its default too.
//!
//! In stream mode CUBIC also starts in congestion avoidance: as if it had just backed off from
//! a loss at the floor, so above the floor it grows on CUBIC's curve, reaching the floor again
//! after ∛(floor in packets × 0.3 / 0.4) seconds (15.6 s at 7 MiB) and probing past it from
//! there. Slow start above the floor (quinn's CUBIC starts with no slow-start threshold) took
//! the window from 7 MiB to 13 MiB in the first seconds of a transfer at 190 ms, past the
//! path's BDP plus its bottleneck buffer, and a burst of thousands of lost packets stalled
//! every stream behind its holes until the retransmissions arrived. Measured side by side at
//! 190 ms / 200 Mbit/s: no packet lost and 185.5–192.8 Mbit/s, against 448–7,104 lost and
//! 172.7–185.9 Mbit/s starting in slow start (docs/tunnel.md, "Congestion control").

use std::any::Any;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quinn::congestion::{Controller, ControllerFactory, ControllerMetrics, CubicConfig};
use quinn_proto::RttEstimator;

/// Samples of the delivery rate kept for the floor: about ten round trips of them, as BBR keeps
/// its maximum bandwidth over ten rounds.
const FLOOR_ROUNDS: u32 = 10;

/// The floor is this many bandwidth-delay products: the base BDP in flight on the path plus a
/// full one-BDP bottleneck queue, which the inner flows keep full.
const FLOOR_BDPS: f64 = 2.0;

/// Stream mode: the policy's floor is capped at this many BDPs of what the path delivered:
/// the path's BDP plus 0.6 of a one-BDP bottleneck queue. At two BDPs the window sat where the
/// lab's link (one BDP of buffer) tail-drops, and at 50 ms / 200 Mbit/s stream mode lost
/// 1.7–10.9% of its packets; at 1.6, 1.0–5.0% in the same runs (docs/tunnel.md, "The floor at
/// 50 ms"). 1.5 lost less still, but at 190 ms it is below the policy's 7 MiB (1.54 BDPs
/// there) and took the window down to 6.4–7.1 MB: 1 of 6 transfers at 190 ms ≥ 90% of the
/// link against 5 of 6 at two BDPs, in the same runs. At 1.6 the policy's floor holds at
/// 190 ms once the path delivers its full rate.
const CAP_BDPS: f64 = 1.6;

/// The delivery-rate floor of [`Tunnel`]: `FLOOR_BDPS` (stream mode: `CAP_BDPS`) × the highest
/// delivery rate of the last `FLOOR_ROUNDS` round trips × the minimum RTT. Kept apart from quinn's types so it can be
/// tested with made-up acknowledgements (quinn's `RttEstimator` cannot be built outside quinn).
///
/// In datagram mode samples expire after `FLOOR_ROUNDS` minimum RTTs, busy or idle. In stream
/// mode ([`DeliveryFloor::holding`]) the figure caps the floor, and it must survive idle
/// periods: a sample of an interval in which the sender was never busy (bytes in flight never
/// reached half the window) is kept only if it raises the maximum, and samples expire by
/// number, not age, so the last busy round trips' rate holds while the path idles. Busy is
/// judged from the bytes in flight, which the controller sees at every batch of
/// acknowledgements. A first version judged it from quinn's app-limited flag as seen by
/// `on_ack`: an end that sent little but acknowledgements then had intervals with no
/// acknowledged packet to flag, whose samples took the cap down to a few packets, and at
/// 50 ms quinn was app-limited for most of the first seconds of a transfer, while it sent
/// 30–39 MB/s into the 25 MB/s link, so the cap came only after 6 s.
#[derive(Debug, Clone)]
pub struct DeliveryFloor {
    /// Start of the current sampling interval and the bytes acknowledged in it.
    interval: Option<(Instant, u64)>,
    /// Whether the sender was busy at the end of any batch of acknowledgements of the current
    /// interval.
    interval_busy: bool,
    /// (end of interval, bytes per second, the sender busy in it), newest last.
    samples: VecDeque<(Instant, f64, bool)>,
    /// Stream mode: hold the rate over idle periods (see above).
    hold: bool,
    /// The floor in BDPs: `FLOOR_BDPS`, holding `CAP_BDPS`.
    bdps: f64,
    /// quinn's minimum RTT as of the last acknowledgement.
    min_rtt: Option<Duration>,
    /// The floor, recomputed once per batch of acknowledgements: quinn reads the window for
    /// every packet it sends.
    floor: u64,
}

/// `FLOOR_BDPS` of the highest rate of the last `FLOOR_ROUNDS` round trips (datagram mode).
impl Default for DeliveryFloor {
    fn default() -> Self {
        Self {
            interval: None,
            interval_busy: false,
            samples: VecDeque::new(),
            hold: false,
            bdps: FLOOR_BDPS,
            min_rtt: None,
            floor: 0,
        }
    }
}

impl DeliveryFloor {
    /// A floor that holds the last busy round trips' rate over idle periods (stream mode).
    pub fn holding() -> Self {
        Self {
            hold: true,
            bdps: CAP_BDPS,
            ..Self::default()
        }
    }

    /// Counts `bytes` acknowledged at `now`, with quinn's minimum RTT then.
    pub fn on_ack(&mut self, now: Instant, bytes: u64, min_rtt: Duration) {
        if !min_rtt.is_zero() {
            self.min_rtt = Some(min_rtt);
        }
        match &mut self.interval {
            Some((_, acked)) => *acked += bytes,
            // Bytes acknowledged by the first ACK were delivered before the interval began.
            None => self.interval = Some((now, 0)),
        }
    }

    /// Ends the interval once it is one minimum RTT long (one rate sample per round trip, so
    /// that bursts of acknowledgements average out) and forgets samples older than
    /// `FLOOR_ROUNDS` round trips (holding: beyond the last `FLOOR_ROUNDS` samples). `busy`:
    /// the sender has at least half its window in flight.
    pub fn on_end_acks(&mut self, now: Instant, busy: bool) {
        self.interval_busy |= busy;
        let (Some(min_rtt), Some((start, acked))) = (self.min_rtt, self.interval) else {
            return;
        };
        let elapsed = now.saturating_duration_since(start);
        if elapsed >= min_rtt {
            let rate = acked as f64 / elapsed.as_secs_f64();
            let idle = !self.interval_busy;
            // The next interval starts with this acknowledgement's time and no bytes: the bytes
            // counted so far were delivered in the interval that just ended.
            self.interval = Some((now, 0));
            self.interval_busy = false;
            if !self.hold {
                self.samples.push_back((now, rate, !idle));
                let keep = min_rtt * FLOOR_ROUNDS;
                while let Some(&(t, ..)) = self.samples.front() {
                    if now.saturating_duration_since(t) > keep {
                        self.samples.pop_front();
                    } else {
                        break;
                    }
                }
            } else if !idle || (self.has_busy() && rate > self.max_rate()) {
                // An idle interval says only that the path carried at least this much.
                self.samples.push_back((now, rate, !idle));
                while self.samples.len() > FLOOR_ROUNDS as usize {
                    self.samples.pop_front();
                }
            }
        }
        // Once per batch of acknowledgements, not per packet sent.
        self.floor = if self.hold && !self.has_busy() {
            0
        } else {
            (self.bdps * self.max_rate() * min_rtt.as_secs_f64()) as u64
        };
    }

    fn max_rate(&self) -> f64 {
        self.samples.iter().map(|&(_, r, _)| r).fold(0.0, f64::max)
    }

    fn has_busy(&self) -> bool {
        self.samples.iter().any(|&(.., busy)| busy)
    }

    /// The floor in bytes (0 before the first full round trip; holding: before the first
    /// busy one).
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// Forgets every sample (the path is gone: persistent congestion).
    pub fn reset(&mut self) {
        *self = Self {
            hold: self.hold,
            bdps: self.bdps,
            ..Self::default()
        };
    }
}

/// Factory of [`Tunnel`] controllers (quinn's `congestion_controller_factory`).
#[derive(Debug, Clone)]
pub struct TunnelConfig {
    floor: u64,
    follow: Follow,
    /// CUBIC starts in congestion avoidance, as just after backing off from the floor,
    /// instead of in slow start above it.
    avoid_from_start: bool,
}

/// What the delivery-rate floor does to the fixed one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Follow {
    /// Raises it (datagram mode).
    Raise,
    /// Caps it, once a busy round trip was measured (stream mode).
    Cap,
}

impl TunnelConfig {
    /// Datagram mode: the window starts at and never falls below `floor` bytes, nor below two
    /// BDPs of what the path delivered.
    pub fn datagram(floor: u64) -> Self {
        Self {
            floor,
            follow: Follow::Raise,
            avoid_from_start: false,
        }
    }

    /// Stream mode: the window starts at `floor` bytes and never falls below it, nor below
    /// `CAP_BDPS` (1.6) BDPs of what the path delivered when that is less (the floor is capped there once
    /// a round trip was window-limited, and the cap holds while the path idles); above that it
    /// is CUBIC's, the only controller there that sees the path's losses, in congestion
    /// avoidance from the start (no slow start above the floor).
    pub fn stream(floor: u64) -> Self {
        Self {
            floor,
            follow: Follow::Cap,
            avoid_from_start: true,
        }
    }
}

impl ControllerFactory for TunnelConfig {
    fn build(self: Arc<Self>, now: Instant, current_mtu: u16) -> Box<dyn Controller> {
        let mut cubic = CubicConfig::default();
        cubic.initial_window(self.floor);
        let mut cubic = Arc::new(cubic).build(now, current_mtu);
        if self.avoid_from_start {
            // As if it had just lost a packet at the floor: the window (under the floor) is
            // 0.7 × the floor, the curve's maximum the floor, so CUBIC reaches the floor again
            // only after K = ∛(floor in packets × 0.3 / 0.4) seconds (15.6 s at 7 MiB and 1452
            // bytes) and then grows past it on its convex curve, never in slow start.
            cubic.on_congestion_event(now, now, false, 0);
        }
        Box::new(Tunnel {
            cubic,
            floor: self.floor,
            follow: self.follow,
            delivered: match self.follow {
                Follow::Raise => DeliveryFloor::default(),
                Follow::Cap => DeliveryFloor::holding(),
            },
            probe: Probe::default(),
        })
    }
}

/// CUBIC with a window floor (see the module documentation).
pub struct Tunnel {
    cubic: Box<dyn Controller>,
    floor: u64,
    follow: Follow,
    /// The delivery-rate floor.
    delivered: DeliveryFloor,
    /// What the sender looked like at the end of each batch of acknowledgements, for the
    /// debug log's path samples ([`Tunnel::probe`]).
    probe: Probe,
}

/// Counts kept by [`Tunnel`] for the debug log: whether quinn had data waiting when
/// acknowledgements came (not app-limited: the window set the pace) and how much was in flight.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Probe {
    /// Batches of acknowledgements processed.
    pub ack_batches: u64,
    /// ... of which quinn was app-limited: it had sent all it had, below the window.
    pub app_limited: u64,
    /// Bytes in flight at the last batch.
    pub in_flight: u64,
    /// The most bytes in flight at the end of a batch.
    pub max_in_flight: u64,
}

impl Tunnel {
    /// The counts for the debug log.
    pub fn probe(&self) -> Probe {
        self.probe
    }
}

impl Controller for Tunnel {
    fn on_sent(&mut self, now: Instant, bytes: u64, last_packet_number: u64) {
        self.cubic.on_sent(now, bytes, last_packet_number);
    }

    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: &RttEstimator,
    ) {
        // quinn's minimum RTT (ACK delay taken out): `on_end_acks` has none.
        self.delivered.on_ack(now, bytes, rtt.min());
        self.cubic.on_ack(now, sent, bytes, app_limited, rtt);
    }

    fn on_end_acks(
        &mut self,
        now: Instant,
        in_flight: u64,
        app_limited: bool,
        largest_packet_num_acked: Option<u64>,
    ) {
        let busy = in_flight.saturating_mul(2) >= self.window();
        self.delivered.on_end_acks(now, busy);
        let p = &mut self.probe;
        p.ack_batches += 1;
        p.app_limited += u64::from(app_limited);
        p.in_flight = in_flight;
        p.max_in_flight = p.max_in_flight.max(in_flight);
        self.cubic
            .on_end_acks(now, in_flight, app_limited, largest_packet_num_acked);
    }

    fn on_congestion_event(
        &mut self,
        now: Instant,
        sent: Instant,
        is_persistent_congestion: bool,
        lost_bytes: u64,
    ) {
        if is_persistent_congestion {
            self.delivered.reset();
        }
        self.cubic
            .on_congestion_event(now, sent, is_persistent_congestion, lost_bytes);
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.cubic.on_mtu_update(new_mtu);
    }

    fn window(&self) -> u64 {
        let delivered = self.delivered.floor();
        let floor = match self.follow {
            Follow::Raise => self.floor.max(delivered),
            Follow::Cap if delivered > 0 => self.floor.min(delivered),
            Follow::Cap => self.floor,
        };
        self.cubic.window().max(floor)
    }

    fn metrics(&self) -> ControllerMetrics {
        let mut m = self.cubic.metrics();
        m.congestion_window = self.window();
        m
    }

    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(Tunnel {
            cubic: self.cubic.clone_box(),
            floor: self.floor,
            follow: self.follow,
            delivered: self.delivered.clone(),
            probe: self.probe,
        })
    }

    fn initial_window(&self) -> u64 {
        self.floor
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLOOR: u64 = 7 << 20;

    // quinn's RttEstimator cannot be built outside quinn, so these drive losses only.
    #[test]
    fn starts_at_the_floor_and_losses_do_not_take_it_below() {
        let now = Instant::now();
        let mut c = Arc::new(TunnelConfig::stream(FLOOR)).build(now, 1452);
        assert_eq!(c.window(), FLOOR, "no slow start below the floor");
        assert_eq!(c.initial_window(), FLOOR);
        for _ in 0..5 {
            c.on_congestion_event(now, now, false, 1 << 20);
            assert_eq!(c.window(), FLOOR);
        }
        c.on_congestion_event(now, now, true, 1 << 20);
        assert_eq!(c.window(), FLOOR, "persistent congestion");
        assert_eq!(c.metrics().congestion_window, FLOOR);
        let c = c.into_any().downcast::<Tunnel>().expect("a Tunnel");
        assert_eq!(c.follow, Follow::Cap, "stream mode caps the floor");
        assert!(c.delivered.hold);
        let d = Arc::new(TunnelConfig::datagram(FLOOR)).build(now, 1452);
        let d = d.into_any().downcast::<Tunnel>().expect("a Tunnel");
        assert_eq!(d.follow, Follow::Raise, "datagram mode raises the floor");
        assert!(!d.delivered.hold);
    }

    #[test]
    fn stream_mode_starts_in_congestion_avoidance_datagram_mode_in_slow_start() {
        let now = Instant::now();
        let s = Arc::new(TunnelConfig::stream(FLOOR)).build(now, 1452);
        assert_eq!(s.window(), FLOOR);
        // quinn's CUBIC as just after a loss at the floor: its window 0.7 × the floor, and
        // its slow-start threshold there too (not u64::MAX), so above the floor it grows on
        // CUBIC's curve, not by what each ACK acknowledges.
        let at = (FLOOR as f64 * 0.7) as u64;
        assert_eq!(s.metrics().ssthresh, Some(at));
        let s = s.into_any().downcast::<Tunnel>().expect("a Tunnel");
        assert_eq!(s.cubic.window(), at);
        let d = Arc::new(TunnelConfig::datagram(FLOOR)).build(now, 1452);
        assert_eq!(d.window(), FLOOR);
        assert_eq!(
            d.metrics().ssthresh,
            Some(u64::MAX),
            "slow start above the floor"
        );
    }

    #[test]
    fn quinns_cubic_starts_at_ten_packets_and_backs_off_below_it() {
        let now = Instant::now();
        let mut c = Arc::new(CubicConfig::default()).build(now, 1452);
        let initial = c.window();
        assert!(initial < 20_000, "{initial}");
        c.on_congestion_event(now, now, false, 100_000);
        assert!(c.window() < initial);
    }

    const MB: u64 = 1_000_000;

    /// Acknowledges `rate` bytes per second in 1 ms steps for `rounds` round trips of `rtt`.
    fn deliver(f: &mut DeliveryFloor, t: &mut Instant, rate: u64, rtt: Duration, rounds: u32) {
        deliver_as(f, t, rate, rtt, rounds, false);
    }

    /// [`deliver`], with the sender idle (less than half its window in flight) or busy.
    fn deliver_as(
        f: &mut DeliveryFloor,
        t: &mut Instant,
        rate: u64,
        rtt: Duration,
        rounds: u32,
        app_limited: bool,
    ) {
        let step = Duration::from_millis(1);
        for _ in 0..(rtt.as_millis() as u32 * rounds) {
            *t += step;
            f.on_ack(*t, rate / 1000, rtt);
            f.on_end_acks(*t, !app_limited);
        }
    }

    fn within(got: u64, want: u64) -> bool {
        got.abs_diff(want) * 100 <= want * 2
    }

    #[test]
    fn the_delivery_floor_is_two_bdps_of_the_highest_recent_delivery_rate() {
        let rtt = Duration::from_millis(190);
        let mut t = Instant::now();
        let mut f = DeliveryFloor::default();
        assert_eq!(f.floor(), 0, "a floor before anything was delivered");
        // 22.7 MB/s (181.7 Mbit/s) for 20 round trips: 2 × 22.7 MB/s × 190 ms = 8.6 MB.
        deliver(&mut f, &mut t, 22_700_000, rtt, 20);
        assert!(within(f.floor(), 8_626_000), "floor {}", f.floor());
        // A slower stretch shorter than ten round trips leaves the maximum where it was ...
        deliver(&mut f, &mut t, 5 * MB, rtt, 5);
        assert!(within(f.floor(), 8_626_000), "floor {}", f.floor());
        // ... a longer one takes it down to what the path now delivers.
        deliver(&mut f, &mut t, 5 * MB, rtt, 8);
        assert!(within(f.floor(), 1_900_000), "floor {}", f.floor());
        f.reset();
        assert_eq!(f.floor(), 0);
    }

    #[test]
    fn the_window_is_the_highest_of_cubic_the_fixed_floor_and_the_delivery_floor() {
        let rtt = Duration::from_millis(190);
        let mut t = Instant::now();
        let mut c = Tunnel {
            cubic: Arc::new(CubicConfig::default()).build(t, 1452),
            floor: FLOOR,
            follow: Follow::Raise,
            delivered: DeliveryFloor::default(),
            probe: Probe::default(),
        };
        assert_eq!(c.window(), FLOOR);
        // 25 MB/s delivered at 190 ms: two BDPs are 9.5 MB, above the fixed floor, and a loss
        // does not take the window below them.
        let d = &mut c.delivered;
        deliver(d, &mut t, 25 * MB, rtt, 12);
        assert!(within(c.window(), 9_500_000), "window {}", c.window());
        c.on_congestion_event(t, t, false, 1 << 20);
        assert!(
            within(c.window(), 9_500_000),
            "a loss took it to {}",
            c.window()
        );
        assert_eq!(c.metrics().congestion_window, c.window());
        // Persistent congestion: the path is gone, so is what it delivered; the fixed floor stays.
        c.on_congestion_event(t, t, true, 1 << 20);
        assert_eq!(c.window(), FLOOR);
    }

    #[test]
    fn the_holding_floor_keeps_the_busy_rate_over_idle_periods() {
        let rtt = Duration::from_millis(50);
        let mut t = Instant::now();
        let mut f = DeliveryFloor::holding();
        // App-limited round trips (a ping through an idle tunnel) set nothing.
        deliver_as(&mut f, &mut t, 100_000, rtt, 20, true);
        assert_eq!(f.floor(), 0, "a floor from app-limited round trips only");
        // 25 MB/s, window-limited: 1.6 × 25 MB/s × 50 ms = 2 MB.
        deliver(&mut f, &mut t, 25 * MB, rtt, 12);
        assert!(within(f.floor(), 2_000_000), "floor {}", f.floor());
        // The path idles (app-limited) for 200 round trips: the busy rate holds ...
        deliver_as(&mut f, &mut t, 10_000, rtt, 200, true);
        assert!(within(f.floor(), 2_000_000), "floor {}", f.floor());
        // ... app-limited round trips above it raise it ...
        deliver_as(&mut f, &mut t, 30 * MB, rtt, 2, true);
        assert!(within(f.floor(), 2_400_000), "floor {}", f.floor());
        // ... and ten busy round trips at a lower rate take it down.
        deliver(&mut f, &mut t, 5 * MB, rtt, 11);
        assert!(within(f.floor(), 400_000), "floor {}", f.floor());
        f.reset();
        assert_eq!(f.floor(), 0);
        assert!(f.hold, "a reset keeps the mode");
    }

    #[test]
    fn stream_mode_caps_the_fixed_floor_at_1_6_delivered_bdps() {
        let mut t = Instant::now();
        let build = |t: Instant| Tunnel {
            cubic: Arc::new(CubicConfig::default()).build(t, 1452),
            floor: FLOOR,
            follow: Follow::Cap,
            delivered: DeliveryFloor::holding(),
            probe: Probe::default(),
        };
        // Before a busy round trip: the fixed floor.
        let mut c = build(t);
        assert_eq!(c.window(), FLOOR);
        // 50 ms at 25 MB/s: 1.6 BDPs are 2 MB, under the fixed floor, and the window follows
        // them, a loss notwithstanding.
        let d = &mut c.delivered;
        deliver(d, &mut t, 25 * MB, Duration::from_millis(50), 12);
        assert!(within(c.window(), 2_000_000), "window {}", c.window());
        c.on_congestion_event(t, t, false, 1 << 20);
        assert!(within(c.window(), 2_000_000), "window {}", c.window());
        // 190 ms at 25 MB/s: 7.6 MB, above the fixed floor (7 MiB, 1.54 BDPs), which stays.
        let mut c = build(t);
        let d = &mut c.delivered;
        deliver(d, &mut t, 25 * MB, Duration::from_millis(190), 12);
        assert_eq!(c.window(), FLOOR);
        // Persistent congestion forgets the rate: the fixed floor again.
        let mut c = build(t);
        let d = &mut c.delivered;
        deliver(d, &mut t, 25 * MB, Duration::from_millis(50), 12);
        c.on_congestion_event(t, t, true, 1 << 20);
        assert_eq!(c.window(), FLOOR);
    }
}
