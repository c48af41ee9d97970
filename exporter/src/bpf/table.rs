//! The map-read seam: the rooms (and the shared services) read and write their BPF maps
//! through [`Table`], with the kernel's map behind it when bufscope runs and an in-memory
//! [`Fake`](super::fake::FakeTable) in unit tests, so a room's poll, GC and render logic is
//! tested without root (the model is aya's own `sys/fake.rs`).
//!
//! A per-CPU map is a `Table<K, Vec<T>>`: one value per possible CPU, which the room sums.
//! Its kernel side reads whole maps with `BPF_MAP_LOOKUP_BATCH` where the kernel allows
//! ([`BatchReader`]), else key by key, and reads-and-deletes in one step
//! (`BPF_MAP_LOOKUP_AND_DELETE_ELEM`) where it can.

use anyhow::Context as _;
use aya::Ebpf;
use aya::maps::{
    Array, HashMap as BpfHashMap, IterableMap as _, MapData, PerCpuArray, PerCpuHashMap,
    PerCpuValues,
};
use bufscope_common::MapSpec;

use super::BatchReader;
use super::maps::take_map;

/// A BPF map as a room uses it. Keys `K`, values `V` (`Vec<T>` for a per-CPU map: one value
/// per possible CPU). Errors of a read are logged by the kernel side (with the map's name)
/// and end that read: a room counts what it could read and reads again at the next poll.
pub trait Table<K, V>: Send {
    /// Every entry that could be read.
    fn entries(&mut self) -> Vec<(K, V)>;

    /// One entry (None: absent or unreadable).
    fn get(&self, key: &K) -> Option<V>;

    /// Writes one entry (a per-CPU value shorter than the CPU count is padded with zeroes).
    fn insert(&mut self, key: K, value: V) -> anyhow::Result<()>;

    /// Deletes one entry (an absent one is not an error).
    fn remove(&mut self, key: &K);

    /// Deletes one entry and returns its value as it was when it went, where the kernel reads
    /// and deletes in one step (5.14+ for hash maps); None when it was absent, or when the
    /// kernel could only delete it (its last value is then unknown).
    fn take(&mut self, key: &K) -> Option<V>;
}

/// A per-CPU map's table.
pub type PerCpuTable<K, T> = Box<dyn Table<K, Vec<T>>>;

/// What aya's key-by-key iterator over map `name` yields, up to its first error (logged: the
/// read ends there and the next poll reads again).
fn key_by_key<T>(
    name: &str,
    items: impl Iterator<Item = Result<T, aya::maps::MapError>>,
) -> Vec<T> {
    let mut out = Vec::new();
    for item in items {
        match item {
            Ok(kv) => out.push(kv),
            Err(e) => {
                tracing::debug!("{name} iteration: {e}");
                break;
            }
        }
    }
    out
}

/// A kernel per-CPU hash map (`BPF_MAP_TYPE_PERCPU_HASH`, `LRU_PERCPU_HASH`).
pub struct PerCpuHash<K: aya::Pod, T: aya::Pod> {
    name: &'static str,
    map: PerCpuHashMap<MapData, K, T>,
    /// Batch reads (None: the kernel or the map does not allow them).
    batch: Option<BatchReader>,
}

impl<K: aya::Pod, T: aya::Pod> PerCpuHash<K, T> {
    /// Wraps `map` (named `name` in logs).
    pub fn new(name: &'static str, map: PerCpuHashMap<MapData, K, T>) -> Self {
        let batch = BatchReader::new(map.map(), size_of::<K>(), size_of::<T>());
        Self { name, map, batch }
    }

    /// Takes map `spec` out of the loaded object.
    pub fn take(ebpf: &mut Ebpf, spec: MapSpec) -> anyhow::Result<PerCpuTable<K, T>>
    where
        K: Send + 'static,
        T: Default + Send + 'static,
    {
        Ok(Box::new(Self::new(spec.name, take_map(ebpf, spec.name)?)))
    }

