//! What a restart with `--bpf.pin-path` needs to continue every series: per *identity*
//! ([`crate::store::series`]), kept in the pinned `TOTALS` map.
//!
//! The probes' own maps (`DROPS`, `AUTOTUNE`) outlive bufscope when pinned and give the
//! tracked processes their counts back. What they cannot give back is kept here, per
//! identity, keyed by its stable hash ([`crate::store::identity_hash`]): the counts of its
//! processes that left (departed: exited, or folded out of the per-process detail), every
//! counter of theirs included, plus the counters its tracked processes built from
//! ring-buffer records (setsockopt calls, TCP connections, window-scale shrinks, locks;
//! [`crate::signals::Part::totals`]), and whether it had series of its own. After every drain
//! of the ring buffer and every poll the collector writes the identities' records that
//! changed ([`Totals::flush`]: one map update per changed counter). The next bufscope that
//! adopts the pins finds each identity again by a live process that has it and starts it from
//! its record ([`crate::store::Store::restore_identity`]); its tracked processes count the
//! map-read counters from the pinned maps and the events from the restart on, so every
//! series goes on from where it was. The restart gap is what the old bufscope took off the
//! ring buffer and did not write yet: the records of one drain, when it is killed between
//! the two (it writes right after each drain, under the same lock).
//!
//! Keyed by identity, the map holds a few entries per program and place, not per process:
//! 50,000 short-lived processes a minute of a few programs touch the entries of those few
//! identities, and never push out a quiet long-lived one (the map is an LRU; at most
//! `--max-processes` identities exist, their entries deleted at the next GC after they
//! leave).

use bufscope_common::{TotalKey, maps};
use foldhash::{HashMap, HashMapExt as _, HashSet};

use crate::bpf::Table;
use crate::bpf::table::Hash;

/// One counter of a process's part (see [`crate::signals::Part::totals`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Total {
    /// Which counter ([`bufscope_common::total_family`]).
    pub family: u8,
    /// IP protocol (`IPPROTO_*`), 0 for none.
    pub proto: u8,
    /// Socket option (`SO_*`) or drop reason number, 0 for none.
    pub option: u8,
    /// Its value.
    pub value: u64,
}

/// The pinned `TOTALS` map and what was last written to it.
pub struct Totals {
    map: Box<dyn Table<TotalKey, u64>>,
    /// Every entry as bufscope last wrote (or read) it.
    written: HashMap<TotalKey, u64>,
    /// Writes that failed (logged once).
    warned: bool,
}

/// The key of counter `t` of the identity whose hash is `identity`. A `tgid` of 0 says
/// "an identity" (entries of earlier versions, per process, have a pid there).
pub fn key(identity: u64, t: &Total) -> TotalKey {
    TotalKey {
        start_ticks: identity,
        tgid: 0,
        family: t.family,
        proto: t.proto,
        option: t.option,
        _pad: 0,
    }
}

/// Sums the counters of `totals` that have the same key (a departed count and a tracked
/// process's of the same counter).
pub fn merged(totals: impl IntoIterator<Item = Total>) -> Vec<Total> {
    let mut by: std::collections::BTreeMap<(u8, u8, u8), u64> = std::collections::BTreeMap::new();
    for t in totals {
        *by.entry((t.family, t.proto, t.option)).or_default() += t.value;
    }
    by.into_iter()
        .map(|((family, proto, option), value)| Total {
            family,
            proto,
            option,
            value,
        })
        .collect()
}

impl Totals {
    /// Takes the pinned `TOTALS` out of the loaded object.
    pub fn take(ebpf: &mut aya::Ebpf) -> anyhow::Result<Self> {
        Ok(Self::new(Hash::take(ebpf, maps::TOTALS)?))
    }

    /// Wraps the map (pinned: otherwise there is nothing to keep; a fake in tests).
    pub fn new(map: Box<dyn Table<TotalKey, u64>>) -> Self {
        Self {
            map,
            written: HashMap::new(),
            warned: false,
        }
    }

    /// Every identity's record (the maps were adopted from an earlier bufscope), by hash.
    /// Entries of an earlier layout (per process) are deleted.
    pub fn read(&mut self) -> HashMap<u64, Vec<Total>> {
        let mut out: HashMap<u64, Vec<Total>> = HashMap::new();
        for (k, v) in self.map.entries() {
            if k.tgid != 0 {
                self.map.remove(&k);
                continue;
            }
            self.written.insert(k, v);
            out.entry(k.start_ticks).or_default().push(Total {
                family: k.family,
                proto: k.proto,
                option: k.option,
                value: v,
            });
        }
        out
    }

    /// Writes the records of `identities` (each identity's hash and its current counters)
    /// whose counters changed.
    pub fn flush(&mut self, identities: impl IntoIterator<Item = (u64, Vec<Total>)>) {
        for (h, totals) in identities {
            for t in totals {
                let k = key(h, &t);
                if self.written.get(&k) == Some(&t.value) {
                    continue;
                }
                match self.map.insert(k, t.value) {
                    Ok(()) => {
                        self.written.insert(k, t.value);
                    }
                    Err(e) if !self.warned => {
                        self.warned = true;
                        tracing::warn!(
                            "keeping counters for a restart failed ({e:#}): the series of the next bufscope restart from what its maps hold"
                        );
                    }
                    Err(_) => {}
                }
            }
        }
    }

    /// Deletes the entries of identities `keep` refuses (they left the store).
    pub fn retain(&mut self, keep: impl Fn(u64) -> bool) {
        let gone: Vec<TotalKey> = self
            .written
            .keys()
            .filter(|k| !keep(k.start_ticks))
            .copied()
            .collect();
        for k in gone {
            self.map.remove(&k);
            self.written.remove(&k);
        }
    }

    /// Identities with entries.
    pub fn identities(&self) -> HashSet<u64> {
        self.written.keys().map(|k| k.start_ticks).collect()
    }

    /// Entries written (tests, self-checks).
    pub fn len(&self) -> usize {
        self.written.len()
    }

    /// True when nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.written.is_empty()
    }
}
