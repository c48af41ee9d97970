//! Attribution follows the socket: the counts of a socket go to a **live** process
//! that holds it, not to whoever created it.
//!
//! For the sockets with new counts of a poll ([`Attributor::refresh_holders`]):
//! - a socket seen before keeps its holder while that process is alive (its `/proc/<pid>/stat`
//!   start time, read once per process and poll, however many of its sockets count) and its
//!   last full look is less than [`RESCAN_EVERY`] old (a holder that closed its copy but lives
//!   on is noticed at that look);
//! - otherwise one pass over `/proc/*/fd` for all such sockets, without the collector's lock
//!   ([`super::lookup`]: the socket's counts wait for it), lists every process holding
//!   each; the process that created it (its `OWNERS` record) is chosen while it is one of
//!   them, else the newest of them (latest start time, then highest pid): a helper that only
//!   inherited the fd (`socat … SYSTEM:`, hook scripts) is not blamed for its parent's
//!   socket, and after a fork whose parent exited the child, after a hand-off the receiver;
//!   how many live processes hold it is kept
//!   ([`Attributor::holder_count`]): the drops of a socket several hold go to the process that
//!   reads it where the reader hook can say (the drops room's `shared`), this holder otherwise;
//! - a socket nobody holds any more (closed: its last counts happened while someone held it)
//!   keeps its last holder, else the recorded owner (`OWNERS`).
//!
//! Nothing runs per packet: this costs a `stat` read per process with new counts per poll
//! (with 1,000 processes holding 10,000 dropping sockets, a `readlink` per socket and poll was
//! 30% of the exporter's CPU), which also gives its `comm` (an `exec` keeps pid and start
//! time but changes `comm`: the labels follow, [`Attributor::apply_renames`]; a separate
//! `comm` read per process was another third of this), and a `/proc` pass when a socket first
//! counts, when its holder let go of it, and every [`RESCAN_EVERY`] while it keeps counting
//! (meanwhile its counts stay on the holder it has).

use std::time::{Duration, Instant};

use foldhash::{HashMap, HashMapExt as _, HashSet};

use super::{Attributor, Cause};
use crate::store::{Parts, ProcRef, Store};

/// How often the holders of a socket that keeps counting are listed again (a fork after its
/// first count, a worker started later).
pub const RESCAN_EVERY: Duration = Duration::from_secs(10);
/// A socket that nobody held at the last look is looked for again at most this often.
const NO_HOLDER_RECHECK: Duration = Duration::from_millis(900);

/// The live holder a socket's counts go to.
#[derive(Clone, Copy, Debug)]
pub(super) struct Holding {
    /// The process.
    pub proc: ProcRef,
    /// When its holders were last listed from `/proc`.
    pub scanned: Instant,
    /// How many live processes held it then (more than one: a shared socket, whose drops
    /// go to the process that reads it where the reader hook can say which).
    pub holders: u32,
}

impl Attributor {
    /// Brings the holder of each of `inodes` (sockets with new counts) up to date: see the
    /// module documentation. [`Attributor::lookup_inode`] then returns it — or, for a socket
    /// whose holders are being listed (its first count, or its holder exited), nothing until
    /// the look-up pass answered: its counts wait for the process that holds it now.
    pub fn refresh_holders(&mut self, inodes: &HashSet<u64>) {
        if inodes.is_empty() {
            return;
        }
        let now = Instant::now();
        // Liveness once per process of this poll, not once per socket; the same read of
        // `/proc/<pid>/stat` gives its `comm` (checked once per live process below).
        let mut alive: HashMap<ProcRef, Option<Vec<u8>>> = HashMap::new();
        for ino in inodes {
            let held = self.holding.get(ino).copied().map(|h| {
                let live = alive
                    .entry(h.proc)
                    .or_insert_with(|| {
                        self.procfs
                            .start_ticks_and_comm(h.proc.tgid)
                            .filter(|(ticks, _)| *ticks == h.proc.start_ticks)
                            .map(|(_, comm)| comm)
                    })
                    .is_some();
                (h, live)
            });
            match held {
                Some((h, true)) => {
                    // Keeps counting on its holder while the re-listing runs.
                    if now.duration_since(h.scanned) >= RESCAN_EVERY {
                        self.request_relisting(*ino);
                    }
                }
                _ => {
                    let recently_empty = self
                        .no_holder
                        .get(ino)
                        .is_some_and(|t| now.duration_since(*t) < NO_HOLDER_RECHECK);
                    if !recently_empty {
                        self.unsettled.insert(*ino);
                        self.request_inode(Cause::Holders, *ino, true);
                    }
                }
            }
        }
        self.serve_inline();
        for (p, comm) in alive {
            if let Some(raw) = comm {
                self.set_comm(p, &raw);
            }
        }
    }

