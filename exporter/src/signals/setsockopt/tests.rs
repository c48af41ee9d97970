//! The setsockopt room decoding byte records, as the ring buffer carries them (no root).

#![allow(clippy::unwrap_used)]

use super::derive::EPERM;
use super::*;
use crate::kernel::BufferLimits;
use crate::signals::testkit::{Bench, me, my_proc, record};
use bufscope_common::{IPPROTO_UDP, SO_RCVBUF, SO_RCVBUFFORCE, SOCK_RCVBUF_LOCK};
use foldhash::HashSet;

fn room() -> Setsockopt {
    Setsockopt {
        notes: HashMap::new(),
        floors: Floors {
            rcvbuf: 2304,
            sndbuf: 4608,
        },
        warned_underived: false,
    }
}

/// A call as the `cgroup/setsockopt` program reports it: before the kernel's handler.
fn call(optname: i32, requested: i32, flags: u8) -> SockoptEvent {
    SockoptEvent {
        kind: event_kind::SOCKOPT,
        optname,
        owner: me(),
        inode: 77,
        requested,
        applied: requested,
        optlen: 4,
        rcvbuf_after: 212_992,
        sndbuf_after: 212_992,
        proto: IPPROTO_UDP,
        flags: sockopt_flags::BEFORE_HANDLER | flags,
        ..Default::default()
    }
}

fn count(b: &Bench, r: &Setsockopt, family: &str, option: &str) -> f64 {
    b.sample(
        r,
        family,
        my_proc().tgid,
        &[("proto", "udp"), ("option", option)],
    )
}

/// Records decoded from the ring buffer's bytes: the outcome derived with this poll's
/// `rmem_max` (4 MiB), counted per (proto, option) on the caller, noted for advice.
#[test]
fn calls_are_derived_counted_and_noted() {
    let mut b = Bench::new();
    let mut r = room();
    let mut again = call(SO_RCVBUF, 65536, 0);
    again.locks_before = SOCK_RCVBUF_LOCK;
    again.locks_after = SOCK_RCVBUF_LOCK;
    for ev in [
        call(SO_RCVBUF, 1 << 30, 0),
        again,
        call(SO_RCVBUFFORCE, 64 << 20, 0),
    ] {
        r.on_event(event_kind::SOCKOPT, &record(&ev), &mut b.poll());
    }
    assert_eq!(count(&b, &r, "bufscope_setsockopt_total", "SO_RCVBUF"), 2.0);
    assert_eq!(
        count(&b, &r, "bufscope_setsockopt_clamped_total", "SO_RCVBUF"),
        1.0
    );
    assert_eq!(
        count(&b, &r, "bufscope_setsockopt_failed_total", "SO_RCVBUFFORCE"),
        1.0,
        "EPERM without CAP_NET_ADMIN"
    );
    let locks = b.sample(
        &r,
        "bufscope_rcvbuf_locks_total",
        my_proc().tgid,
        &[("proto", "udp")],
    );
    assert_eq!(
        locks, 1.0,
        "the first call locked the buffer; the second found it locked"
    );
    let mut inputs = Inputs::default();
    r.advise(&b.advice(), &mut inputs);
    let notes: Vec<_> = inputs
        .opts
        .iter()
        .map(|o| (o.option, o.effective, o.ret))
        .collect();
    assert!(
        notes.contains(&(BufOption::Rcvbuf, 131_072, 0)),
        "{notes:?}"
    );
    assert!(
        notes.contains(&(BufOption::RcvbufForce, 212_992, -EPERM)),
        "{notes:?}"
    );
}

/// Without the ceiling the outcome is not made up: the call counts, the clamp does not.
#[test]
fn unknown_ceiling_counts_the_call_only() {
    let mut b = Bench::new();
    b.limits = BufferLimits::default();
    let mut r = room();
    let ev = call(SO_RCVBUF, 1 << 30, 0);
    r.on_event(event_kind::SOCKOPT, &record(&ev), &mut b.poll());
    assert_eq!(count(&b, &r, "bufscope_setsockopt_total", "SO_RCVBUF"), 1.0);
    assert_eq!(
        count(&b, &r, "bufscope_setsockopt_clamped_total", "SO_RCVBUF"),
        0.0
    );
    assert!(r.warned_underived);
}

/// A call without an owner goes to `_unknown`; GC forgets the notes of closed sockets.
#[test]
fn unowned_calls_and_gc() {
    let mut b = Bench::new();
    let mut r = room();
    let mut ev = call(SO_RCVBUF, 65536, 0);
    ev.owner.tgid = 0;
    r.on_event(event_kind::SOCKOPT, &record(&ev), &mut b.poll());
    assert_eq!(b.store.attribution_unknown.get("setsockopt"), Some(&1));
    r.on_event(
        event_kind::SOCKOPT,
        &record(&call(SO_RCVBUF, 65536, 0)),
        &mut b.poll(),
    );
    assert_eq!(r.notes.len(), 1);
    b.gc(&mut r, &[77].into_iter().collect());
    assert_eq!(r.notes.len(), 1, "socket 77 is live");
    b.gc(&mut r, &HashSet::default());
    assert!(r.notes.is_empty());
}
