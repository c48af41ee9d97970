//! Per-process counters that bufscope builds from events (setsockopt calls, TCP connections,
//! window-scale shrinks, locks), kept in the pinned `TOTALS` map so that a restart with
//! `--bpf.pin-path` is no reset for them either.
//!
//! Drops and autotune are read from maps the probes count in, which outlive bufscope when
//! pinned. The other families are counted here, from ring-buffer records: each room says
//! which of its part's counters those are ([`crate::signals::Part::totals`]), and after every
//! drain of the ring buffer and every poll the collector writes the totals of the processes
//! that counted since ([`Totals::flush`]: one map update per changed counter). The next
//! bufscope that adopts the pins reads them back and gives each live process (same pid and
//! start time) its counts again ([`crate::signals::Part::restore`]), then counts the records
//! that waited in the pinned ring buffer on top. The restart gap is what the old bufscope
//! took off the ring buffer and did not write yet: the records of one drain, when it is
//! killed between the two (it writes right after each drain, under the same lock).
//!
//! Entries of processes that leave the store (exited and past `--retention`, or folded into
//! `_other`) are deleted at the next GC; the map is an LRU, so it never refuses a process.

use std::time::Instant;

use bufscope_common::{TotalKey, maps};
use foldhash::{HashMap, HashMapExt as _, HashSet};

use crate::bpf::Table;
use crate::bpf::table::Hash;
use crate::store::ProcRef;

/// One counter of a process's part (see [`crate::signals::Part::totals`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Total {
    /// Which counter ([`bufscope_common::total_family`]).
    pub family: u8,
    /// IP protocol (`IPPROTO_*`), 0 for none.
    pub proto: u8,
    /// Socket option (`SO_*`), 0 for none.
    pub option: u8,
    /// Its value.
    pub value: u64,
}

/// The pinned `TOTALS` map and what was last written to it.
pub struct Totals {
    map: Box<dyn Table<TotalKey, u64>>,
    /// Every entry as bufscope last wrote (or read) it.
    written: HashMap<TotalKey, u64>,
    /// When the last flush started: processes active since then are written at the next.
    last_flush: Option<Instant>,
    /// Writes that failed (logged once).
    warned: bool,
}

/// The key of counter `t` of process `p`.
pub fn key(p: ProcRef, t: &Total) -> TotalKey {
    TotalKey {
        start_ticks: p.start_ticks,
        tgid: p.tgid,
        family: t.family,
        proto: t.proto,
        option: t.option,
        _pad: 0,
    }
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
            last_flush: None,
            warned: false,
        }
    }

    /// Every entry of the map, by process (the maps were adopted from an earlier bufscope).
    pub fn read(&mut self) -> HashMap<ProcRef, Vec<Total>> {
        let mut out: HashMap<ProcRef, Vec<Total>> = HashMap::new();
        for (k, v) in self.map.entries() {
            self.written.insert(k, v);
            out.entry(ProcRef {
                tgid: k.tgid,
                start_ticks: k.start_ticks,
            })
            .or_default()
            .push(Total {
                family: k.family,
                proto: k.proto,
                option: k.option,
                value: v,
            });
        }
        out
    }

    /// When the last flush started (None: never).
    pub fn since(&self) -> Option<Instant> {
        self.last_flush
    }

    /// Writes the counters of `procs` (each process's current totals) that changed; `now`
    /// is when the caller took them.
    pub fn flush(&mut self, procs: impl IntoIterator<Item = (ProcRef, Vec<Total>)>, now: Instant) {
        self.last_flush = Some(now);
        for (p, totals) in procs {
            for t in totals {
                let k = key(p, &t);
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
                            "keeping event counters for a restart failed ({e:#}): they restart at 0 with the next bufscope"
                        );
                    }
                    Err(_) => {}
                }
            }
        }
    }

    /// Deletes the entries of processes `keep` refuses (they left the store).
    pub fn retain(&mut self, keep: impl Fn(&ProcRef) -> bool) {
        let gone: Vec<TotalKey> = self
            .written
            .keys()
            .filter(|k| {
                !keep(&ProcRef {
                    tgid: k.tgid,
                    start_ticks: k.start_ticks,
                })
            })
            .copied()
            .collect();
        for k in gone {
            self.map.remove(&k);
            self.written.remove(&k);
        }
    }

    /// Processes with entries.
    pub fn procs(&self) -> HashSet<ProcRef> {
        self.written
            .keys()
            .map(|k| ProcRef {
                tgid: k.tgid,
                start_ticks: k.start_ticks,
            })
            .collect()
    }
}
