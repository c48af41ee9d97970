//! Ring dispatch: every record waiting in the event ring buffer goes to the room that
//! decodes its kind ([`crate::signals::Signal::event_kinds`]).

use crate::bpf::Records;
use crate::signals::{PollCx, Signal};

/// The event ring buffer and the rooms' record kinds.
#[derive(Default)]
pub struct RingDispatch {
    records: Option<Box<dyn Records>>,
}

impl RingDispatch {
    /// Dispatches what `records` holds (None: no ring buffer, nothing to drain).
    pub fn new(records: Option<Box<dyn Records>>) -> Self {
        Self { records }
    }

    /// Hands every waiting record to its room; returns how many there were.
    pub fn drain(&mut self, rooms: &mut [Box<dyn Signal>], cx: &mut PollCx<'_>) -> usize {
        let Some(records) = self.records.as_mut() else {
            return 0;
        };
        records.drain(&mut |record| dispatch(rooms, record, cx))
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
        let mut d = RingDispatch::new(Some(Box::new(ring.clone())));
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

    #[test]
    fn no_ring_buffer_nothing_to_drain() {
        let mut b = Bench::new();
        assert_eq!(RingDispatch::default().drain(&mut [], &mut b.poll()), 0);
    }
}
