//! TCP connections at ESTABLISHED: the receive window scale they were born with versus the
//! scale the kernel would have chosen without a locked (small) receive buffer.
//!
//! Probe: `tp_btf/inet_sock_set_state` sends one [`EstablishedEvent`] per connection that
//! reaches ESTABLISHED (active and passive), with the negotiated scale, the lock bits and the
//! socket's netns `tcp_rmem[2]`; it also records listener owners so that accepted children
//! are attributed to the process that listens.

use std::time::{Duration, Instant};

use foldhash::{HashMap, HashMapExt as _, HashSet};
use prometheus::proto::MetricFamily;

use bufscope_common::{EstablishedEvent, SOCK_RCVBUF_LOCK, estab_flags, event_kind, total_family};

use super::{AdviceCx, GcCx, Part, PollCx, ProcStats, RingRoom, Row, Signal, decode};
use crate::advice::{Inputs, TcpShape};
use crate::attribution::{Attributor, Cause};
use crate::bpf::{Hook, ProbeSpec};
use crate::exposition::Spec;
use crate::labels::Proto;
use crate::store::{ProcRef, Who};
use crate::totals::Total;

/// The probe.
pub const PROBE: ProbeSpec = ProbeSpec {
    name: "tcp_state",
    what: "TCP connections at ESTABLISHED: window scale vs what the kernel would choose; listener owners",
    variants: &[&[Hook::BtfTracepoint {
        prog: "inet_sock_set_state",
        name: "inet_sock_set_state",
    }]],
    is_drop_probe: false,
    attributed: true,
};

/// `TCP_MAX_WSCALE`.
const TCP_MAX_WSCALE: u32 = 14;

/// What this signal adds to a process.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcTcp {
    /// TCP connections that reached ESTABLISHED.
    pub established: u64,
    /// Of those, connections born with a smaller window scale than the kernel would pick.
    pub wscale_shrunk: u64,
}

impl Part for ProcTcp {
    fn absorb(&mut self, o: &Self) {
        self.established += o.established;
        self.wscale_shrunk += o.wscale_shrunk;
    }

    fn has_counts(&self) -> bool {
        self.established > 0
    }

    fn status(&self, row: &mut bufscope_api::ProcessRow) {
        row.tcp_established = self.established;
        row.tcp_wscale_shrunk = self.wscale_shrunk;
    }

    fn totals(&self, out: &mut Vec<Total>) {
        for (family, value) in [
            (total_family::TCP_ESTABLISHED, self.established),
            (total_family::TCP_WSCALE_SHRUNK, self.wscale_shrunk),
        ] {
            if value > 0 {
                out.push(Total {
                    family,
                    proto: Proto::Tcp.to_ip(),
                    option: 0,
                    value,
                });
            }
        }
    }

    fn restore(&mut self, t: &Total) {
        match t.family {
            total_family::TCP_ESTABLISHED => self.established += t.value,
            total_family::TCP_WSCALE_SHRUNK => self.wscale_shrunk += t.value,
            _ => {}
        }
    }
}

/// The receive window scale `tcp_select_initial_window` picks for a socket whose buffer is not
/// locked: `clamp(ilog2(min(max(tcp_rmem[2], rmem_max), 65535 << 14)) - 15, 0, 14)`
/// (`tcp_select_initial_window`). `tcp_rmem_max` is the socket's own netns value; `rmem_max` is global.
pub fn expected_wscale(tcp_rmem_max: i64, rmem_max: i64) -> u8 {
    let space = tcp_rmem_max
        .max(rmem_max)
        .clamp(1, 65535i64 << TCP_MAX_WSCALE) as u64;
    let log = 63 - space.leading_zeros();
    log.saturating_sub(15).min(TCP_MAX_WSCALE) as u8
}

/// The expected scale when the connection's is smaller than that, else None. Connections
/// without window scaling (peer or sysctl) are never "shrunk": that is not what a buffer lock
/// causes.
pub fn shrunk(ev: &EstablishedEvent, rmem_max: i64) -> Option<u8> {
    let expected = expected_wscale(ev.tcp_rmem_max as i64, rmem_max);
    (ev.flags & estab_flags::WSCALE_OK != 0 && ev.window_scaling != 0 && ev.rcv_wscale < expected)
        .then_some(expected)
}