    /// Files the live holders a pass found for `ino` (`found` is every (pid, fd) holding it):
    /// its creator while it holds it, else the newest; a socket nobody holds keeps its last
    /// holder. Returns whether someone holds it.
    pub(super) fn choose_holder(
        &mut self,
        ino: u64,
        found: &[(u32, u32)],
        pass: &super::Found,
        now: Instant,
    ) -> bool {
        self.unsettled.remove(&ino);
        let creator = self.recorded_owner(ino);
        let mut best: Option<ProcRef> = None;
        let mut holders = 0;
        let mut creator_holds = false;
        for (pid, _fd) in found {
            let Some(p) = pass
                .procs
                .get(pid)
                .and_then(|info| self.proc_from_info(*pid, info))
            else {
                continue;
            };
            holders += 1;
            creator_holds |= creator == Some(p);
            if best.is_none_or(|b| (p.start_ticks, p.tgid) > (b.start_ticks, b.tgid)) {
                best = Some(p);
            }
        }
        // The process that created the socket, while it still holds it; the newest
        // holder only once the creator let go of it (fork and exit, a hand-off).
        if creator_holds {
            best = creator;
        }
        match best {
            Some(p) => {
                self.holding.insert(
                    ino,
                    Holding {
                        proc: p,
                        scanned: now,
                        holders,
                    },
                );
                self.inode_owner.insert(ino, p);
                self.negative.remove(&ino);
                self.no_holder.remove(&ino);
                true
            }
            None => {
                // Closed (or in flight in a unix socket): the last holder, if any,
                // stays; else the recorded owner (OWNERS) as before.
                self.no_holder.insert(ino, now);
                false
            }
        }
    }

    /// The process `OWNERS` recorded for socket `inode` (its creator, or the last process
    /// that configured or connected it), if the owners probe runs and has it.
    fn recorded_owner(&self, inode: u64) -> Option<ProcRef> {
        let o = self.owners.as_ref()?.get(&inode)?;
        Some(ProcRef {
            tgid: o.tgid,
            start_ticks: super::Procfs::ns_to_ticks(o.start_ns),
        })
    }

    /// How many live processes held socket `inode` at its last look (0: not looked at, or
    /// nobody held it).
    pub fn holder_count(&self, inode: u64) -> u32 {
        self.holding.get(&inode).map_or(0, |h| h.holders)
    }

    /// Whether `p` is still running (the same process: pid and start time).
    pub fn alive(&self, p: &ProcRef) -> bool {
        self.procfs.start_ticks(p.tgid) == Some(p.start_ticks)
    }

    /// Re-reads `comm` of a live holder: after an `exec` the same process (pid and start
    /// time) has a new name, and its counts from now on carry it.
    pub(super) fn check_comm(&mut self, p: ProcRef) {
        if let Some(raw) = self.procfs.comm(p.tgid) {
            self.set_comm(p, &raw);
        }
    }

    /// Files `raw` as `p`'s `comm` (read just now): a new one is a rename.
    fn set_comm(&mut self, p: ProcRef, raw: &[u8]) {
        let comm = String::from_utf8_lossy(raw);
        if let Some(m) = self.meta.get_mut(&p)
            && m.comm != comm
        {
            m.comm = comm.into_owned();
            self.renamed.push(p);
        }
    }

    /// Gives the processes whose `comm` changed (an `exec`) their new labels in `store`:
    /// counts from now on go to series with the new `comm`, the earlier ones stay on the old
    /// series ([`Store::relabel`]).
    pub fn apply_renames<P: Parts>(&mut self, store: &mut Store<P>) {
        for p in std::mem::take(&mut self.renamed) {
            let m = self.meta(&p);
            store.relabel(p, m);
        }
    }

    /// Forgets the holder of a socket that is gone.
    pub(super) fn forget_holding(&mut self, inode: u64) {
        self.holding.remove(&inode);
        self.no_holder.remove(&inode);
    }

    /// Drops the holders no longer referenced.
    pub(super) fn retain_holding(&mut self, keep: &impl Fn(&ProcRef) -> bool) {
        let lookups = &self.lookups;
        self.unsettled.retain(|ino| lookups.asked(*ino));
        self.holding.retain(|_, h| keep(&h.proc));
        let now = Instant::now();
        self.no_holder
            .retain(|_, t| now.duration_since(*t) < RESCAN_EVERY * 6);
    }
}

/// The holders map type (kept here with its logic).
pub(super) type Holdings = HashMap<u64, Holding>;

/// An empty holders map.
pub(super) fn holdings() -> Holdings {
    HashMap::new()
}