    /// Whether whole reads and read-and-delete go through batch calls.
    pub fn batched(&self) -> bool {
        self.batch.is_some()
    }
}

/// `values` as the kernel wants them for an update: one per possible CPU.
fn per_cpu<T: aya::Pod + Default>(mut values: Vec<T>) -> anyhow::Result<PerCpuValues<T>> {
    let cpus = aya::util::nr_cpus()
        .map_err(|(_, e)| e)
        .context("counting CPUs")?;
    values.resize(cpus.max(values.len()), T::default());
    values.truncate(cpus);
    Ok(PerCpuValues::try_from(values)?)
}

impl<K: aya::Pod + Send, T: aya::Pod + Default + Send> Table<K, Vec<T>> for PerCpuHash<K, T> {
    fn entries(&mut self) -> Vec<(K, Vec<T>)> {
        if let Some(b) = &self.batch {
            match b.read::<K, T>(self.map.map().fd()) {
                Ok(all) => return all,
                Err(e) => {
                    tracing::debug!("{} batch read failed ({e}); reading key by key", self.name);
                    self.batch = None;
                }
            }
        }
        key_by_key(self.name, self.map.iter())
            .into_iter()
            .map(|(k, v)| (k, v.iter().copied().collect()))
            .collect()
    }

    fn get(&self, key: &K) -> Option<Vec<T>> {
        self.map
            .get(key, 0)
            .ok()
            .map(|v| v.iter().copied().collect())
    }

    fn insert(&mut self, key: K, value: Vec<T>) -> anyhow::Result<()> {
        self.map
            .insert(key, per_cpu(value)?, 0)
            .with_context(|| format!("writing {}", self.name))
    }

    fn remove(&mut self, key: &K) {
        let _ = self.map.remove(key);
    }

    fn take(&mut self, key: &K) -> Option<Vec<T>> {
        if let Some(b) = &self.batch {
            match b.take::<K, T>(self.map.map().fd(), key) {
                Ok(v) => return v,
                Err(e) => {
                    tracing::debug!(
                        "{} lookup-and-delete failed ({e}); deleting plainly",
                        self.name
                    );
                }
            }
        }
        let _ = self.map.remove(key);
        None
    }
}

/// A kernel hash map (`BPF_MAP_TYPE_HASH`, `LRU_HASH`).
pub struct Hash<K: aya::Pod, V: aya::Pod> {
    name: &'static str,
    map: BpfHashMap<MapData, K, V>,
    batch: Option<BatchReader>,
}

impl<K: aya::Pod + Send + 'static, V: aya::Pod + Send + 'static> Hash<K, V> {
    /// Wraps `map` (named `name` in logs).
    pub fn new(name: &'static str, map: BpfHashMap<MapData, K, V>) -> Self {
        let batch = BatchReader::shared(map.map(), size_of::<K>(), size_of::<V>());
        Self { name, map, batch }
    }

    /// Takes map `spec` out of the loaded object.
    pub fn take(ebpf: &mut Ebpf, spec: MapSpec) -> anyhow::Result<Box<dyn Table<K, V>>> {
        Ok(Box::new(Self::new(spec.name, take_map(ebpf, spec.name)?)))
    }
}

impl<K: aya::Pod + Send, V: aya::Pod + Send> Table<K, V> for Hash<K, V> {
    fn entries(&mut self) -> Vec<(K, V)> {
        if let Some(b) = &self.batch {
            match b.read::<K, V>(self.map.map().fd()) {
                Ok(all) => {
                    return all
                        .into_iter()
                        .filter_map(|(k, v)| Some((k, *v.first()?)))
                        .collect();
                }
                Err(e) => {
                    tracing::debug!("{} batch read failed ({e}); reading key by key", self.name);
                    self.batch = None;
                }
            }
        }
        key_by_key(self.name, self.map.iter())
    }