/// A connection whose owner is being looked up (off the collector's lock) is held at most
/// this long, then counted under `comm="_unknown"`.
const PARK_AT_MOST: Duration = Duration::from_secs(10);
/// Connections held at most (more: counted under `comm="_unknown"` at once).
const PARK_MAX: usize = 65_536;

/// Who a connection belongs to, as far as is known now.
enum Owned {
    /// This process.
    By(ProcRef),
    /// Its owner is being looked up: count it once the answer is in.
    Wait,
    /// Nobody can be found.
    Unknown,
}

/// Who the connection belongs to: the probe's owner record, else the listener's owner or
/// the socket's, from the caches or a look-up in `/proc` (queued: [`Owned::Wait`]).
fn resolve(ev: &EstablishedEvent, attr: &mut Attributor) -> Owned {
    if ev.flags & estab_flags::OWNER_KNOWN != 0 {
        return Owned::By(attr.owner(&ev.owner));
    }
    if ev.flags & estab_flags::PASSIVE != 0 {
        return match attr.listener(ev.netns, ev.lport) {
            Some(p) => Owned::By(p),
            None if attr.listener_pending(ev.netns, ev.lport) => Owned::Wait,
            None => Owned::Unknown,
        };
    }
    if ev.inode == 0 {
        return Owned::Unknown;
    }
    if let Some(p) = attr.lookup_inode(ev.inode) {
        return Owned::By(p);
    }
    attr.resolve_inodes(Cause::Established, &HashSet::from_iter([ev.inode]));
    match attr.lookup_inode(ev.inode) {
        Some(p) => Owned::By(p),
        None if attr.pending(ev.inode) => Owned::Wait,
        None => Owned::Unknown,
    }
}

/// The tcp_state room.
pub struct TcpState {
    /// Last shrunk connection per process: (actual, expected) scale, for advice.
    examples: HashMap<ProcRef, (u8, u8)>,
    /// Connections whose owner is being looked up, with when they arrived.
    parked: Vec<(EstablishedEvent, Instant)>,
}

impl RingRoom for TcpState {
    const PROBE: ProbeSpec = PROBE;
    type Part = ProcTcp;

    fn start() -> Self {
        Self::new()
    }
}

impl Default for TcpState {
    fn default() -> Self {
        Self::new()
    }
}

impl TcpState {
    /// The room.
    pub fn new() -> Self {
        Self {
            examples: HashMap::new(),
            parked: Vec::new(),
        }
    }

    /// Counts one connection on `owner` (`_unknown` without one).
    fn count(&mut self, ev: &EstablishedEvent, owner: Option<ProcRef>, cx: &mut PollCx<'_>) {
        // Unknown rmem_max: judge by tcp_rmem[2] alone (never a false "shrunk").
        let shrunk_to = shrunk(ev, cx.limits.rmem_max.unwrap_or(0));
        // An exec since its last event: this connection already counts under the new name.
        cx.attr.apply_renames(cx.store);
        let (who, s) = cx.counters(PROBE.name, owner, 1);
        s.parts.tcp_state.established += 1;
        if shrunk_to.is_some() {
            s.parts.tcp_state.wscale_shrunk += 1;
        }
        // A child accepted from a locked listener inherits SOCK_RCVBUF_LOCK (sk_clone_lock): it
        // got the lock without calling setsockopt itself.
        if ev.flags & estab_flags::PASSIVE != 0 && ev.userlocks & SOCK_RCVBUF_LOCK != 0 {
            *s.parts
                .setsockopt
                .rcvbuf_locks
                .entry(Proto::Tcp)
                .or_default() += 1;
        }
        if let (Who::Proc(p), Some(expected)) = (who, shrunk_to) {
            self.examples.insert(p, (ev.rcv_wscale, expected));
        }
    }
}

