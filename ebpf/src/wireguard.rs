//! Kernel WireGuard's queue drops. When a peer's receive queue, the device's decrypt ring or
//! its handshake queue is full, the module frees the packet with `dev_kfree_skb()` (=
//! `consume_skb()`): no `kfree_skb` event, no drop reason, no device counter. `consume_skb`'s
//! tracepoint carries its caller's return address (`location`, 6.3+); userspace puts the
//! address ranges of the module's discard sites into `WG_SITES` (from `/proc/kallsyms`), and
//! this program counts the packets consumed there, by why, per (namespace, UDP port).
//!
//! The port is the outer UDP header's destination (the device's listen port). A packet freed
//! after `wg_reset_packet` (one whose inner header the peer may not send, counted in the
//! device's `rx_errors` too) has its inner headers by then: its port is the inner one.
//!
//! `consume_skb` runs for every packet the kernel consumes, so the hot path is one argument
//! load, one inlined array lookup and three range compares; the rest (helper reads of the skb)
//! runs only for the module's discards.
//!
//! Before 6.3 `consume_skb(skb)` has no `location`; there `fentry/consume_skb` reads it from
//! the BPF trampoline's frame on x86-64: the trampoline (called from `consume_skb`'s first
//! instruction, before `consume_skb` builds a frame) pushes `rbp` right below the return
//! address into `consume_skb`, and below that, the return address into `consume_skb`'s caller
//! is the one `location` would carry. The program's context (the saved arguments) lies
//! `8 × (arguments + 1 when the trampoline keeps a return value)` below the saved `rbp`, so
//! `location` is at `ctx + 24` (an fentry alone) or `ctx + 32` (an fexit on `consume_skb`
//! too); which one is told by the word below it, that must be an address inside `consume_skb`
//! (its range from `/proc/kallsyms`, in `WG_SITES`): a frame laid out otherwise counts
//! nothing, never a wrong site.
//!
//! Kernel WireGuard keeps `struct packet_cb { u64 nonce; struct noise_keypair *keypair;
//! atomic_t state; u32 mtu; u8 ds; }` in `skb->cb` (unchanged since the module was merged in
//! 5.6): the keypair tells a full per-peer queue from an unknown session, the state a packet
//! queued dead (`PACKET_STATE_DEAD` = 2) from a decrypted one.

use aya_ebpf::{
    EbpfContext as _,
    bindings::BPF_NOEXIST,
    macros::{btf_tracepoint, fentry, map},
    maps::{Array, PerCpuHashMap},
    programs::{BtfTracePointContext, FEntryContext},
};
use bufscope_common::{WgKey, WgSites, maps, wg_reason};

use crate::kmem::kread;

/// The module's discard sites (one entry; zeroes while the module is not loaded).
#[map]
static WG_SITES: Array<WgSites> = Array::with_max_entries(maps::WG_SITES.default_entries, 0);

/// Packets discarded per (namespace, port, reason).
#[map]
static WG_DROPS: PerCpuHashMap<WgKey, u64> =
    PerCpuHashMap::with_max_entries(maps::WG_DROPS.default_entries, 0);

/// `packet_cb.keypair`.
const CB_KEYPAIR: u32 = 8;
/// `packet_cb.state`.
const CB_STATE: u32 = 16;
/// `PACKET_STATE_DEAD`.
const STATE_DEAD: u32 = 2;
/// `MESSAGE_DATA` (a little-endian u32 at the start of every WireGuard message).
const MESSAGE_DATA: u32 = 4;

#[inline(always)]
fn within(r: &[u64; 2], a: u64) -> bool {
    a >= r[0] && a < r[1]
}

/// `tp_btf/consume_skb(struct sk_buff *skb, void *location)` (6.3+).
#[btf_tracepoint(function = "consume_skb")]
pub fn wg_consume_skb(ctx: BtfTracePointContext) -> i32 {
    let location: u64 = ctx.arg(1);
    let Some(sites) = WG_SITES.get(0) else {
        return 0;
    };
    count(sites, ctx.arg(0), location);
    0
}

/// `fentry/consume_skb(struct sk_buff *skb)` (before 6.3): `location` from the trampoline's
/// frame (module doc).
#[fentry(function = "consume_skb")]
pub fn wg_consume_skb_entry(ctx: FEntryContext) -> i32 {
    let Some(sites) = WG_SITES.get(0) else {
        return 0;
    };
    if sites.consume[0] == 0 {
        return 0;
    }
    let base = ctx.as_ptr() as u64;
    // An fentry alone: ctx = rbp - 8.
    let location = if within(&sites.consume, kread(base, 16)) {
        kread(base, 24)
    } else if within(&sites.consume, kread(base, 24)) {
        // With a return-value slot (an fexit on consume_skb too): ctx = rbp - 16.
        kread(base, 32)
    } else {
        return 0;
    };
    count(sites, ctx.arg(0), location);
    0
}

/// Counts `skb` when `location` is one of the module's discard sites.
#[inline(always)]
fn count(sites: &WgSites, skb: u64, location: u64) {
    let on_arrival = within(&sites.receive, location) || within(&sites.socket_receive, location);
    if !on_arrival && !within(&sites.rx_poll, location) {
        return;
    }
    let cb = skb + cfg!(skb_cb) as u64;
    let reason = if on_arrival {
        let data: u64 = kread(skb, cfg!(skb_data));
        let ty: u32 = kread(data, 0);
        if ty == MESSAGE_DATA {
            if kread::<u64>(cb, CB_KEYPAIR) != 0 {
                wg_reason::PEER_QUEUE_FULL
            } else {
                wg_reason::UNKNOWN_SESSION
            }
        } else if (1..=3).contains(&ty) {
            wg_reason::HANDSHAKE_QUEUE_FULL
        } else {
            wg_reason::MALFORMED
        }
    } else if kread::<u32>(cb, CB_STATE) == STATE_DEAD {
        wg_reason::DECRYPT_RING_FULL
    } else if kread::<u32>(skb, cfg!(skb_len)) == 0 {
        // A keepalive, consumed after it was processed: no loss.
        return;
    } else {
        wg_reason::REPLAYED_OR_INVALID
    };
    let head: u64 = kread(skb, cfg!(skb_head));
    let th: u16 = kread(skb, cfg!(skb_transport_header));
    // An unset transport header (~0) leaves the port unknown (0).
    let dport: u16 = if th == u16::MAX {
        0
    } else {
        kread(head + th as u64, 2)
    };
    let dev: u64 = kread(skb, cfg!(skb_dev));
    let key = WgKey {
        netns: kread(kread::<u64>(dev, cfg!(dev_net)), cfg!(net_inum)),
        port: u16::from_be(dport),
        reason,
    };
    if let Some(p) = WG_DROPS.get_ptr_mut(&key) {
        unsafe { *p += 1 };
    } else if WG_DROPS.insert(&key, &1, BPF_NOEXIST as u64).is_err() {
        // Created by another CPU meanwhile: this CPU's slot is zeroed.
        if let Some(p) = WG_DROPS.get_ptr_mut(&key) {
            unsafe { *p += 1 };
        }
    }
}
