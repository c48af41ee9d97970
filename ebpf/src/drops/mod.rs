//! Buffer-full drops: per (socket, reason) in `DROPS`, GRO skbs weighted by their segment
//! count. Drop hooks run in softirq, where `current` is whoever was interrupted (usually the
//! sender), so nothing here attributes a drop to `current`: drops are keyed by the socket's
//! inode, and the owner of each inode is recorded in process context by the owner hooks (or
//! found by userspace in `/proc`).
//!
//! | program | hook | variant |
//! |---|---|---|
//! | [`kfree_skb`] | `tp_btf/kfree_skb` with `rx_sk` | 6.11+: every drop names its socket |
//! | [`compat`] | UDP enqueue hooks + `kfree_skb` without `rx_sk` | older kernels |
//! | [`reader::sock_recv_length`] | `tp_btf/sock_recv_length` | which process reads a shared dropping socket |
//!
//! `kfree_skb` runs for every dropped skb on the machine, so the untracked-reason exit comes
//! first and costs two instructions.

pub(crate) mod compat;
pub(crate) mod reader;

use aya_ebpf::{
    bindings::BPF_NOEXIST, helpers::bpf_jiffies64, macros::btf_tracepoint, macros::map,
    maps::PerCpuHashMap, programs::BtfTracePointContext,
};
use bufscope_common::{DropKey, DropVal, drop_site, maps, stat};

use crate::events::stat_inc;
use crate::kmem::{kread, load, load_field};
use crate::sock::{btf_sk_inode, btf_sk_netns};

/// Buffer-full drops per (socket, reason). The size is a default; userspace may resize it at
/// load (`--bpf.*-entries`).
#[map]
static DROPS: PerCpuHashMap<DropKey, DropVal> =
    PerCpuHashMap::with_max_entries(maps::DROPS.default_entries, 0);

/// Whether drop reason `reason` is one the user tracks (`CONFIG.reason_mask`).
#[inline(always)]
pub(crate) fn reason_tracked(reason: u32) -> bool {
    if reason >= 256 {
        return false;
    }
    let word: u64 = match reason >> 6 {
        0 => cfg!(reason_mask[0]),
        1 => cfg!(reason_mask[1]),
        2 => cfg!(reason_mask[2]),
        _ => cfg!(reason_mask[3]),
    };
    word & (1u64 << (reason & 63)) != 0
}

/// Segments carried by a GRO/GSO skb (`skb_shinfo(skb)->gso_segs`), at least 1. `skb` is the
/// BTF-typed tracepoint argument; `head` is a plain byte pointer to the verifier, so the
/// shared info needs one helper read.
#[inline(always)]
pub(crate) fn skb_segs(skb: u64) -> u64 {
    let head: u64 = load(skb, cfg!(skb_head));
    let shinfo = if cfg!(skb_end_is_offset) != 0 {
        let end: u32 = load(skb, cfg!(skb_end));
        head + end as u64
    } else {
        load::<u64>(skb, cfg!(skb_end))
    };
    let segs: u16 = kread(shinfo, cfg!(shinfo_gso_segs));
    if segs == 0 { 1 } else { segs as u64 }
}