impl Signal for TcpState {
    fn name(&self) -> &'static str {
        PROBE.name
    }

    fn families(&self, procs: &[Row], out: &mut Vec<MetricFamily>) {
        let tcp = |s: &ProcStats| Some(s.parts.tcp_state).filter(|t| t.established > 0);
        ESTABLISHED.per_process_value(procs, out, |s| tcp(s).map(|t| t.established));
        SHRUNK.per_process_value(procs, out, |s| tcp(s).map(|t| t.wscale_shrunk));
    }

    fn event_kinds(&self) -> &'static [u32] {
        &[event_kind::ESTABLISHED]
    }

    /// Built from events, kept in the pinned `TOTALS` ([`Part::totals`]): they go on across
    /// a restart like the families read from maps.
    fn map_counters(&self) -> &'static [&'static str] {
        &[ESTABLISHED.name, SHRUNK.name]
    }

    fn on_event(&mut self, _kind: u32, bytes: &[u8], cx: &mut PollCx<'_>) {
        let Some(ev) = decode::<EstablishedEvent>(bytes) else {
            return;
        };
        match resolve(&ev, cx.attr) {
            Owned::By(p) => self.count(&ev, Some(p), cx),
            Owned::Wait if self.parked.len() < PARK_MAX => {
                self.parked.push((ev, Instant::now()));
            }
            Owned::Wait | Owned::Unknown => self.count(&ev, None, cx),
        }
    }

    /// Counts the connections whose owner was being looked up, once it is known (or can't
    /// be, or after [`PARK_AT_MOST`]).
    fn poll(&mut self, cx: &mut PollCx<'_>) -> bool {
        if self.parked.is_empty() {
            return false;
        }
        let now = Instant::now();
        let mut counted = false;
        for (ev, since) in std::mem::take(&mut self.parked) {
            match resolve(&ev, cx.attr) {
                Owned::By(p) => self.count(&ev, Some(p), cx),
                Owned::Wait if now.duration_since(since) < PARK_AT_MOST => {
                    self.parked.push((ev, since));
                    continue;
                }
                Owned::Wait | Owned::Unknown => self.count(&ev, None, cx),
            }
            counted = true;
        }
        counted
    }

    fn gc(&mut self, cx: &mut GcCx<'_>) -> usize {
        let store = cx.store;
        self.examples.retain(|p, _| store.get(p).is_some());
        0
    }

    fn advise(&self, cx: &AdviceCx<'_>, inputs: &mut Inputs) {
        for (p, s) in cx.store.procs() {
            let locks = s
                .parts
                .setsockopt
                .rcvbuf_locks
                .get(&Proto::Tcp)
                .copied()
                .unwrap_or(0);
            let tcp = &s.parts.tcp_state;
            if tcp.established > 0 || locks > 0 {
                inputs.tcp.push((
                    *p,
                    TcpShape {
                        established: tcp.established,
                        shrunk: tcp.wscale_shrunk,
                        example: self.examples.get(p).copied(),
                        locks,
                    },
                ));
            }
        }
    }
}

