//! Socket → process → container.
//!
//! The probes record, in process context, which process created, accepted, connected,
//! listened on or configured each socket (`OWNERS`, keyed by socket inode). Drops happen in
//! softirq and are keyed by inode, so attributing one is a join on the inode:
//! 1. this cache (inode → process, filled by earlier lookups),
//! 2. the BPF `OWNERS` map,
//! 3. one pass over `/proc/*/fd` for all inodes still unknown (sockets created before bufscope
//!    started, or through paths without a hook such as io_uring).
//!
//! Sockets without an inode (TCP children not accepted yet, orphans) are attributed to the
//! owner of the listener on their local port; drops on a full TUN ring to the process that
//! holds the TUN device.

pub mod container;
pub mod procfs;

use foldhash::{HashMap, HashMapExt as _, HashSet, HashSetExt as _};
use std::time::{Duration, Instant};

use aya::maps::{HashMap as BpfHashMap, MapData};
use bufscope_common::Owner;

pub use procfs::Procfs;

use crate::store::{ProcMeta, ProcRef};

/// How long a negative `/proc` result (inode not found) is trusted before scanning again.
const NEGATIVE_TTL: Duration = Duration::from_secs(5);
/// How long TUN and listener lookups are cached.
const CACHE_TTL: Duration = Duration::from_secs(10);

/// (netns, TUN interface name) → pid holding the device.
type TunHolders = HashMap<(u32, String), u32>;

/// The attribution service shared by every signal.
pub struct Attributor {
    procfs: Procfs,
    owners: Option<BpfHashMap<MapData, u64, Owner>>,
    inode_owner: HashMap<u64, ProcRef>,
    meta: HashMap<ProcRef, ProcMeta>,
    negative: HashMap<u64, Instant>,
    listeners: HashMap<(u32, u16), (Option<ProcRef>, Instant)>,
    tun: Option<(TunHolders, Instant)>,
    netns_pid: HashMap<u32, u32>,
    /// `/proc` scans done (self-metric).
    pub scans: u64,
}

impl Attributor {
    /// A service reading `procfs` and, when the `owners` probe runs, the BPF `OWNERS` map.
    pub fn new(procfs: Procfs, owners: Option<BpfHashMap<MapData, u64, Owner>>) -> Self {
        Self {
            procfs,
            owners,
            inode_owner: HashMap::new(),
            meta: HashMap::new(),
            negative: HashMap::new(),
            listeners: HashMap::new(),
            tun: None,
            netns_pid: HashMap::new(),
            scans: 0,
        }
    }

    /// The `/proc` reader.
    pub fn procfs(&self) -> &Procfs {
        &self.procfs
    }

    /// Registers a process recorded by a probe (process context: exact) and returns its id.
    pub fn owner(&mut self, o: &Owner) -> ProcRef {
        let r = ProcRef {
            tgid: o.tgid,
            start_ticks: Procfs::ns_to_ticks(o.start_ns),
        };
        if !self.meta.contains_key(&r) {
            let m = self.read_meta(o.tgid, &o.comm);
            self.meta.insert(r, m);
        }
        r
    }

    /// Registers a live process found in `/proc`.
    pub fn proc_from_pid(&mut self, pid: u32) -> Option<ProcRef> {
        let r = ProcRef {
            tgid: pid,
            start_ticks: self.procfs.start_ticks(pid)?,
        };
        if !self.meta.contains_key(&r) {
            let m = self.read_meta(pid, &[]);
            self.meta.insert(r, m);
        }
        Some(r)
    }

    fn read_meta(&self, tgid: u32, fallback_comm: &[u8]) -> ProcMeta {
        let comm = self.procfs.comm(tgid).unwrap_or_else(|| {
            let end = fallback_comm
                .iter()
                .position(|b| *b == 0)
                .unwrap_or(fallback_comm.len());
            fallback_comm[..end].to_vec()
        });
        let container = self
            .procfs
            .cgroup(tgid)
            .and_then(|c| container::container_id(&c))
            .unwrap_or_default();
        ProcMeta {
            comm: String::from_utf8_lossy(&comm).into_owned(),
            container,
        }
    }