    fn get(&self, key: &K) -> Option<V> {
        self.map.get(key, 0).ok()
    }

    fn insert(&mut self, key: K, value: V) -> anyhow::Result<()> {
        self.map
            .insert(key, value, 0)
            .with_context(|| format!("writing {}", self.name))
    }

    fn remove(&mut self, key: &K) {
        let _ = self.map.remove(key);
    }

    fn take(&mut self, key: &K) -> Option<V> {
        if let Some(b) = &self.batch
            && let Ok(v) = b.take::<K, V>(self.map.map().fd(), key)
        {
            return v.and_then(|v| v.first().copied());
        }
        let _ = self.map.remove(key);
        None
    }
}

/// A kernel per-CPU array (`BPF_MAP_TYPE_PERCPU_ARRAY`): keys are indexes; entries cannot be
/// deleted (removing one zeroes it).
pub struct PerCpuSlots<T: aya::Pod> {
    name: &'static str,
    map: PerCpuArray<MapData, T>,
}

impl<T: aya::Pod + Default + Send + 'static> PerCpuSlots<T> {
    /// Takes map `spec` out of the loaded object.
    pub fn take(ebpf: &mut Ebpf, spec: MapSpec) -> anyhow::Result<PerCpuTable<u32, T>> {
        Ok(Box::new(Self {
            name: spec.name,
            map: take_map(ebpf, spec.name)?,
        }))
    }
}

impl<T: aya::Pod + Default + Send> Table<u32, Vec<T>> for PerCpuSlots<T> {
    fn entries(&mut self) -> Vec<(u32, Vec<T>)> {
        (0..self.map.len())
            .filter_map(|i| Some((i, self.get(&i)?)))
            .collect()
    }

    fn get(&self, key: &u32) -> Option<Vec<T>> {
        self.map
            .get(key, 0)
            .ok()
            .map(|v| v.iter().copied().collect())
    }

    fn insert(&mut self, key: u32, value: Vec<T>) -> anyhow::Result<()> {
        self.map
            .set(key, per_cpu(value)?, 0)
            .with_context(|| format!("writing {}", self.name))
    }

    fn remove(&mut self, key: &u32) {
        let _ = self.insert(*key, Vec::new());
    }

    fn take(&mut self, key: &u32) -> Option<Vec<T>> {
        let v = self.get(key);
        self.remove(key);
        v
    }
}

/// A kernel array (`BPF_MAP_TYPE_ARRAY`): keys are indexes; entries cannot be deleted
/// (removing one zeroes it).
pub struct Slots<T: aya::Pod> {
    name: &'static str,
    map: Array<MapData, T>,
}

impl<T: aya::Pod + Default + Send + 'static> Slots<T> {
    /// Takes map `spec` out of the loaded object.
    pub fn take(ebpf: &mut Ebpf, spec: MapSpec) -> anyhow::Result<Box<dyn Table<u32, T>>> {
        Ok(Box::new(Self {
            name: spec.name,
            map: take_map(ebpf, spec.name)?,
        }))
    }
}

impl<T: aya::Pod + Default + Send> Table<u32, T> for Slots<T> {
    fn entries(&mut self) -> Vec<(u32, T)> {
        (0..self.map.len())
            .filter_map(|i| Some((i, self.get(&i)?)))
            .collect()
    }

    fn get(&self, key: &u32) -> Option<T> {
        self.map.get(key, 0).ok()
    }

    fn insert(&mut self, key: u32, value: T) -> anyhow::Result<()> {
        self.map
            .set(key, value, 0)
            .with_context(|| format!("writing {}", self.name))
    }

    fn remove(&mut self, key: &u32) {
        let _ = self.insert(*key, T::default());
    }

    fn take(&mut self, key: &u32) -> Option<T> {
        let v = self.get(key);
        self.remove(key);
        v
    }
}
