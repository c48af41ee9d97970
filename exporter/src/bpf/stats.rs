//! The probes' `STATS` per-CPU array: loss counters (a full map or ring buffer) and the
//! generations rooms compare to skip reading maps that did not change.

use aya::maps::{MapData, PerCpuArray};
use bufscope_common::stat;

/// Names of the loss slots, as the `cause` label of `bufscope_bpf_events_lost_total` says them.
const LOST: [(u32, &str); 6] = [
    (stat::DROPS_MAP_FULL, "drops_map_full"),
    (stat::AUTOTUNE_MAP_FULL, "autotune_map_full"),
    (stat::RINGBUF_FULL, "ringbuf_full"),
    (stat::OWNERS_FULL, "owners_map_full"),
    (stat::FD_WALK_FAILED, "fd_walk_failed"),
    (stat::PENDING_FULL, "pending_map_full"),
];

/// The `STATS` map.
pub struct Stats {
    map: PerCpuArray<MapData, u64>,
}

impl Stats {
    /// Wraps the map.
    pub fn new(map: PerCpuArray<MapData, u64>) -> Self {
        Self { map }
    }

    /// One slot ([`stat`]) summed over CPUs (None when the map cannot be read).
    pub fn total(&self, idx: u32) -> Option<u64> {
        let vals = self.map.get(&idx, 0).ok()?;
        Some(vals.iter().sum())
    }

    /// Every loss counter by cause (0 when unreadable).
    pub fn lost(&self) -> Vec<(&'static str, u64)> {
        LOST.iter()
            .map(|(idx, name)| (*name, self.total(*idx).unwrap_or(0)))
            .collect()
    }
}
