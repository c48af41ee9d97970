//! `--congestion inner`: CUBIC that leaves losses to the tunnelled flows' own congestion
//! control, as WireGuard over UDP does. An experiment for datagram mode, not its default: it was
//! measured worse than CUBIC at 190 ms (docs/tunnel.md, "QUIC transport").
//!
//! The idea: in datagram mode every inner packet may be lost, and the inner TCP flows run their
//! own congestion control on exactly the same losses. A second controller in QUIC that also backs
//! off on them (CUBIC to 0.7× of its window) nests two control loops. After a loss burst the
//! inner flow has filled the bottleneck's queue and the RTT is up to twice the base RTT, so the
//! link needs two BDPs in flight, and the outer window falls below that; quinn then paces below
//! the link for a second or two.
//!
//! This controller is CUBIC in everything except losses. It starts with CUBIC's initial window
//! and slow start, so a new connection does not burst, and its window grows with every byte
//! acknowledged while the tunnel has data to send. Losses do not shrink it. Persistent
//! congestion still does: when every packet over several PTOs is lost the path is gone, and
//! CUBIC's reset to the minimum window applies. What the measurement showed: without CUBIC's
//! back-off and the pacing at its window, the inner flows' bursts reach the bottleneck unpaced,
//! and at 190 ms they lost more (8–13k inner retransmits per transfer against CUBIC's 5–6k) and
//! recovered more slowly.

use std::any::Any;
use std::sync::Arc;
use std::time::Instant;

use quinn::congestion::{Controller, ControllerFactory, ControllerMetrics, CubicConfig};
use quinn_proto::RttEstimator;

/// Factory of [`InnerControlled`] controllers (quinn's `congestion_controller_factory`).
#[derive(Debug, Default, Clone)]
pub struct InnerControlledConfig {
    cubic: CubicConfig,
}

impl ControllerFactory for InnerControlledConfig {
    fn build(self: Arc<Self>, now: Instant, current_mtu: u16) -> Box<dyn Controller> {
        Box::new(InnerControlled {
            cubic: Arc::new(self.cubic.clone()).build(now, current_mtu),
        })
    }
}

/// CUBIC that ignores losses short of persistent congestion (see the module documentation).
pub struct InnerControlled {
    cubic: Box<dyn Controller>,
}

impl Controller for InnerControlled {
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
        self.cubic.on_ack(now, sent, bytes, app_limited, rtt);
    }

    fn on_end_acks(
        &mut self,
        now: Instant,
        in_flight: u64,
        app_limited: bool,
        largest_packet_num_acked: Option<u64>,
    ) {
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
            self.cubic
                .on_congestion_event(now, sent, is_persistent_congestion, lost_bytes);
        }
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.cubic.on_mtu_update(new_mtu);
    }

    fn window(&self) -> u64 {
        self.cubic.window()
    }

    fn metrics(&self) -> ControllerMetrics {
        self.cubic.metrics()
    }

    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(InnerControlled {
            cubic: self.cubic.clone_box(),
        })
    }

    fn initial_window(&self) -> u64 {
        self.cubic.initial_window()
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // quinn's RttEstimator cannot be built outside quinn, so these start from the initial
    // window (10 packets), which CUBIC's back-off and persistent congestion both shrink.
    #[test]
    fn losses_leave_the_window_alone_persistent_congestion_resets_it() {
        let now = Instant::now();
        let mut c = Arc::new(InnerControlledConfig::default()).build(now, 1452);
        let initial = c.window();
        c.on_congestion_event(now, now, false, 100_000);
        assert_eq!(c.window(), initial, "a loss shrank the window");
        c.on_congestion_event(now, now, true, 100_000);
        assert!(
            c.window() < initial,
            "persistent congestion kept {}",
            c.window()
        );
        assert!(c.into_any().is::<InnerControlled>());
    }

    #[test]
    fn cubic_itself_backs_off_on_a_loss() {
        let now = Instant::now();
        let mut c = Arc::new(CubicConfig::default()).build(now, 1452);
        let initial = c.window();
        c.on_congestion_event(now, now, false, 100_000);
        assert!(c.window() < initial);
    }
}