const ESTABLISHED: Spec = Spec::counter(
    "bufscope_tcp_established_total",
    "TCP connections that reached ESTABLISHED (active and passive).",
    &[],
);
const SHRUNK: Spec = Spec::counter(
    "bufscope_tcp_wscale_shrunk_total",
    "TCP connections born with a smaller receive window scale than the kernel would choose without a locked buffer (fixed for the connection's life).",
    &[],
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_scale_matches_kernel_facts() {
        // tcp_rmem[2] = 32 MiB, rmem_max = 4 MiB -> ilog2(2^25) - 15 = 10.
        assert_eq!(expected_wscale(33_554_432, 4_194_304), 10);
        // Debian defaults: tcp_rmem[2] = 6 MiB, rmem_max = 212992 -> ilog2(6291456) = 22 -> 7.
        assert_eq!(expected_wscale(6_291_456, 212_992), 7);
        // Jason Xing's patch: tcp_rmem[2] = rmem_max = 40880000 -> ilog2 = 25 -> 10.
        assert_eq!(expected_wscale(40_880_000, 40_880_000), 10);
        // Enormous values cap at 14.
        assert_eq!(expected_wscale(i64::MAX, 0), 14);
        assert_eq!(expected_wscale(0, 0), 0);
    }

    #[test]
    fn shrink_needs_negotiated_scaling() {
        let mut ev = EstablishedEvent {
            flags: estab_flags::WSCALE_OK,
            window_scaling: 1,
            rcv_wscale: 1,
            tcp_rmem_max: 33_554_432,
            ..Default::default()
        };
        assert_eq!(shrunk(&ev, 4_194_304), Some(10));
        ev.rcv_wscale = 10;
        assert_eq!(shrunk(&ev, 4_194_304), None);
        ev.rcv_wscale = 0;
        ev.flags = 0;
        assert_eq!(
            shrunk(&ev, 4_194_304),
            None,
            "no wscale option from the peer"
        );
    }
}

#[cfg(test)]
mod room_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::signals::testkit::{Bench, me, my_proc, record};

    fn connection(flags: u32, rcv_wscale: u8) -> EstablishedEvent {
        EstablishedEvent {
            kind: event_kind::ESTABLISHED,
            owner: me(),
            flags: flags | estab_flags::WSCALE_OK,
            window_scaling: 1,
            rcv_wscale,
            tcp_rmem_max: 33_554_432,
            ..Default::default()
        }
    }

    fn room() -> TcpState {
        TcpState::new()
    }

    /// Records decoded from the ring buffer's bytes count connections and shrunken scales on
    /// the process the probe recorded; advice gets the example.
    #[test]
    fn established_records_count_on_their_owner() {
        let mut b = Bench::new();
        let mut r = room();
        for ev in [
            connection(estab_flags::OWNER_KNOWN, 10),
            connection(estab_flags::OWNER_KNOWN, 1),
        ] {
            r.on_event(event_kind::ESTABLISHED, &record(&ev), &mut b.poll());
        }
        let pid = my_proc().tgid;
        assert_eq!(
            b.sample(&r, "bufscope_tcp_established_total", pid, &[]),
            2.0
        );
        assert_eq!(
            b.sample(&r, "bufscope_tcp_wscale_shrunk_total", pid, &[]),
            1.0
        );
        let mut inputs = Inputs::default();
        r.advise(&b.advice(), &mut inputs);
        let (p, shape) = &inputs.tcp[0];
        assert_eq!(*p, my_proc());
        assert_eq!((shape.established, shape.shrunk), (2, 1));
        assert_eq!(
            shape.example,
            Some((1, 10)),
            "born with 1, the kernel would pick 10"
        );
    }

    /// An accepted child of a locked listener inherited the lock: counted as a lock.
    #[test]
    fn a_child_of_a_locked_listener_counts_as_a_lock() {
        let mut b = Bench::new();
        let mut r = room();
        let mut ev = connection(estab_flags::OWNER_KNOWN | estab_flags::PASSIVE, 10);
        ev.userlocks = SOCK_RCVBUF_LOCK;
        r.on_event(event_kind::ESTABLISHED, &record(&ev), &mut b.poll());
        let s = b.store.get(&my_proc()).unwrap();
        assert_eq!(s.parts.setsockopt.rcvbuf_locks.get(&Proto::Tcp), Some(&1));
    }

    /// No owner (none recorded, no inode): `_unknown`; a truncated record is ignored.
    #[test]
    fn unowned_and_truncated_records() {
        let mut b = Bench::new();
        let mut r = room();
        let ev = connection(0, 10);
        r.on_event(event_kind::ESTABLISHED, &record(&ev), &mut b.poll());
        assert_eq!(b.store.attribution_unknown.get("tcp_state"), Some(&1));
        r.on_event(event_kind::ESTABLISHED, &record(&ev)[..8], &mut b.poll());
        assert_eq!(b.store.attribution_unknown.get("tcp_state"), Some(&1));
    }
}
