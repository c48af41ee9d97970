//! The maps every signal shares: the `EVENTS` ring buffer (low-rate events with detail:
//! setsockopt calls, established connections, guard decisions), the probes' own health
//! counters in `STATS`, and `TOTALS`, where userspace keeps the per-process counters it
//! builds from events (no program touches it: it is here to be pinned with the rest).

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    macros::map,
    maps::{LruHashMap, PerCpuArray, RingBuf},
};
use bufscope_common::{TotalKey, maps};

/// Low-rate events with detail (setsockopt calls, established connections, guard decisions).
/// The size is a default; userspace may resize it at load (`--bpf.*` flags).
#[map]
pub(crate) static EVENTS: RingBuf = RingBuf::with_byte_size(maps::EVENTS.default_entries, 0);

/// The probes' own health counters (indexes in [`bufscope_common::stat`]).
#[map]
static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(maps::STATS.default_entries, 0);

/// Per-process counters built from events, written by userspace only ([`TotalKey`]): with
/// `--bpf.pin-path` they outlive a bufscope restart like the counting maps. LRU: a full map
/// forgets the least recently written process instead of refusing a new one.
#[map]
static TOTALS: LruHashMap<TotalKey, u64> =
    LruHashMap::with_max_entries(maps::TOTALS.default_entries, 0);

/// Adds one to `STATS[idx]` on this CPU.
#[inline(always)]
pub(crate) fn stat_inc(idx: u32) {
    if let Some(p) = STATS.get_ptr_mut(idx) {
        unsafe { *p += 1 };
    }
}

/// `bpf_ringbuf_submit` flags. With `CONFIG.ringbuf_wakeup_bytes == 0`, the kernel's default
/// (wake the reader when it has caught up, i.e. for nearly every event at low rates; each
/// wake-up is an irq_work self-IPI, about 1 µs in a VM). Otherwise no wake-up until that much
/// data waits: the reader must then also drain on a timer.
#[inline(always)]
pub(crate) fn submit_flags() -> u64 {
    let bytes = cfg!(ringbuf_wakeup_bytes);
    if bytes == 0 {
        return 0;
    }
    if EVENTS.query(BPF_RB_AVAIL_DATA as u64) >= bytes as u64 {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}
