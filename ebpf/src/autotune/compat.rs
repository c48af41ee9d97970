//! Autotuning on kernels without the `tcp_rcvbuf_grow` tracepoint (before 6.16), chosen by
//! userspace from the running kernel's BTF (and, where a load is refused, by trying the next
//! variant).
//!
//! | program | hook | used when |
//! |---|---|---|
//! | [`rcv_space_entry`] + [`rcv_space_exit`] | `fentry`+`fexit/tcp_rcv_space_adjust` | fentry allowed: exact |
//! | [`rcv_space_tp`] + [`rcv_space_flush`] | `tp_btf/tcp_rcv_space_adjust` + `tp_btf/inet_sock_set_state` | otherwise: one measurement late while open, flushed at close |
//!
//! What "autotuning wanted to grow" means on these kernels: the kernel's
//! `tcp_rcv_space_adjust` raises `tp->rcvq_space.space` to `copied` exactly when it takes the
//! grow branch (`copied > rcvq_space.space`, the condition under which 6.16+ fires
//! `tcp_rcvbuf_grow`), whether or not `SOCK_RCVBUF_LOCK` then keeps `sk_rcvbuf` from growing.
//! So a rise of `rcvq_space.space` across one call is one grow event.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_skc_to_tcp_sock},
    macros::{btf_tracepoint, fentry, fexit, map},
    maps::{HashMap, LruHashMap},
    programs::{BtfTracePointContext, FEntryContext, FExitContext},
};
use bufscope_common::{SpaceSnap, TCP_CLOSE, maps, stat};

use super::count_grow;
use crate::events::stat_inc;
use crate::kmem::load;
use crate::sock::btf_sk_inode;

/// `tcp_rcv_space_adjust` calls in flight: thread (`pid_tgid`) → the socket's receive-space
/// measurement at entry. Entries are removed at exit (the function always returns, on the
/// same thread). Not keyed by `sk`: a pointer spilled as a map key loses its BTF type on
/// older verifiers (6.1), and the loads after the lookup need it.
#[map]
static SPACE_PENDING: HashMap<u64, SpaceSnap> =
    HashMap::with_max_entries(maps::SPACE_PENDING.default_entries, 0);

/// Tracepoint fallback: socket inode → its receive-space measurement at the previous call.
#[map]
static SPACE_LAST: LruHashMap<u64, SpaceSnap> =
    LruHashMap::with_max_entries(maps::SPACE_LAST.default_entries, 0);

const TCP_FIN_WAIT1: i32 = 4;
const TCP_LAST_ACK: i32 = 9;

/// The receive-space measurement of a BTF-typed `tcp_sock`.
#[inline(always)]
fn snap(tp: u64) -> SpaceSnap {
    SpaceSnap {
        time: load(tp, compat!(tcp_rcvq_time)),
        space: load(tp, compat!(tcp_rcvq_space)),
        _pad: 0,
    }
}

/// Records a grow event when `now` shows a higher `rcvq_space.space` than `before`.
#[inline(always)]
fn grew(sk: u64, tp: u64, before: &SpaceSnap, now: &SpaceSnap) {
    if now.space <= before.space {
        return;
    }
    let inode = btf_sk_inode(sk);
    if inode != 0 {
        let time = now.time.wrapping_sub(before.time);
        count_grow(sk, tp, inode, time, now.space as u64);
    }
}

/// `fentry/tcp_rcv_space_adjust(struct sock *sk)`: the measurement before the call.
#[fentry(function = "tcp_rcv_space_adjust")]
pub fn rcv_space_entry(ctx: FEntryContext) -> i32 {
    let sk: u64 = ctx.arg(0);
    let tp = unsafe { bpf_skc_to_tcp_sock(sk as *mut _) } as u64;
    if tp == 0 {
        return 0;
    }
    let s = snap(tp);
    if SPACE_PENDING
        .insert(&bpf_get_current_pid_tgid(), &s, 0)
        .is_err()
    {
        stat_inc(stat::AUTOTUNE_MAP_FULL);
    }
    0
}

/// `fexit/tcp_rcv_space_adjust(struct sock *sk)`: a grow event when the call raised
/// `rcvq_space.space` (exact: the kernel does that only on its grow branch).
#[fexit(function = "tcp_rcv_space_adjust")]
pub fn rcv_space_exit(ctx: FExitContext) -> i32 {
    let key = bpf_get_current_pid_tgid();
    let before = match unsafe { SPACE_PENDING.get(&key) } {
        Some(s) => *s,
        None => return 0,
    };
    let _ = SPACE_PENDING.remove(&key);
    let sk: u64 = ctx.arg(0);
    let tp = unsafe { bpf_skc_to_tcp_sock(sk as *mut _) } as u64;
    if tp == 0 {
        return 0;
    }
    grew(sk, tp, &before, &snap(tp));
    0
}

/// `tp_btf/tcp_rcv_space_adjust(struct sock *sk)` (fires at the call's start): compares the
/// measurement with the one at the previous call, so a grow is counted one call late.
#[btf_tracepoint(function = "tcp_rcv_space_adjust")]
pub fn rcv_space_tp(ctx: BtfTracePointContext) -> i32 {
    let sk: u64 = ctx.arg(0);
    let tp = unsafe { bpf_skc_to_tcp_sock(sk as *mut _) } as u64;
    if tp == 0 {
        return 0;
    }
    let inode = btf_sk_inode(sk);
    if inode == 0 {
        return 0;
    }
    let now = snap(tp);
    if let Some(before) = unsafe { SPACE_LAST.get(&inode) } {
        if before.time == now.time && before.space == now.space {
            return 0;
        }
        let before = *before;
        grew(sk, tp, &before, &now);
    }
    let _ = SPACE_LAST.insert(&inode, &now, 0);
    0
}

/// `tp_btf/inet_sock_set_state`: when the owner closes a socket (FIN_WAIT1, LAST_ACK or
/// CLOSE, still in `close()`, while the socket has its inode), counts a grow of its last call
/// for the tracepoint fallback and forgets the socket.
#[btf_tracepoint(function = "inet_sock_set_state")]
pub fn rcv_space_flush(ctx: BtfTracePointContext) -> i32 {
    let newstate: i32 = ctx.arg(2);
    if newstate != TCP_FIN_WAIT1 && newstate != TCP_LAST_ACK && newstate != TCP_CLOSE {
        return 0;
    }
    let sk: u64 = ctx.arg(0);
    let inode = btf_sk_inode(sk);
    if inode == 0 {
        return 0;
    }
    let Some(before) = (unsafe { SPACE_LAST.get(&inode) }).copied() else {
        return 0;
    };
    let _ = SPACE_LAST.remove(&inode);
    let tp = unsafe { bpf_skc_to_tcp_sock(sk as *mut _) } as u64;
    if tp == 0 {
        return 0;
    }
    grew(sk, tp, &before, &snap(tp));
    0
}
