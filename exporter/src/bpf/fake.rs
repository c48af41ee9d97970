//! In-memory stand-ins for the kernel's maps and ring buffer (unit tests only): what a room
//! reads through [`Table`] and [`Records`], written by the test as the BPF programs would.
//!
//! A fake is a handle: clones share one map, so a test keeps one clone, hands another to the
//! room, and plays the kernel on its own (counts that arrive between two polls, an entry that
//! moves between the read and the delete, a full map).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use super::ring::Records;
use super::table::Table;

/// An in-memory BPF map, shared by its clones.
#[derive(Debug)]
pub struct FakeTable<K, V> {
    inner: Arc<Mutex<FakeMap<K, V>>>,
}

#[derive(Debug)]
struct FakeMap<K, V> {
    entries: Vec<(K, V)>,
    capacity: usize,
    /// Whether the kernel reads and deletes in one step (else `take` deletes plainly).
    lookup_and_delete: bool,
    /// Reads through [`Table`]: whole-map reads, single-entry lookups.
    reads: (usize, usize),
}

impl<K, V> Clone for FakeTable<K, V> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<K: PartialEq + Copy, V: Clone> FakeTable<K, V> {
    /// An empty map of `capacity` entries (a kernel that reads and deletes in one step).
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(FakeMap {
                entries: Vec::new(),
                capacity,
                lookup_and_delete: true,
                reads: (0, 0),
            })),
        }
    }

    /// A kernel before 5.14: deleting an entry does not return it.
    pub fn without_lookup_and_delete(self) -> Self {
        self.lock().lookup_and_delete = false;
        self
    }

    fn lock(&self) -> MutexGuard<'_, FakeMap<K, V>> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sets `key` as a BPF program would (ignores the capacity: the programs' own inserts
    /// fail on a full map, which a test says by not calling this).
    pub fn set(&self, key: K, value: V) {
        let mut m = self.lock();
        match m.entries.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => *v = value,
            None => m.entries.push((key, value)),
        }
    }

    /// The value of `key`.
    pub fn value(&self, key: &K) -> Option<V> {
        self.lock()
            .entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    /// Reads through [`Table`] so far: (whole-map reads, single-entry lookups).
    pub fn reads(&self) -> (usize, usize) {
        self.lock().reads
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A boxed handle for a room.
    pub fn boxed(&self) -> Box<dyn Table<K, V>>
    where
        K: Send + 'static,
        V: Send + 'static,
    {
        Box::new(self.clone())
    }
}

impl<K: PartialEq + Copy + Send, V: Clone + Send> Table<K, V> for FakeTable<K, V> {
    fn entries(&mut self) -> Vec<(K, V)> {
        let mut m = self.lock();
        m.reads.0 += 1;
        m.entries.clone()
    }

    fn get(&self, key: &K) -> Option<V> {
        self.lock().reads.1 += 1;
        self.value(key)
    }

    fn insert(&mut self, key: K, value: V) -> anyhow::Result<()> {
        let mut m = self.lock();
        if let Some((_, v)) = m.entries.iter_mut().find(|(k, _)| *k == key) {
            *v = value;
            return Ok(());
        }
        if m.entries.len() >= m.capacity {
            anyhow::bail!("map full (E2BIG)");
        }
        m.entries.push((key, value));
        Ok(())
    }

    fn remove(&mut self, key: &K) {
        self.lock().entries.retain(|(k, _)| k != key);
    }

    fn take(&mut self, key: &K) -> Option<V> {
        let mut m = self.lock();
        let i = m.entries.iter().position(|(k, _)| k == key)?;
        let (_, v) = m.entries.remove(i);
        m.lookup_and_delete.then_some(v)
    }
}

/// An in-memory event ring buffer: records pushed by the test, drained by the collector.
#[derive(Clone, Debug, Default)]
pub struct FakeRing {
    inner: Arc<Mutex<VecDeque<Vec<u8>>>>,
}

impl FakeRing {
    /// Commits one record (its bytes as a BPF program would reserve and fill them).
    pub fn push(&self, record: Vec<u8>) {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push_back(record);
    }

    /// Commits `value` as a record (a `#[repr(C)]` event of `bufscope-common`).
    pub fn push_pod<T: aya::Pod>(&self, value: &T) {
        self.push(crate::signals::testkit::record(value));
    }
}

impl Records for FakeRing {
    fn drain(&mut self, each: &mut dyn FnMut(&[u8])) -> usize {
        let taken: Vec<Vec<u8>> = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain(..)
            .collect();
        for r in &taken {
            each(r);
        }
        taken.len()
    }
}
