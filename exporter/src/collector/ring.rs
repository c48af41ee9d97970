//! Ring dispatch: every record waiting in the event ring buffer goes to the room that
//! decodes its kind ([`crate::signals::Signal::event_kinds`]). How much waited when each
//! drain began (the backlog, from the kernel's positions) is kept for the exposition.

use std::time::{Duration, Instant};

use prometheus::proto::MetricFamily;

use crate::bpf::Records;
use crate::bpf::ring::RingPositions;
use crate::exposition::Spec;
use crate::signals::{PollCx, Signal};

/// The window of the worst-backlog gauge (the current and the previous one).
const BACKLOG_WINDOW: Duration = Duration::from_secs(60);

const BACKLOG: Spec = Spec::gauge(
    "bufscope_events_ring_backlog_bytes",
    "Bytes of records waiting in the event ring buffer when the last drain began.",
    &[],
);
const BACKLOG_MAX: Spec = Spec::gauge(
    "bufscope_events_ring_backlog_max_bytes",
    "The most bytes of records found waiting in the event ring buffer when a drain began, in \
     the last one to two minutes (records beyond --bpf.events-ring-bytes are lost: \
     bufscope_bpf_events_lost_total{cause=\"ringbuf_full\"}).",
    &[],
);

/// The event ring buffer and the rooms' record kinds.
#[derive(Default)]
pub struct RingDispatch {
    records: Option<Box<dyn Records>>,
    positions: Option<RingPositions>,
    /// Backlog at the start of the last drain; the most in this window and the previous one.
    last: u64,
    max_now: u64,
    max_before: u64,
    window_start: Option<Instant>,
}

impl RingDispatch {
    /// Dispatches what `records` holds (None: no ring buffer, nothing to drain); `positions`
    /// (the kernel's, when mapped) measure the backlog.
    pub fn new(records: Option<Box<dyn Records>>, positions: Option<RingPositions>) -> Self {
        Self {
            records,
            positions,
            ..Self::default()
        }
    }

    /// Hands every waiting record to its room; returns how many there were.
    pub fn drain(&mut self, rooms: &mut [Box<dyn Signal>], cx: &mut PollCx<'_>) -> usize {
        if let Some(p) = &self.positions {
            let backlog = p.backlog();
            self.record_backlog(backlog, Instant::now());
        }
        let Some(records) = self.records.as_mut() else {
            return 0;
        };
        records.drain(&mut |record| dispatch(rooms, record, cx))
    }

    fn record_backlog(&mut self, bytes: u64, now: Instant) {
        let start = *self.window_start.get_or_insert(now);
        let age = now.saturating_duration_since(start);
        if age >= BACKLOG_WINDOW {
            self.max_before = if age >= BACKLOG_WINDOW * 2 {
                0
            } else {
                self.max_now
            };
            self.max_now = 0;
            self.window_start = Some(now);
        }
        self.last = bytes;
        self.max_now = self.max_now.max(bytes);
    }

    /// The backlog families (none without the kernel's positions).
    pub fn families(&self, out: &mut Vec<MetricFamily>) {
        if self.positions.is_none() {
            return;
        }
        for (spec, v) in [
            (&BACKLOG, self.last),
            (&BACKLOG_MAX, self.max_now.max(self.max_before)),
        ] {
            let mut f = spec.family();
            f.push(&[], v as f64);
            f.done(out);
        }
    }
}

/// Hands one record to the room that decodes its kind (its first 4 bytes).
pub fn dispatch(rooms: &mut [Box<dyn Signal>], bytes: &[u8], cx: &mut PollCx<'_>) {
    let Some(kind) = bytes
        .get(..4)
        .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    else {
        return;
    };
    match rooms.iter_mut().find(|s| s.event_kinds().contains(&kind)) {
        Some(s) => s.on_event(kind, bytes, cx),
        None => tracing::debug!("unknown event kind {kind}"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::bpf::fake::FakeRing;
    use crate::signals::setsockopt::Setsockopt;
    use crate::signals::tcp_state::TcpState;
    use crate::signals::testkit::{Bench, me, my_proc};
    use bufscope_common::{
        EstablishedEvent, IPPROTO_UDP, SO_RCVBUF, SockoptEvent, estab_flags, event_kind,
    };

    /// Records of two kinds, from the ring buffer's bytes, each reach the room that decodes
    /// it; records of no room's kind and truncated ones are skipped.
    #[test]
    fn records_reach_the_room_of_their_kind() {
        let mut b = Bench::new();
        let ring = FakeRing::default();
        let mut d = RingDispatch::new(Some(Box::new(ring.clone())), None);
        let mut rooms: Vec<Box<dyn Signal>> =
            vec![Box::new(Setsockopt::new()), Box::new(TcpState::new())];
        ring.push_pod(&SockoptEvent {
            kind: event_kind::SOCKOPT,
            optname: SO_RCVBUF,
            owner: me(),
            requested: 65536,
            applied: 65536,
            optlen: 4,
            rcvbuf_after: 131_072,
            proto: IPPROTO_UDP,
            ..Default::default()
        });
        ring.push_pod(&EstablishedEvent {
            kind: event_kind::ESTABLISHED,
            owner: me(),
            flags: estab_flags::OWNER_KNOWN,
            ..Default::default()
        });
        ring.push(99u32.to_ne_bytes().to_vec());
        ring.push(vec![1, 0]);
        assert_eq!(d.drain(&mut rooms, &mut b.poll()), 4);
        assert_eq!(d.drain(&mut rooms, &mut b.poll()), 0, "drained");
        let s = b.store.get(&my_proc()).unwrap();
        assert_eq!(s.parts.tcp_state.established, 1);
        let calls: u64 = s.parts.setsockopt.calls.values().map(|c| c.calls).sum();
        assert_eq!(calls, 1);
    }

    /// The worst backlog stays for a window after the one it was seen in, then goes.
    #[test]
    fn the_worst_backlog_is_kept_for_a_window() {
        let mut d = RingDispatch::default();
        let t0 = Instant::now();
        d.record_backlog(4096, t0);
        d.record_backlog(64, t0);
        assert_eq!((d.last, d.max_now), (64, 4096));
        d.record_backlog(8, t0 + BACKLOG_WINDOW);
        assert_eq!(d.max_now.max(d.max_before), 4096);
        d.record_backlog(8, t0 + BACKLOG_WINDOW * 4);
        assert_eq!(d.max_now.max(d.max_before), 8);
    }

    #[test]
    fn no_ring_buffer_nothing_to_drain() {
        let mut b = Bench::new();
        assert_eq!(RingDispatch::default().drain(&mut [], &mut b.poll()), 0);
    }
}
