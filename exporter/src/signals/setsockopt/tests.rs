//! The setsockopt room decoding byte records, as the ring buffer carries them (no root).

#![allow(clippy::unwrap_used)]

use super::derive::EPERM;
use super::*;
use crate::kernel::BufferLimits;
use crate::signals::testkit::{Bench, me, my_proc, record};
use bufscope_common::{
    IPPROTO_TCP, IPPROTO_UDP, SO_RCVBUF, SO_RCVBUFFORCE, SO_SNDBUF, SOCK_RCVBUF_LOCK,
    SOCK_SNDBUF_LOCK,
};
use foldhash::HashSet;

fn room() -> Setsockopt {
    Setsockopt {
        stories: HashMap::new(),
        ns_limits: BTreeMap::new(),
        ns_tried: BTreeMap::new(),
        own_netns: story::own_netns(),
        diag: crate::kernel::sock_diag::Diag::new(),
        diag_at: None,
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
    assert_eq!(inputs.stories.len(), 1, "one socket, one story");
    let story = &inputs.stories[0];
    let calls: Vec<_> = story
        .calls()
        .map(|c| (c.option, c.requested, c.effective, c.ret, c.clamped))
        .collect();
    assert_eq!(
        calls,
        vec![
            (BufOption::Rcvbuf, 1 << 30, 8_388_608, 0, true),
            (BufOption::Rcvbuf, 65536, 131_072, 0, false),
            (BufOption::RcvbufForce, 64 << 20, 212_992, -EPERM, false),
        ],
        "every call in order, as the kernel handled it"
    );
    assert_eq!(story.rcvbuf, 131_072, "the last successful size");
    assert!(
        inputs.ns_limits.contains_key(&story.netns),
        "the socket's namespace's view of the limits"
    );
}

/// A successful SO_SNDBUF on TCP sets SOCK_SNDBUF_LOCK: counted in its own family, once per
/// socket; the state at the call is kept.
#[test]
fn tcp_send_locks_are_counted() {
    let mut b = Bench::new();
    let mut r = room();
    let mut first = call(SO_SNDBUF, 96_000, 0);
    first.proto = IPPROTO_TCP;
    first.state = 1;
    let mut again = first;
    again.locks_before = SOCK_SNDBUF_LOCK;
    again.locks_after = SOCK_SNDBUF_LOCK;
    for ev in [first, again] {
        r.on_event(event_kind::SOCKOPT, &record(&ev), &mut b.poll());
    }
    let locks = b.sample(
        &r,
        "bufscope_sndbuf_locks_total",
        my_proc().tgid,
        &[("proto", "tcp")],
    );
    assert_eq!(locks, 1.0, "locked once");
    let rlocks = b.sample(
        &r,
        "bufscope_rcvbuf_locks_total",
        my_proc().tgid,
        &[("proto", "tcp")],
    );
    assert_eq!(rlocks, 0.0, "a send lock is not a receive lock");
    let s = &r.stories[&77];
    assert_eq!((s.sndbuf, s.locks), (192_000, SOCK_SNDBUF_LOCK));
    assert!(s.calls().all(|c| c.state == 1));
    let row = {
        let mut row = bufscope_api::ProcessRow::default();
        b.store
            .get(&my_proc())
            .unwrap()
            .parts
            .setsockopt
            .status(&mut row);
        row
    };
    assert_eq!(row.sndbuf_locks, 1);
}

/// A socket that probes (23 calls) keeps its first and last calls and counts the rest.
#[test]
fn a_long_story_is_bounded() {
    let mut b = Bench::new();
    let mut r = room();
    for i in 0..40 {
        let ev = call(SO_RCVBUF, (7 << 20) - i * 1000, 0);
        r.on_event(event_kind::SOCKOPT, &record(&ev), &mut b.poll());
    }
    let s = &r.stories[&77];
    assert_eq!(s.total, 40);
    assert_eq!(
        s.calls().count(),
        crate::advice::STORY_FIRST + crate::advice::STORY_LAST
    );
    assert_eq!(s.omitted(), 40 - 32);
    assert_eq!(s.calls().next().map(|c| c.requested), Some(7 << 20));
    assert_eq!(
        s.calls().last().map(|c| c.requested),
        Some((7 << 20) - 39_000)
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
    assert_eq!(r.stories.len(), 1);
    b.gc(&mut r, &[77].into_iter().collect());
    assert_eq!(r.stories.len(), 1, "socket 77 is live");
    b.gc(&mut r, &HashSet::default());
    assert!(r.stories.is_empty() && r.ns_limits.is_empty());
}

/// A namespace whose limits could not be read because the process looked through had exited
/// (an `ip -n` that configured it) is read again through the next process that calls there;
/// one refused for another reason (EPERM) waits NS_RETRY; one read is not read again.
#[test]
fn a_namespace_read_through_an_exited_process_is_read_again() {
    let now = std::time::Instant::now();
    let limits = |scope, unreadable| NsLimits {
        scope,
        rmem_max: None,
        wmem_max: None,
        user_ns: false,
        unreadable,
    };
    let unreadable = |errno| limits(LimitScope::Unknown, Some(errno));
    let exited = unreadable(libc::ENOENT);
    assert!(ns_stale(None, None, 10, now), "never read");
    assert!(
        ns_stale(Some(&exited), Some((now, 9)), 10, now),
        "another process, at once"
    );
    assert!(
        !ns_stale(Some(&exited), Some((now, 10)), 10, now),
        "not through the same exited process again"
    );
    let refused = unreadable(libc::EPERM);
    assert!(!ns_stale(Some(&refused), Some((now, 9)), 10, now));
    assert!(ns_stale(Some(&refused), Some((now, 9)), 10, now + NS_RETRY));
    let read = limits(LimitScope::ReadOnly, None);
    assert!(!ns_stale(Some(&read), Some((now, 9)), 10, now));
}
