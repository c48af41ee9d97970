//! Programs for kernels that lack the hooks the main programs use, chosen by userspace from
//! the running kernel's BTF (and, where a load is refused, by trying the next variant).
//!
//! | signal | program | hook | used when |
//! |---|---|---|---|
//! | drops | [`udp_enqueue_exit`] | `fexit/__udp_enqueue_schedule_skb` | no `kfree_skb.rx_sk` (before 6.11) and fexit allowed: UDP v4+v6 per socket, exact |
//! | drops | [`udp_fail_queue_rcv_skb`] | `tp_btf/udp_fail_queue_rcv_skb` | no `rx_sk`: UDP per socket; IPv6 only on kernels whose tracepoint has `family` (≈6.4+) |
//! | drops | [`kfree_skb_noks`], [`kfree_skb_noks_v4`] | `tp_btf/kfree_skb` (3 arguments) | no `rx_sk`: everything else — skbs a socket owns by that socket, the rest per netns |
//! | autotune | [`rcv_space_entry`] + [`rcv_space_exit`] | `fentry`+`fexit/tcp_rcv_space_adjust` | no `tcp_rcvbuf_grow` tracepoint (before 6.16), fentry allowed: exact |
//! | autotune | [`rcv_space_tp`] + [`rcv_space_flush`] | `tp_btf/tcp_rcv_space_adjust` + `tp_btf/inet_sock_set_state` | neither: one measurement late while open, flushed at close |
//!
//! What "autotuning wanted to grow" means on kernels without `tcp_rcvbuf_grow`: the kernel's
//! `tcp_rcv_space_adjust` raises `tp->rcvq_space.space` to `copied` exactly when it takes the
//! grow branch (`copied > rcvq_space.space`, the condition under which 6.16+ fires
//! `tcp_rcvbuf_grow`), whether or not `SOCK_RCVBUF_LOCK` then keeps `sk_rcvbuf` from growing.
//! So a rise of `rcvq_space.space` across one call is one grow event.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_jiffies64, bpf_skc_to_tcp_sock},
    macros::{btf_tracepoint, fentry, fexit, map},
    programs::{BtfTracePointContext, FEntryContext, FExitContext},
};
use bufscope_common::{
    CompatConfig, DropKey, DropVal, IPPROTO_UDP, SpaceSnap, TCP_CLOSE, drop_site, stat,
};

use super::{
    btf_sk_inode, count_grow, kread, load, reason_tracked, record_drop, skb_segs, socket_key,
    stat_inc,
};

/// Offsets and reason numbers only these programs need, patched by userspace before load.
#[unsafe(no_mangle)]
static COMPAT: CompatConfig = CompatConfig::zeroed();

/// Reads one `COMPAT` field (see `cfg!` in main.rs).
macro_rules! compat {
    ($f:ident) => {
        unsafe { core::ptr::read_volatile(&raw const COMPAT.$f) }
    };
}

/// `tcp_rcv_space_adjust` calls in flight: thread (`pid_tgid`) → the socket's receive-space
/// measurement at entry. Entries are removed at exit (the function always returns, on the
/// same thread). Not keyed by `sk`: a pointer spilled as a map key loses its BTF type on
/// older verifiers (6.1), and the loads after the lookup need it.
#[map]
static SPACE_PENDING: aya_ebpf::maps::HashMap<u64, SpaceSnap> =
    aya_ebpf::maps::HashMap::with_max_entries(4096, 0);

/// Tracepoint fallback: socket inode → its receive-space measurement at the previous call.
#[map]
static SPACE_LAST: aya_ebpf::maps::LruHashMap<u64, SpaceSnap> =
    aya_ebpf::maps::LruHashMap::with_max_entries(16384, 0);

const ENOMEM: i32 = 12;
const TCP_TIME_WAIT: u8 = 6;
const TCP_NEW_SYN_RECV: u8 = 12;
const TCP_FIN_WAIT1: i32 = 4;
const TCP_LAST_ACK: i32 = 9;

// ---------------------------------------------------------------------------------------------
// Drops without kfree_skb's rx_sk
// ---------------------------------------------------------------------------------------------

/// The drop reason the kernel gives a failed UDP enqueue: `-ENOMEM` (the receive buffer is
/// full) is `SOCKET_RCVBUFF`, anything else (`-ENOBUFS`: protocol memory) `PROTO_MEM`, as in
/// `__udp_queue_rcv_skb`/`__udpv6_queue_rcv_skb`.
#[inline(always)]
fn udp_reason(rc: i32) -> u32 {
    if rc == -ENOMEM {
        compat!(reason_rcvbuff)
    } else {
        compat!(reason_proto_mem)
    }
}

/// Counts one dropped skb (`packets` segments) on the BTF-typed socket `sk`.
#[inline(always)]
fn count_on_socket(sk: u64, reason: u32, packets: u64) {
    let key = socket_key(sk, reason);
    let val = DropVal {
        packets,
        skbs: 1,
        rcvbuf: load::<i32>(sk, cfg!(sk_rcvbuf)),
        rmem_alloc: load::<i32>(sk, cfg!(sk_rmem_alloc)),
        last_ns: unsafe { bpf_jiffies64() },
        ifname: [0; 16],
    };
    record_drop(&key, &val);
}