/// `tp_btf/kfree_skb(struct sk_buff *skb, void *location, enum skb_drop_reason reason,
/// struct sock *rx_sk)` (rx_sk: 6.11+).
///
/// Per dropped packet: the reason filter, then direct (PROBE_MEM) loads through the typed
/// `rx_sk`/`skb` pointers — one helper call (`gso_segs`) instead of one per field — and one
/// per-CPU hash update. Keys and values are built field by field (no `Default` + update:
/// that compiles to calls of a `memset` subprogram).
#[btf_tracepoint(function = "kfree_skb")]
pub fn kfree_skb(ctx: BtfTracePointContext) -> i32 {
    let reason: u32 = ctx.arg(2);
    if !reason_tracked(reason) {
        return 0;
    }
    let skb: u64 = ctx.arg(0);
    let sk: u64 = ctx.arg(3);
    let key;
    let (rcvbuf, rmem_alloc);
    let mut ifname = [0u8; 16];
    if sk != 0 {
        key = socket_key(sk, reason);
        rcvbuf = load::<i32>(sk, cfg!(sk_rcvbuf));
        rmem_alloc = load::<i32>(sk, cfg!(sk_rmem_alloc));
    } else if reason == cfg!(reason_full_ring) {
        // A full TUN/TAP ring: no socket; the device's owner is found by userspace. Rare:
        // helper reads are fine here.
        let dev: u64 = kread(skb, cfg!(skb_dev));
        key = DropKey {
            inode: 0,
            netns: kread(kread::<u64>(dev, cfg!(dev_net)), cfg!(net_inum)),
            id: kread(dev, cfg!(dev_ifindex)),
            reason: reason as u16,
            proto: 0,
            site: drop_site::DEVICE,
            _pad: 0,
        };
        ifname = kread(dev, cfg!(dev_name));
        (rcvbuf, rmem_alloc) = (0, 0);
    } else {
        return 0;
    }
    let val = DropVal {
        packets: skb_segs(skb),
        skbs: 1,
        rcvbuf,
        rmem_alloc,
        last_ns: unsafe { bpf_jiffies64() },
        ifname,
    };
    record_drop(&key, &val);
    0
}

/// [`count_drop`], then the generation: userspace skips reading `DROPS` while
/// `stat::DROPS_SEEN` has not moved, so it moves after the update.
#[inline(always)]
pub(crate) fn record_drop(key: &DropKey, val: &DropVal) {
    count_drop(key, val);
    stat_inc(stat::DROPS_SEEN);
}

/// The `DROPS` key of a drop on the BTF-typed socket `sk`: by its inode, or by its local port
/// when it has none (a TCP child not accepted yet).
#[inline(always)]
pub(crate) fn socket_key(sk: u64, reason: u32) -> DropKey {
    let inode = btf_sk_inode(sk);
    let (site, id) = if inode == 0 {
        stat_inc(stat::DROP_NO_INODE);
        (
            drop_site::SOCKET_NO_INODE,
            load::<u16>(sk, cfg!(sk_num)) as u32,
        )
    } else {
        (drop_site::SOCKET, 0)
    };
    DropKey {
        inode,
        netns: btf_sk_netns(sk),
        id,
        reason: reason as u16,
        proto: load_field(sk, cfg!(sk_protocol)) as u8,
        site,
        _pad: 0,
    }
}

/// Adds one dropped skb (`val`: its segments, and the socket's or device's state now) to
/// `DROPS`.
///
/// The map is per CPU: an entry created on one CPU starts zeroed on every other, and each CPU
/// updates only its own slot, so every field userspace reads from "the latest CPU" (the buffer
/// sizes, a device's name) is written on every update, not only at creation. A device's name
/// left empty on the CPUs that did not create its entry made userspace look the TUN up by an
/// empty name whenever such a CPU counted last, and hold (then lose to `_unknown`) its drops.
#[inline(always)]
fn count_drop(key: &DropKey, val: &DropVal) {
    if let Some(p) = DROPS.get_ptr_mut(key) {
        add(unsafe { &mut *p }, key, val);
        return;
    }
    if DROPS.insert(key, val, BPF_NOEXIST as u64).is_err() {
        // Created by another CPU meanwhile: this CPU's slot is zeroed, add to it.
        match DROPS.get_ptr_mut(key) {
            Some(p) => add(unsafe { &mut *p }, key, val),
            None => stat_inc(stat::DROPS_MAP_FULL),
        }
    }
}

/// Adds `val` to this CPU's slot `v` of `key`'s entry.
#[inline(always)]
fn add(v: &mut DropVal, key: &DropKey, val: &DropVal) {
    v.packets += val.packets;
    v.skbs += 1;
    v.rcvbuf = val.rcvbuf;
    v.rmem_alloc = val.rmem_alloc;
    v.last_ns = val.last_ns;
    if key.site == drop_site::DEVICE {
        v.ifname = val.ifname;
    }
}
