//! Ties the probes' maps, attribution and the store together: `poll` (maps → store),
//! `handle_event` (ring buffer → store), `gc` (bounded memory) and `render` (text exposition).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use aya::maps::{MapData, PerCpuArray};
use bufscope_common::{EstablishedEvent, SockoptEvent, event_kind, stat};

use crate::attribution::Attributor;
use crate::kernel::BufferLimits;
use crate::metrics::{self, Health};
use crate::signals::{autotune::Autotune, drops::Drops, sockopt, tcp};
use crate::store::Store;

/// Names of the `STATS` slots, in [`stat`] order, as the `cause` label says them.
const STAT_NAMES: [(u32, &str); 6] = [
    (stat::DROPS_MAP_FULL, "drops_map_full"),
    (stat::AUTOTUNE_MAP_FULL, "autotune_map_full"),
    (stat::RINGBUF_FULL, "ringbuf_full"),
    (stat::OWNERS_FULL, "owners_map_full"),
    (stat::FD_WALK_FAILED, "fd_walk_failed"),
    (stat::PENDING_FULL, "pending_map_full"),
];

/// Timing knobs.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// How often maps are garbage-collected.
    pub gc_every: Duration,
    /// How long a map entry must be idle before it may be collected.
    pub idle: Duration,
}

/// The exporter's state.
pub struct Collector {
    /// Per-process counters.
    pub store: Store,
    /// Socket → process.
    pub attr: Attributor,
    /// Drops signal (None when its probe is off).
    pub drops: Option<Drops>,
    /// Autotune signal (None when its probe is off).
    pub autotune: Option<Autotune>,
    stats: Option<PerCpuArray<MapData, u64>>,
    /// Health facts for rendering.
    pub health: Health,
    /// Current `rmem_max`/`wmem_max`.
    pub limits: BufferLimits,
    timing: Timing,
    last_gc: Instant,
    last_poll: Option<Instant>,
}

impl Collector {
    /// Assembles a collector.
    pub fn new(
        store: Store,
        attr: Attributor,
        drops: Option<Drops>,
        autotune: Option<Autotune>,
        stats: Option<PerCpuArray<MapData, u64>>,
        health: Health,
        timing: Timing,
    ) -> Self {
        Self {
            store,
            attr,
            drops,
            autotune,
            stats,
            health,
            limits: BufferLimits::read(),
            timing,
            last_gc: Instant::now(),
            last_poll: None,
        }
    }

    /// When the maps were last read.
    pub fn last_poll(&self) -> Option<Instant> {
        self.last_poll
    }

    /// Reads every map into the store (and runs GC when due).
    pub fn poll(&mut self) {
        self.limits = BufferLimits::read();
        if let Some(d) = self.drops.as_mut() {
            d.poll(&mut self.attr, &mut self.store);
        }
        if let Some(a) = self.autotune.as_mut() {
            a.poll(&mut self.attr, &mut self.store);
        }
        self.read_stats();
        self.last_poll = Some(Instant::now());
        if self.last_gc.elapsed() >= self.timing.gc_every {
            self.gc();
        }
    }

    fn read_stats(&mut self) {
        let Some(stats) = self.stats.as_ref() else {
            return;
        };
        self.health.bpf_lost = STAT_NAMES
            .iter()
            .map(|(idx, name)| {
                let v = stats
                    .get(idx, 0)
                    .map(|vals| vals.iter().sum::<u64>())
                    .unwrap_or(0);
                (*name, v)
            })
            .collect();
        self.health.rmem_max = self.limits.rmem_max;
        self.health.wmem_max = self.limits.wmem_max;
    }

    /// Handles one ring-buffer record.
    pub fn handle_event(&mut self, bytes: &[u8]) {
        let Some(kind) = bytes
            .get(..4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        else {
            return;
        };
        match kind {
            event_kind::SOCKOPT => {
                if let Some(ev) = read::<SockoptEvent>(bytes) {
                    let _ = sockopt::handle(&ev, &mut self.attr, &mut self.store);
                }
            }
            event_kind::ESTABLISHED => {
                if let Some(ev) = read::<EstablishedEvent>(bytes) {
                    let _ = tcp::handle(&ev, self.limits.rmem_max, &mut self.attr, &mut self.store);
                }
            }
            other => tracing::debug!("unknown event kind {other}"),
        }
    }

    /// Expires exited processes and deletes map entries of closed sockets.
    pub fn gc(&mut self) {
        self.last_gc = Instant::now();
        let attr = &self.attr;
        self.store.expire(|p| attr.alive(p));
        let live: HashSet<u64> = self
            .attr
            .procfs()
            .all_socket_holders()
            .into_keys()
            .collect();
        let mut removed = 0;
        if let Some(d) = self.drops.as_mut() {
            removed += d.gc(&live, self.timing.idle, &mut self.attr);
        }
        if let Some(a) = self.autotune.as_mut() {
            removed += a.gc(&live, self.timing.idle);
        }
        let store = &self.store;
        let drops = &self.drops;
        self.attr.retain_procs(|p| {
            store.get(p).is_some()
                || drops
                    .as_ref()
                    .is_some_and(|d| d.seen().any(|(_, s)| s.owner.as_ref() == Some(p)))
        });
        if removed > 0 {
            tracing::debug!(removed, "garbage-collected map entries of closed sockets");
        }
    }

    /// Prometheus text exposition.
    pub fn render(&mut self, map_sizes: &crate::probes::MapSizes) -> String {
        self.health.map_entries = vec![
            (
                "DROPS",
                self.drops.as_ref().map_or(0, |d| d.entries() as u64),
                map_sizes.drops as u64,
            ),
            (
                "AUTOTUNE",
                self.autotune.as_ref().map_or(0, |a| a.entries() as u64),
                map_sizes.autotune as u64,
            ),
        ];
        let fams = metrics::families(&self.store, &self.health);
        metrics::encode(&fams).unwrap_or_else(|e| {
            tracing::error!("encoding metrics: {e}");
            String::new()
        })
    }
}

/// Reads a `#[repr(C)]` POD event from the start of `bytes`.
fn read<T: Copy>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: length checked; T is a #[repr(C)] integer-only type from bufscope-common, valid
    // for any bit pattern; read_unaligned handles the ring buffer's 8-byte alignment.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const T) })
}
