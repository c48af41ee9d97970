//! Autotuning: `tcp_rcvbuf_grow` fires when the reader copied more than a window's worth in
//! one RTT (the kernel wants a bigger buffer); it fires before the lock check, so a grow on a
//! socket with `SOCK_RCVBUF_LOCK` (or with `tcp_moderate_rcvbuf` off) is a suppressed one.
//! Counted per socket inode in `AUTOTUNE`.
//!
//! | program | hook | variant |
//! |---|---|---|
//! | [`tcp_rcvbuf_grow`] | `tp_btf/tcp_rcvbuf_grow` | 6.16+ |
//! | [`compat`] | `tcp_rcv_space_adjust` hooks | older kernels |

pub(crate) mod compat;

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_jiffies64, bpf_skc_to_tcp_sock},
    macros::{btf_tracepoint, map},
    maps::PerCpuHashMap,
    programs::BtfTracePointContext,
};
use bufscope_common::{AutotuneVal, SOCK_RCVBUF_LOCK, maps, stat};

use crate::events::stat_inc;
use crate::kmem::{load, load_field};
use crate::sock::{btf_sk_inode, btf_sk_netns, btf_sk_userlocks};

/// `tcp_rcvbuf_grow` events per socket inode. The size is a default; userspace may resize it
/// at load (`--bpf.*-entries`).
#[map]
static AUTOTUNE: PerCpuHashMap<u64, AutotuneVal> =
    PerCpuHashMap::with_max_entries(maps::AUTOTUNE.default_entries, 0);

/// `tp_btf/tcp_rcvbuf_grow(struct sock *sk, int time)`.
#[btf_tracepoint(function = "tcp_rcvbuf_grow")]
pub fn tcp_rcvbuf_grow(ctx: BtfTracePointContext) -> i32 {
    let sk: u64 = ctx.arg(0);
    let time: i32 = ctx.arg(1);
    let inode = btf_sk_inode(sk);
    if inode == 0 {
        return 0;
    }
    let tp = unsafe { bpf_skc_to_tcp_sock(sk as *mut _) } as u64;
    if tp == 0 {
        return 0;
    }
    let copied_seq: u32 = load(tp, cfg!(tcp_copied_seq));
    let space_seq: u32 = load(tp, cfg!(tcp_rcvq_space_seq));
    let interval_us = if time > 0 { time as u64 } else { 0 };
    count_grow(
        sk,
        tp,
        inode,
        interval_us,
        copied_seq.wrapping_sub(space_seq) as u64,
    );
    0
}

/// Counts one grow event on socket `inode` (BTF-typed `sk` and its `tcp_sock` `tp`): the
/// reader consumed `copied` bytes in the measurement interval `interval_us`. Shared by
/// [`tcp_rcvbuf_grow`] and the older kernels' hooks in [`compat`].
#[inline(always)]
pub(crate) fn count_grow(sk: u64, tp: u64, inode: u64, interval_us: u64, copied: u64) {
    let locks = btf_sk_userlocks(sk);
    let net: u64 = load(sk, cfg!(sk_net));
    let moderate = {
        let f = cfg!(net_tcp_moderate_rcvbuf);
        // Kernels without the per-netns field always moderate (unless globally off).
        if f.present() { load_field(net, f) } else { 1 }
    };
    let suppressed = (locks & SOCK_RCVBUF_LOCK as u32) != 0 || moderate == 0;
    let rtt8: u32 = load(tp, cfg!(tcp_rcv_rtt_us));
    let rcvbuf: i32 = load(sk, cfg!(sk_rcvbuf));
    let now = unsafe { bpf_jiffies64() };
    let update = |v: &mut AutotuneVal| {
        v.grow_events += 1;
        if suppressed {
            v.suppressed += 1;
        }
        v.copied = copied;
        v.interval_us = interval_us;
        v.last_ns = now;
        v.rtt_us = rtt8 >> 3;
        v.rcvbuf = rcvbuf;
        v.userlocks = locks;
    };
    if let Some(p) = AUTOTUNE.get_ptr_mut(&inode) {
        update(unsafe { &mut *p });
        stat_inc(stat::AUTOTUNE_SEEN);
        return;
    }
    let mut v = AutotuneVal {
        netns: btf_sk_netns(sk),
        ..AutotuneVal::default()
    };
    update(&mut v);
    if AUTOTUNE.insert(&inode, &v, BPF_NOEXIST as u64).is_err() {
        // Lost a race with another CPU (the entry now exists) or the map is full.
        match AUTOTUNE.get_ptr_mut(&inode) {
            Some(p) => update(unsafe { &mut *p }),
            None => stat_inc(stat::AUTOTUNE_MAP_FULL),
        }
    }
    // After the update: userspace skips reading AUTOTUNE while this has not moved.
    stat_inc(stat::AUTOTUNE_SEEN);
}
