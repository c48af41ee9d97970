//! The part every map-backed room shares ([`CountedMap`]): a per-CPU hash map its probe counts
//! in, the per-key state of the room's last read, and the probe's `STATS` generation that
//! says whether the map changed since (so an idle host with thousands of entries is not read
//! every poll). The room keeps what its signal means; this keeps the reading.

use std::hash::Hash;
use std::time::{Duration, Instant};

use bufscope_common::MapSpec;
use foldhash::{HashMap, HashMapExt as _};

use super::MapFill;
use crate::bpf::{PerCpuTable, Stats};

/// The per-key state a room keeps: when its counts last moved.
pub trait Changed {
    /// When the entry's counts last moved.
    fn changed(&self) -> Instant;
}

/// A per-CPU map a probe counts in, as its room reads it.
pub struct CountedMap<K, T, S> {
    spec: MapSpec,
    max_entries: u32,
    map: PerCpuTable<K, T>,
    /// Each key's state as of the last read.
    pub last: HashMap<K, S>,
    /// The `STATS` slot the probe bumps after each update of the map.
    seen_slot: u32,
    /// That slot as read just before the last full read of the map.
    read_at: Option<u64>,
    /// Sums one key's per-CPU values (the room's rule for the fields that are not counts).
    sum: fn(&[T]) -> T,
}

impl<K: Copy + Eq + Hash, T, S: Changed> CountedMap<K, T, S> {
    /// The map `spec` sized `max_entries`, read through `map`, whose probe bumps
    /// `STATS[seen_slot]` after each update; `sum` folds one key's per-CPU values.
    pub fn new(
        spec: MapSpec,
        max_entries: u32,
        map: PerCpuTable<K, T>,
        seen_slot: u32,
        sum: fn(&[T]) -> T,
    ) -> Self {
        Self {
            spec,
            max_entries,
            map,
            last: HashMap::new(),
            seen_slot,
            read_at: None,
            sum,
        }
    }

    /// The probe's generation now (None: `STATS` unreadable, then every poll reads).
    pub fn generation(&self, stats: Option<&Stats>) -> Option<u64> {
        stats.and_then(|s| s.total(self.seen_slot))
    }

    /// Whether `generation` says nothing was counted since the last full read.
    pub fn unchanged(&self, generation: Option<u64>) -> bool {
        generation.is_some() && generation == self.read_at
    }

    /// Every entry, its per-CPU values summed; `generation` (read before) is what the next
    /// [`CountedMap::unchanged`] compares with.
    pub fn read(&mut self, generation: Option<u64>) -> Vec<(K, T)> {
        self.read_at = generation;
        let sum = self.sum;
        self.map
            .entries()
            .into_iter()
            .map(|(k, v)| (k, sum(&v)))
            .collect()
    }

    /// Deletes `key`, read in the same step where the kernel can (see [`crate::bpf::Table::take`]):
    /// its summed value as it was when it went.
    pub fn take(&mut self, key: &K) -> Option<T> {
        let sum = self.sum;
        self.map.take(key).map(|v| sum(&v))
    }

    /// Deletes `key` from the map.
    pub fn remove(&mut self, key: &K) {
        self.map.remove(key);
    }

    /// Writes `key` (all on the first CPU).
    pub fn insert(&mut self, key: K, value: T) -> anyhow::Result<()> {
        self.map.insert(key, vec![value])
    }

    /// Keys whose counts have not moved for `idle` (as of `now`), with their state.
    pub fn idle(&self, idle: Duration, now: Instant) -> impl Iterator<Item = (&K, &S)> {
        self.last
            .iter()
            .filter(move |(_, s)| now.duration_since(s.changed()) >= idle)
    }

    /// Its fill level (as of the last read).
    pub fn fill(&self) -> MapFill {
        MapFill {
            map: self.spec.name,
            entries: self.last.len() as u64,
            max_entries: u64::from(self.max_entries),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::fake::FakeTable;
    use bufscope_common::maps;

    struct At(Instant);
    impl Changed for At {
        fn changed(&self) -> Instant {
            self.0
        }
    }

    fn sum(v: &[u64]) -> u64 {
        v.iter().sum()
    }

    #[test]
    fn reads_sum_per_cpu_and_the_generation_says_when_to_read_again() {
        let kernel = FakeTable::<u64, Vec<u64>>::new(16);
        let slots = FakeTable::<u32, Vec<u64>>::new(16);
        let stats = Stats::new(slots.boxed());
        let mut m: CountedMap<u64, u64, At> =
            CountedMap::new(maps::AUTOTUNE, 16, kernel.boxed(), 3, sum);
        kernel.set(7, vec![2, 3]);
        slots.set(3, vec![1, 0]);
        let g = m.generation(Some(&stats));
        assert_eq!(g, Some(1));
        assert!(!m.unchanged(g), "never read");
        assert_eq!(m.read(g), vec![(7, 5)]);
        assert!(m.unchanged(m.generation(Some(&stats))));
        slots.set(3, vec![1, 1]);
        assert!(
            !m.unchanged(m.generation(Some(&stats))),
            "the probe counted"
        );
        assert!(!m.unchanged(None), "no STATS: always read");
        assert_eq!(m.take(&7), Some(5));
        assert!(kernel.is_empty());
        assert_eq!(m.take(&7), None);
    }

    #[test]
    fn idle_keys_and_fill() {
        let mut m: CountedMap<u64, u64, At> =
            CountedMap::new(maps::DROPS, 100, FakeTable::new(100).boxed(), 0, sum);
        let now = Instant::now();
        m.last.insert(1, At(now - Duration::from_secs(40)));
        m.last.insert(2, At(now));
        let idle: Vec<u64> = m
            .idle(Duration::from_secs(30), now)
            .map(|(k, _)| *k)
            .collect();
        assert_eq!(idle, vec![1]);
        let f = m.fill();
        assert_eq!((f.map, f.entries, f.max_entries), ("DROPS", 2, 100));
    }
}