    /// Labels of a registered process.
    pub fn meta(&self, p: &ProcRef) -> ProcMeta {
        self.meta.get(p).cloned().unwrap_or_default()
    }

    /// The owner of socket `inode` from the cache or the BPF map (no `/proc` scan).
    pub fn lookup_inode(&mut self, inode: u64) -> Option<ProcRef> {
        if let Some(p) = self.inode_owner.get(&inode) {
            return Some(*p);
        }
        let owner = self.owners.as_ref()?.get(&inode, 0).ok()?;
        let p = self.owner(&owner);
        self.inode_owner.insert(inode, p);
        Some(p)
    }

    /// Resolves the owner of each of `inodes` with at most one pass over `/proc`.
    pub fn resolve_inodes(&mut self, inodes: &HashSet<u64>) {
        let now = Instant::now();
        let mut wanted = HashSet::new();
        for ino in inodes {
            if self.lookup_inode(*ino).is_some() {
                continue;
            }
            let recently_missed = self
                .negative
                .get(ino)
                .is_some_and(|t| now.duration_since(*t) <= NEGATIVE_TTL);
            if !recently_missed {
                wanted.insert(*ino);
            }
        }
        if wanted.is_empty() {
            return;
        }
        self.scans += 1;
        let found = self.procfs.find_socket_holders(&wanted);
        for ino in &wanted {
            match found.get(ino).and_then(|pid| self.proc_from_pid(*pid)) {
                Some(p) => {
                    self.inode_owner.insert(*ino, p);
                    self.negative.remove(ino);
                }
                None => {
                    self.negative.insert(*ino, now);
                }
            }
        }
    }

    /// A process in network namespace `netns` (to read that namespace's `/proc/<pid>/net`).
    fn pid_in_netns(&mut self, netns: u32) -> Option<u32> {
        if let Some(pid) = self.netns_pid.get(&netns)
            && self.procfs.netns(*pid) == Some(netns)
        {
            return Some(*pid);
        }
        let pid = self
            .procfs
            .pids()
            .into_iter()
            .find(|p| self.procfs.netns(*p) == Some(netns))?;
        self.netns_pid.insert(netns, pid);
        Some(pid)
    }

    /// Owner of the TCP listener on (`netns`, `port`).
    pub fn listener(&mut self, netns: u32, port: u16) -> Option<ProcRef> {
        let now = Instant::now();
        if let Some((p, t)) = self.listeners.get(&(netns, port))
            && now.duration_since(*t) < CACHE_TTL
        {
            return *p;
        }
        let found = self.pid_in_netns(netns).and_then(|pid| {
            let ino = self.procfs.tcp_listener_inode(pid, port)?;
            self.resolve_inodes(&HashSet::from_iter([ino]));
            self.lookup_inode(ino)
        });
        self.listeners.insert((netns, port), (found, now));
        found
    }

    /// The process holding TUN/TAP device `ifname` in `netns`.
    pub fn tun(&mut self, netns: u32, ifname: &str) -> Option<ProcRef> {
        let now = Instant::now();
        let stale = self
            .tun
            .as_ref()
            .is_none_or(|(_, t)| now.duration_since(*t) > CACHE_TTL);
        let key = (netns, ifname.to_string());
        let missing = self
            .tun
            .as_ref()
            .is_some_and(|(m, _)| !m.contains_key(&key));
        if stale || missing {
            self.scans += 1;
            self.tun = Some((self.procfs.tun_holders(), now));
        }
        let pid = *self.tun.as_ref()?.0.get(&key)?;
        self.proc_from_pid(pid)
    }

    /// Forgets an inode (its socket is gone).
    pub fn forget_inode(&mut self, inode: u64) {
        self.inode_owner.remove(&inode);
        self.negative.remove(&inode);
    }

    /// Drops cached labels of processes no longer referenced by `keep`.
    pub fn retain_procs(&mut self, keep: impl Fn(&ProcRef) -> bool) {
        self.meta.retain(|p, _| keep(p));
        self.inode_owner.retain(|_, p| keep(p));
        let now = Instant::now();
        self.negative
            .retain(|_, t| now.duration_since(*t) < NEGATIVE_TTL * 12);
        self.listeners
            .retain(|_, (_, t)| now.duration_since(*t) < CACHE_TTL);
    }
}