/// `fexit/__udp_enqueue_schedule_skb(struct sock *sk, struct sk_buff *skb) -> int`: every UDP
/// datagram (v4 and v6) passes here on its way into a receive queue; a negative return is a
/// drop on `sk` (the caller frees the skb after we return).
#[fexit(function = "__udp_enqueue_schedule_skb")]
pub fn udp_enqueue_exit(ctx: FExitContext) -> i32 {
    let rc: i32 = ctx.arg(2);
    if rc >= 0 {
        return 0;
    }
    let reason = udp_reason(rc);
    if !reason_tracked(reason) {
        return 0;
    }
    let sk: u64 = ctx.arg(0);
    let skb: u64 = ctx.arg(1);
    count_on_socket(sk, reason, skb_segs(skb));
    0
}

/// `tp_btf/udp_fail_queue_rcv_skb(int rc, struct sock *sk[, struct sk_buff *skb])`: fires once
/// per dropped skb right after the kernel frees it (IPv4 always; IPv6 only on kernels whose
/// tracepoint has a `family` field). Counted as one packet: 6.1's tracepoint has no skb.
#[btf_tracepoint(function = "udp_fail_queue_rcv_skb")]
pub fn udp_fail_queue_rcv_skb(ctx: BtfTracePointContext) -> i32 {
    let rc: i32 = ctx.arg(0);
    let reason = udp_reason(rc);
    if !reason_tracked(reason) {
        return 0;
    }
    let sk: u64 = ctx.arg(1);
    if sk == 0 {
        return 0;
    }
    count_on_socket(sk, reason, 1);
    0
}

/// `tp_btf/kfree_skb(skb, location, reason)` without `rx_sk`, when the UDP hook beside it
/// covers IPv4 and IPv6.
#[btf_tracepoint(function = "kfree_skb")]
pub fn kfree_skb_noks(ctx: BtfTracePointContext) -> i32 {
    kfree_skb_without_rx_sk::<true>(&ctx)
}

/// [`kfree_skb_noks`] when the UDP hook beside it covers IPv4 only (IPv6 UDP drops are then
/// counted per netns here).
#[btf_tracepoint(function = "kfree_skb")]
pub fn kfree_skb_noks_v4(ctx: BtfTracePointContext) -> i32 {
    kfree_skb_without_rx_sk::<false>(&ctx)
}

/// The IP version and protocol of a received skb, from its network header (0, 0 when it is
/// not IP). Helper reads: `head` is a plain pointer to the verifier.
#[inline(always)]
fn ip_proto(skb: u64) -> (u8, u8) {
    let head: u64 = load(skb, cfg!(skb_head));
    let nh: u16 = load(skb, compat!(skb_network_header));
    if head == 0 || nh == u16::MAX {
        return (0, 0);
    }
    let b0: u8 = kread(head, nh as u32);
    match b0 >> 4 {
        4 => (4, kread(head, nh as u32 + 9)),
        6 => (6, kread(head, nh as u32 + 6)),
        _ => (0, 0),
    }
}

#[inline(always)]
fn kfree_skb_without_rx_sk<const UDP_V6_COVERED: bool>(ctx: &BtfTracePointContext) -> i32 {
    let reason: u32 = ctx.arg(2);
    if !reason_tracked(reason) {
        return 0;
    }
    let skb: u64 = ctx.arg(0);
    let dev: u64 = kread(skb, cfg!(skb_dev));
    let dev_netns = || -> u32 {
        if dev == 0 {
            0
        } else {
            kread(kread::<u64>(dev, cfg!(dev_net)), cfg!(net_inum))
        }
    };
    if reason == cfg!(reason_full_ring) {
        // A full TUN/TAP ring: attributed to the device's holder, as by the main program.
        let key = DropKey {
            inode: 0,
            netns: dev_netns(),
            id: kread(dev, cfg!(dev_ifindex)),
            reason: reason as u16,
            proto: 0,
            site: drop_site::DEVICE,
            _pad: 0,
        };
        record_drop(&key, &unowned(skb, kread(dev, cfg!(dev_name))));
        return 0;
    }
    // An skb already charged to a socket (e.g. pruned from a TCP out-of-order queue, or on
    // the send side) names it; a full socket only (not a request or timewait mini-socket).
    let sk: u64 = load(skb, compat!(skb_sk));
    if sk != 0 {
        let state: u8 = load(sk, cfg!(sk_state));
        if state != TCP_TIME_WAIT && state != TCP_NEW_SYN_RECV {
            count_on_socket(sk, reason, skb_segs(skb));
            return 0;
        }
    }
    let (version, proto) = ip_proto(skb);
    let udp_queue_reason = reason == compat!(reason_rcvbuff) || reason == compat!(reason_proto_mem);
    if proto == IPPROTO_UDP && udp_queue_reason && (version == 4 || UDP_V6_COVERED) {
        // The UDP hook beside this program counts it on its socket.
        return 0;
    }
    let key = DropKey {
        inode: 0,
        netns: dev_netns(),
        id: 0,
        reason: reason as u16,
        proto,
        site: drop_site::NETNS,
        _pad: 0,
    };
    record_drop(&key, &unowned(skb, [0; 16]));
    0
}

/// The value of one dropped `skb` that no socket owns (no buffer state), with the name of its
/// device for a full TUN/TAP ring.
#[inline(always)]
fn unowned(skb: u64, ifname: [u8; 16]) -> DropVal {
    DropVal {
        packets: skb_segs(skb),
        skbs: 1,
        rcvbuf: 0,
        rmem_alloc: 0,
        last_ns: unsafe { bpf_jiffies64() },
        ifname,
    }
}

// ---------------------------------------------------------------------------------------------
// Autotuning without the tcp_rcvbuf_grow tracepoint
// ---------------------------------------------------------------------------------------------

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
