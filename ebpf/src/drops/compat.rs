//! Drops on kernels whose `kfree_skb` has no `rx_sk` (before 6.11), chosen by userspace from
//! the running kernel's BTF (and, where a load is refused, by trying the next variant).
//!
//! | program | hook | used when |
//! |---|---|---|
//! | [`udp_enqueue_exit`] | `fexit/__udp_enqueue_schedule_skb` | fexit allowed: UDP v4+v6 per socket, exact |
//! | [`udp_fail_queue_rcv_skb`] | `tp_btf/udp_fail_queue_rcv_skb` | UDP per socket; IPv6 only on kernels whose tracepoint has `family` (≈6.4+) |
//! | [`kfree_skb_noks`], [`kfree_skb_noks_v4`] | `tp_btf/kfree_skb` (3 arguments) | everything else — skbs a socket owns by that socket, the rest per netns |

use aya_ebpf::{
    helpers::bpf_jiffies64,
    macros::{btf_tracepoint, fexit},
    programs::{BtfTracePointContext, FExitContext},
};
use bufscope_common::{DropKey, DropVal, IPPROTO_UDP, drop_site};

use super::{reason_tracked, record_drop, skb_segs, socket_key};
use crate::kmem::{kread, load};

const ENOMEM: i32 = 12;
const TCP_TIME_WAIT: u8 = 6;
const TCP_NEW_SYN_RECV: u8 = 12;

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
