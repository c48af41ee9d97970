//! Socket → process → container (and its pod: [`kubernetes`]).
//!
//! The probes record, in process context, which process created, accepted, connected,
//! listened on or configured each socket (`OWNERS`, keyed by socket inode). Drops happen in
//! softirq and are keyed by inode, so attributing one is a join on the inode:
//! 1. this cache (inode → process, filled by earlier lookups),
//! 2. the BPF `OWNERS` map,
//! 3. one pass over `/proc/*/fd` for all inodes still unknown (sockets created before bufscope
//!    started, or through paths without a hook such as io_uring, or whose entry the LRU
//!    evicted), run **without the collector's lock**, batched and rate-limited per cause
//!    ([`lookup`]): the caller holds its counts until the answer is filed
//!    ([`Attributor::pending`]).
//!
//! Sockets without an inode (TCP children not accepted yet, orphans) are attributed to the
//! owner of the listener on their local port; drops on a full TUN ring to the process that
//! holds the TUN device.
//!
//! A socket with counts goes to a **live** process that holds it (when several do and the
//! drops room cannot say which of them reads it: its creator while it holds it, else the
//! newest holder), not to its creator once that one let go of it (fork and exit, fd passing):
//! [`Attributor::refresh_holders`], in `holders`.
//!
//! The same records say, before anything drops, which processes hold UDP sockets
//! ([`Attributor::new_udp_holders`]): `OWNERS` gets each socket at creation and `UDP_SOCKETS`
//! each UDP one (the kernel's family, type and protocol, seen by the socket-creation hook), and
//! one pass over `/proc` at the first call finds those created before bufscope started. A
//! socket's protocol is never learned through its `/proc/<pid>/fd` link (which leads into
//! whatever that fd holds at that instant: another tenant's FUSE file can block the caller).

pub mod container;
mod holders;
pub mod kubernetes;
pub mod lookup;
pub mod procfs;

use foldhash::{HashMap, HashMapExt as _, HashSet, HashSetExt as _};
use std::time::{Duration, Instant};

use bufscope_common::Owner;

use crate::bpf::Table;

pub use holders::RESCAN_EVERY;
pub use lookup::{Cause, Found, Lookup};
pub use procfs::Procfs;

use crate::store::{ProcMeta, ProcRef};

/// How long a negative `/proc` result (inode not found) is trusted before scanning again.
const NEGATIVE_TTL: Duration = Duration::from_secs(5);
/// How long TUN and listener look-ups are cached.
const CACHE_TTL: Duration = Duration::from_secs(10);
/// [`Attributor::new_udp_holders`] reads `OWNERS` at most this often (the periodic poll
/// runs it; the extra polls of scrapes in between skip it).
const UDP_SCAN_EVERY: Duration = Duration::from_millis(900);
/// Without `UDP_SOCKETS` (the owners probe is off), a process whose new sockets were looked
/// for in its namespace's `/proc/<pid>/net/udp*` is looked at again no sooner than this: a
/// process that opens TCP connections all the time costs one read per this period, not per
/// poll.
const UDP_RECHECK: Duration = Duration::from_secs(10);
/// New sockets still waiting for their process's next look are forgotten after this.
const UDP_PENDING_TTL: Duration = Duration::from_secs(30);
/// More new UDP sockets than this since the last look: their owners come from one batch read
/// of `OWNERS` instead of one lookup each.
const UDP_OWNERS_BATCH: usize = 512;

/// A `comm` as the probes record it: up to the first NUL.
fn comm_bytes(raw: &[u8]) -> &[u8] {
    let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
    &raw[..end]
}

/// (netns, TUN interface name) → pid holding the device.
type TunHolders = HashMap<(u32, String), u32>;

/// The attribution service shared by every signal.
pub struct Attributor {
    procfs: Procfs,
    owners: Option<OwnersMap>,
    /// `UDP_SOCKETS`: the inodes of UDP sockets, recorded at creation by the owners probe.
    udp_sockets: Option<UdpSocketsMap>,
    inode_owner: HashMap<u64, ProcRef>,
    meta: HashMap<ProcRef, ProcMeta>,
    negative: HashMap<u64, Instant>,
    listeners: HashMap<(u32, u16), (Option<ProcRef>, Instant)>,
    tun: Option<(TunHolders, Instant)>,
    netns_pid: HashMap<u32, u32>,
    /// `/proc` scans done (self-metric).
    pub scans: u64,
    /// What [`Attributor::new_udp_holders`] keeps between calls.
    udp: UdpWatch,
    /// The live holder of each socket with counts ([`Attributor::refresh_holders`]).
    holding: holders::Holdings,
    /// Sockets nobody held at the last look, and when.
    no_holder: HashMap<u64, Instant>,
    /// Processes whose `comm` changed (an `exec`) since [`Attributor::apply_renames`].
    renamed: Vec<ProcRef>,
    /// The last name in a probe's record that differed from a process's labels and made
    /// bufscope read its `comm` again (a thread's name differs without an exec).
    comm_checked: HashMap<ProcRef, [u8; 16]>,
    /// Pod, namespace and container name of a container (the kubelet's log layout).
    pods: kubernetes::Pods,
    /// Owner look-ups waiting for a pass over `/proc` without the lock ([`lookup`]).
    lookups: lookup::Lookups,
    /// When a pass last answered for each TUN device asked about (found or not).
    tun_answered: HashMap<(u32, String), Instant>,
    /// Sockets whose holder is being looked for (first count, or their holder exited): no
    /// owner until the look-up answers, so their counts wait instead of going to the
    /// recorded creator.
    unsettled: HashSet<u64>,
    /// The pids in `/proc` as listed during this poll ([`Attributor::pids_this_poll`]).
    pids_listed: Option<Vec<u32>>,
}

/// `OWNERS`: socket inode → the process that created or accepted it (the owners room's map).
pub type OwnersMap = Box<dyn Table<u64, Owner>>;

/// `UDP_SOCKETS`: socket inode → its transport, for UDP sockets at creation (the owners
/// room's map).
pub type UdpSocketsMap = Box<dyn Table<u64, u8>>;

/// State of [`Attributor::new_udp_holders`].
#[derive(Default)]
struct UdpWatch {
    /// `OWNERS` keys at the last read (without `UDP_SOCKETS`: that map's entries are deleted
    /// once read instead).
    seen: HashSet<u64>,
    /// New sockets whose protocol was not looked at yet: owner, first seen.
    pending: HashMap<u64, (Owner, Instant)>,
    /// When each process's fds were last looked at.
    checked: HashMap<ProcRef, Instant>,
    /// Processes already reported.
    reported: HashSet<ProcRef>,
    /// The `/proc` pass for sockets older than bufscope is done.
    boot_done: bool,
    last: Option<Instant>,
    /// A new UDP socket's owner was no longer in `OWNERS` (evicted by a burst of other
    /// sockets before it was read): when the `/proc` pass that finds it last ran.
    missed: Option<Instant>,
    /// Such a miss waits for the next `/proc` pass.
    missed_pending: bool,
}

impl Attributor {
    /// A service reading `procfs` and, when the `owners` probe runs, the BPF `OWNERS` map.
    pub fn new(procfs: Procfs, owners: Option<OwnersMap>) -> Self {
        Self {
            procfs,
            owners,
            udp_sockets: None,
            inode_owner: HashMap::new(),
            meta: HashMap::new(),
            negative: HashMap::new(),
            listeners: HashMap::new(),
            tun: None,
            netns_pid: HashMap::new(),
            scans: 0,
            udp: UdpWatch::default(),
            holding: holders::holdings(),
            no_holder: HashMap::new(),
            renamed: Vec::new(),
            comm_checked: HashMap::new(),
            pods: kubernetes::Pods::new(None),
            lookups: lookup::Lookups::default(),
            tun_answered: HashMap::new(),
            unsettled: HashSet::new(),
            pids_listed: None,
        }
    }

    /// Labels processes in Kubernetes pods from the kubelet's layout under `log_dir`, for
    /// cgroups of the kubelet's own hierarchy (checked under the host's cgroup2 mount).
    pub fn with_pods(mut self, log_dir: Option<std::path::PathBuf>) -> Self {
        self.pods = kubernetes::Pods::new(log_dir).with_cgroup_root(crate::kernel::cgroup2_root());
        self
    }

    /// Processes whose kubelet-like cgroup was refused pod labels, by reason.
    pub fn pod_labels_refused(&self) -> Vec<(&'static str, u64)> {
        self.pods.refused()
    }

    /// Learns which new sockets are UDP from `UDP_SOCKETS` (filled by the owners probe's
    /// socket-creation hook) instead of the namespaces' `/proc/<pid>/net/udp*`.
    pub fn with_udp_sockets(mut self, map: Option<UdpSocketsMap>) -> Self {
        self.udp_sockets = map;
        self
    }

    /// The `/proc` reader.
    pub fn procfs(&self) -> &Procfs {
        &self.procfs
    }

    /// A poll starts: the next [`Attributor::pids_this_poll`] lists `/proc` again.
    pub fn new_poll(&mut self) {
        self.pids_listed = None;
    }

    /// The pids in `/proc`, listed once per poll ([`Attributor::new_poll`]) for every room
    /// that needs them (with 3,000 processes a listing costs about a millisecond).
    pub fn pids_this_poll(&mut self) -> &[u32] {
        self.pids_listed.get_or_insert_with(|| self.procfs.pids())
    }

    /// Registers a process recorded by a probe (process context: exact) and returns its id.
    pub fn owner(&mut self, o: &Owner) -> ProcRef {
        let r = ProcRef {
            tgid: o.tgid,
            start_ticks: Procfs::ns_to_ticks(o.start_ns),
        };
        match self.meta.get(&r) {
            None => {
                let m = self.read_meta(o.tgid, &o.comm);
                self.meta.insert(r, m);
            }
            // The record names the process by another name than its labels: it exec'd
            // since (a helper after fork+exec); its counts from now on carry the new one.
            // (A thread's own name differs for good: looked at once per name it shows.)
            Some(m)
                if m.comm != String::from_utf8_lossy(comm_bytes(&o.comm))
                    && self.comm_checked.insert(r, o.comm) != Some(o.comm) =>
            {
                self.check_comm(r);
            }
            Some(_) => {}
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

    /// Registers a live process a look-up pass found (its start time and, if it was not
    /// known, its labels read by the pass).
    fn proc_from_info(&mut self, pid: u32, info: &lookup::ProcInfo) -> Option<ProcRef> {
        let r = ProcRef {
            tgid: pid,
            start_ticks: info.start_ticks,
        };
        if !self.meta.contains_key(&r) {
            let m = match (&info.comm, &info.cgroup) {
                (Some(comm), Some(cgroup)) => self.meta_of(comm, cgroup),
                _ => self.read_meta(pid, &[]),
            };
            self.meta.insert(r, m);
        }
        Some(r)
    }

    fn read_meta(&self, tgid: u32, fallback_comm: &[u8]) -> ProcMeta {
        let comm = self
            .procfs
            .comm(tgid)
            .unwrap_or_else(|| comm_bytes(fallback_comm).to_vec());
        let cgroup = self.procfs.cgroup(tgid).unwrap_or_default();
        self.meta_of(&comm, &cgroup)
    }

    /// A process's labels from its `comm` and `/proc/<pid>/cgroup` (pod labels only for a
    /// cgroup of the kubelet's own hierarchy).
    fn meta_of(&self, comm: &[u8], cgroup: &str) -> ProcMeta {
        let place = self.pods.place(cgroup);
        ProcMeta {
            comm: String::from_utf8_lossy(comm).into_owned(),
            container: place.container,
            pod: place.pod.pod,
            namespace: place.pod.namespace,
            container_name: place.pod.container_name,
            cgroup: place.cgroup,
        }
    }

    /// Labels of a registered process.
    pub fn meta(&self, p: &ProcRef) -> ProcMeta {
        self.meta.get(p).cloned().unwrap_or_default()
    }

    /// The owner of socket `inode` from the cache or the BPF map (no `/proc` scan); none
    /// while its holder is being looked for.
    pub fn lookup_inode(&mut self, inode: u64) -> Option<ProcRef> {
        if self.unsettled.contains(&inode) {
            return None;
        }
        if let Some(p) = self.inode_owner.get(&inode) {
            return Some(*p);
        }
        let owner = self.owners.as_ref()?.get(&inode)?;
        let p = self.owner(&owner);
        self.inode_owner.insert(inode, p);
        Some(p)
    }

    /// Looks for the owner of each of `inodes` that neither the cache nor `OWNERS` knows:
    /// queued for the next pass over `/proc` (without the lock, one pass for every request:
    /// [`lookup`]); [`Attributor::pending`] is true until it answered. An inode looked for in
    /// vain in the last [`NEGATIVE_TTL`] is not asked again.
    pub fn resolve_inodes(&mut self, cause: Cause, inodes: &HashSet<u64>) {
        let now = Instant::now();
        for ino in inodes {
            if self.lookup_inode(*ino).is_some() || self.pending(*ino) {
                continue;
            }
            let recently_missed = self
                .negative
                .get(ino)
                .is_some_and(|t| now.duration_since(*t) <= NEGATIVE_TTL);
            if !recently_missed {
                self.request_inode(cause, *ino, false);
            }
        }
        self.serve_inline();
    }

    /// Owner of the TCP listener on (`netns`, `port`): from the last look-up (cached for
    /// [`CACHE_TTL`]); after that, while that owner lives, still it, and the background pass
    /// re-reads the listener (a request waiting for a pass over every `/proc/*/fd` for the
    /// same answer made every scrape's connection cost one every 10 s); else none for now
    /// and a look-up queued ([`Attributor::listener_pending`]).
    pub fn listener(&mut self, netns: u32, port: u16) -> Option<ProcRef> {
        let now = Instant::now();
        if let Some((p, t)) = self.listeners.get(&(netns, port)).copied() {
            if now.duration_since(t) < CACHE_TTL {
                return p;
            }
            if let Some(p) = p
                && self.procfs.start_ticks(p.tgid) == Some(p.start_ticks)
            {
                self.request_listener_as(netns, port, false);
                self.serve_inline();
                return Some(p);
            }
        }
        self.request_listener(netns, port);
        self.serve_inline();
        match self.listeners.get(&(netns, port)) {
            Some((p, t)) if now.duration_since(*t) < CACHE_TTL => *p,
            _ => None,
        }
    }

    /// The process holding TUN/TAP device `ifname` in `netns`: from the last look-up
    /// (trusted for [`CACHE_TTL`]), else none for now and a look-up queued.
    pub fn tun(&mut self, netns: u32, ifname: &str) -> Option<ProcRef> {
        let now = Instant::now();
        let key = (netns, ifname.to_string());
        let fresh = self
            .tun
            .as_ref()
            .is_some_and(|(m, t)| now.duration_since(*t) <= CACHE_TTL && m.contains_key(&key));
        let answered = self
            .tun_answered
            .get(&key)
            .is_some_and(|t| now.duration_since(*t) <= CACHE_TTL);
        if !fresh && !answered {
            self.request_tun(netns, ifname);
            self.serve_inline();
        }
        let pid = *self.tun.as_ref()?.0.get(&key)?;
        self.proc_from_pid(pid)
    }

    /// Processes newly known to hold a UDP socket (each reported once), so that their drop
    /// series can exist at 0 before their first drop. Sources: the sockets `UDP_SOCKETS`
    /// gained since the last call (the kernel's family, type and protocol at creation) with
    /// their owners from `OWNERS`; without the owners probe (no `UDP_SOCKETS`), the sockets
    /// `OWNERS` gained, UDP when their namespace's `/proc/<pid>/net/udp*` lists them, a
    /// process looked at again no sooner than [`UDP_RECHECK`]; at the first call also every
    /// process `/proc` shows holding a UDP socket (sockets older than bufscope). Runs at most
    /// every [`UDP_SCAN_EVERY`]; with `UDP_SOCKETS` it costs a read of that map and a lookup
    /// per new UDP socket, however many other sockets come and go.
    pub fn new_udp_holders(&mut self) -> Vec<ProcRef> {
        let now = Instant::now();
        if self
            .udp
            .last
            .is_some_and(|t| now.duration_since(t) < UDP_SCAN_EVERY)
        {
            return Vec::new();
        }
        self.udp.last = Some(now);
        let mut out = Vec::new();
        if !self.udp.boot_done {
            self.udp.boot_done = true;
            self.scans += 1;
            out = self.udp_holders_in_proc();
        }
        if self.udp_sockets.is_some() {
            let found = self.new_udp_sockets_holders();
            out.extend(found);
            // An owner `OWNERS` lost before it was read (a socket()/close() loop elsewhere
            // can cycle the LRU in milliseconds) is found by a `/proc` pass instead, at most
            // every UDP_RECHECK.
            if self.udp.missed_pending
                && self
                    .udp
                    .missed
                    .is_none_or(|t| now.duration_since(t) >= UDP_RECHECK)
            {
                self.udp.missed_pending = false;
                self.udp.missed = Some(now);
                self.scans += 1;
                out.extend(self.udp_holders_in_proc());
            }
            return self.report(out);
        }
        let entries = self.read_owners();
        let mut seen = HashSet::with_capacity(entries.len());
        for (ino, o) in entries {
            seen.insert(ino);
            if !self.udp.seen.contains(&ino) {
                self.udp.pending.entry(ino).or_insert((o, now));
            }
        }
        self.udp.seen = seen;
        if self.udp.pending.is_empty() {
            return self.report(out);
        }
        // The new sockets by process.
        let mut by_proc: HashMap<ProcRef, (Owner, Vec<(u64, Instant)>)> = HashMap::new();
        for (ino, (o, since)) in self.udp.pending.drain() {
            let r = ProcRef {
                tgid: o.tgid,
                start_ticks: Procfs::ns_to_ticks(o.start_ns),
            };
            if self.udp.reported.contains(&r) || !self.udp.seen.contains(&ino) {
                continue;
            }
            by_proc
                .entry(r)
                .or_insert((o, Vec::new()))
                .1
                .push((ino, since));
        }
        self.udp
            .checked
            .retain(|_, t| now.duration_since(*t) < UDP_RECHECK);
        let mut udp_of_netns: HashMap<u32, Option<HashSet<u64>>> = HashMap::new();
        for (r, (o, socks)) in by_proc {
            if self.udp.checked.contains_key(&r) {
                // Looked at recently: wait for the next look (bounded by UDP_PENDING_TTL).
                for (ino, since) in socks {
                    if now.duration_since(since) < UDP_PENDING_TTL {
                        self.udp.pending.insert(ino, (o, since));
                    }
                }
                continue;
            }
            // The owner is gone (or its pid reused): nothing to put a series on.
            if self.procfs.start_ticks(o.tgid) != Some(r.start_ticks) {
                continue;
            }
            let udp = match &self.udp_sockets {
                Some(map) => socks
                    .iter()
                    .map(|(ino, _)| *ino)
                    .find(|ino| map.get(ino).is_some()),
                None => {
                    // Listed once bound or connected: a socket not listed yet is looked for
                    // again at the process's next look.
                    self.udp.checked.insert(r, now);
                    let procfs = &self.procfs;
                    let found = procfs.netns(o.tgid).and_then(|ns| {
                        udp_of_netns
                            .entry(ns)
                            .or_insert_with(|| procfs.udp_inodes(o.tgid))
                            .as_ref()
                            .and_then(|set| {
                                socks.iter().map(|(ino, _)| *ino).find(|i| set.contains(i))
                            })
                    });
                    if found.is_none() {
                        for (ino, since) in socks {
                            if now.duration_since(since) < UDP_PENDING_TTL {
                                self.udp.pending.insert(ino, (o, since));
                            }
                        }
                    }
                    found
                }
            };
            if let Some(ino) = udp {
                let p = self.owner(&o);
                self.inode_owner.insert(ino, p);
                out.push(p);
            }
        }
        self.report(out)
    }

    /// The processes of the UDP sockets `UDP_SOCKETS` gained since the last call (the
    /// socket-creation hook records each UDP socket there, nothing else, and this deletes
    /// what it read): one batch read of that map, one delete and one `OWNERS` lookup per new
    /// UDP socket (a batch read of `OWNERS` when there
    /// are more new UDP sockets than [`UDP_OWNERS_BATCH`]), one `/proc` read per new process.
    /// A `socket()`/`close()` loop of TCP sockets costs nothing here; one of UDP sockets costs
    /// at most one read of each map per call.
    fn new_udp_sockets_holders(&mut self) -> Vec<ProcRef> {
        let Some(map) = self.udp_sockets.as_mut() else {
            return Vec::new();
        };
        // Each entry is read once and deleted: the map holds only the UDP sockets created
        // since the last call, so an idle node with 10,000 UDP sockets reads an empty map
        // (a read of every entry cost a batch read per second, 15% of an idle bufscope's
        // time in the exporter bench).
        let fresh: Vec<u64> = map.entries().into_iter().map(|(ino, _)| ino).collect();
        for ino in &fresh {
            map.remove(ino);
        }
        if fresh.is_empty() {
            return Vec::new();
        }
        let wanted = fresh.len();
        let owners: Vec<(u64, Owner)> = if fresh.len() > UDP_OWNERS_BATCH {
            let fresh: HashSet<u64> = fresh.into_iter().collect();
            self.read_owners()
                .into_iter()
                .filter(|(ino, _)| fresh.contains(ino))
                .collect()
        } else {
            let Some(owners) = self.owners.as_ref() else {
                return Vec::new();
            };
            fresh
                .iter()
                .filter_map(|ino| Some((*ino, owners.get(ino)?)))
                .collect()
        };
        if owners.len() < wanted {
            self.udp.missed_pending = true;
        }
        let mut by_proc: HashMap<ProcRef, (Owner, u64)> = HashMap::new();
        for (ino, o) in owners {
            let r = ProcRef {
                tgid: o.tgid,
                start_ticks: Procfs::ns_to_ticks(o.start_ns),
            };
            if !self.udp.reported.contains(&r) {
                by_proc.entry(r).or_insert((o, ino));
            }
        }
        let mut out = Vec::new();
        for (r, (o, ino)) in by_proc {
            // The owner is gone (or its pid reused): nothing to put a series on.
            if self.procfs.start_ticks(o.tgid) != Some(r.start_ticks) {
                continue;
            }
            let p = self.owner(&o);
            self.inode_owner.insert(ino, p);
            out.push(p);
        }
        out
    }

    /// Keeps the processes of `found` not reported before, and remembers them.
    fn report(&mut self, found: Vec<ProcRef>) -> Vec<ProcRef> {
        let mut out = Vec::new();
        for p in found {
            if self.udp.reported.insert(p) {
                out.push(p);
            }
        }
        out
    }

    /// Every `OWNERS` entry.
    fn read_owners(&mut self) -> Vec<(u64, Owner)> {
        self.owners
            .as_mut()
            .map(|m| m.entries())
            .unwrap_or_default()
    }

    /// Processes `/proc` shows holding a UDP socket (one pass over `/proc/*/fd`, one read of
    /// `net/udp*` per network namespace).
    fn udp_holders_in_proc(&mut self) -> Vec<ProcRef> {
        let holders = self.procfs.all_socket_holders();
        let mut udp_of_netns: HashMap<u32, Option<HashSet<u64>>> = HashMap::new();
        let mut netns_of: HashMap<u32, Option<u32>> = HashMap::new();
        let mut pids: HashSet<u32> = HashSet::new();
        for (ino, pid) in holders {
            if pids.contains(&pid) {
                continue;
            }
            let procfs = &self.procfs;
            let Some(netns) = *netns_of.entry(pid).or_insert_with(|| procfs.netns(pid)) else {
                continue;
            };
            let udp = udp_of_netns
                .entry(netns)
                .or_insert_with(|| procfs.udp_inodes(pid));
            if udp.as_ref().is_some_and(|s| s.contains(&ino)) {
                pids.insert(pid);
            }
        }
        let mut pids: Vec<u32> = pids.into_iter().collect();
        pids.sort_unstable();
        pids.into_iter()
            .filter_map(|pid| self.proc_from_pid(pid))
            .collect()
    }

    /// Forgets an inode (its socket is gone).
    pub fn forget_inode(&mut self, inode: u64) {
        self.inode_owner.remove(&inode);
        self.negative.remove(&inode);
        self.unsettled.remove(&inode);
        self.forget_holding(inode);
    }

    /// Drops cached labels of processes no longer referenced by `keep`.
    pub fn retain_procs(&mut self, keep: impl Fn(&ProcRef) -> bool) {
        self.meta.retain(|p, _| keep(p));
        self.comm_checked.retain(|p, _| keep(p));
        // A process reported without room for its series is looked at again next time.
        self.udp.reported.retain(|p| keep(p));
        self.inode_owner.retain(|_, p| keep(p));
        self.retain_holding(&keep);
        let now = Instant::now();
        self.negative
            .retain(|_, t| now.duration_since(*t) < NEGATIVE_TTL * 12);
        // An expired listener whose owner is kept stays the answer while it lives
        // ([`Attributor::listener`]).
        self.listeners
            .retain(|_, (p, t)| now.duration_since(*t) < CACHE_TTL || p.is_some_and(|p| keep(&p)));
        self.tun_answered
            .retain(|_, t| now.duration_since(*t) <= CACHE_TTL);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::bpf::fake::FakeTable;
    use crate::signals::testkit::me;

    /// The owner record of a live process `pid`, as the probes write it.
    fn owner_of(pid: u32) -> Owner {
        let ticks = Procfs::new("/proc").start_ticks(pid).unwrap();
        Owner {
            tgid: pid,
            pid,
            start_ns: ticks * (1_000_000_000 / procfs::clk_tck()),
            ..me()
        }
    }

    /// A `socket()`/`close()` loop fills `OWNERS` with sockets that are not UDP: finding the
    /// new UDP holders reads `UDP_SOCKETS` and looks up only the new UDP socket's owner, never
    /// the whole `OWNERS`; a second look finds nothing new and looks up nothing.
    /// A new UDP socket whose owner `OWNERS` lost before it was read (a socket()/close() loop
    /// elsewhere cycles the LRU in milliseconds): its holder is found by a `/proc` pass, not
    /// lost for good; a second miss within UDP_RECHECK waits.
    #[test]
    fn a_udp_socket_whose_owner_was_evicted_is_found_in_proc() {
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let ino = {
            use std::os::fd::AsRawFd as _;
            let link = std::fs::read_link(format!("/proc/self/fd/{}", sock.as_raw_fd())).unwrap();
            let l = link.to_str().unwrap().to_string();
            l.trim_start_matches("socket:[")
                .trim_end_matches(']')
                .parse::<u64>()
                .unwrap()
        };
        let owners = FakeTable::new(64);
        let udp = FakeTable::new(64);
        udp.set(ino, bufscope_common::IPPROTO_UDP);
        let mut attr = Attributor::new(Procfs::new("/proc"), Some(owners.boxed()))
            .with_udp_sockets(Some(udp.boxed()));
        attr.udp.boot_done = true;
        let me = std::process::id();
        let found = attr.new_udp_holders();
        assert!(found.iter().any(|p| p.tgid == me), "{found:?}");
        assert_eq!(attr.scans, 1, "one /proc pass");
        udp.set(ino + 1, bufscope_common::IPPROTO_UDP);
        attr.udp.last = None;
        attr.new_udp_holders();
        assert_eq!(attr.scans, 1, "the next miss waits for UDP_RECHECK");
    }

    /// A listener whose cached owner is older than CACHE_TTL but alive is answered at once
    /// (nothing waits, so a request runs no pass for it) and re-read by the background;
    /// one whose owner exited waits for a look-up.
    #[test]
    fn an_expired_listener_with_a_live_owner_is_answered_and_refreshed_in_the_background() {
        let mut attr = Attributor::new(Procfs::new("/proc"), None);
        let me = attr.proc_from_pid(std::process::id()).unwrap();
        let old = Instant::now() - CACHE_TTL - Duration::from_secs(1);
        attr.listeners.insert((7, 80), (Some(me), old));
        assert_eq!(attr.listener(7, 80), Some(me));
        assert!(attr.listener_pending(7, 80), "re-read by a pass");
        assert!(!attr.lookups_urgent(), "which no request waits for");
        // A request that needs one now makes it urgent.
        attr.request_listener(7, 80);
        assert!(attr.lookups_urgent());
        // An owner that exited is no answer: the connection waits for the look-up.
        let gone = ProcRef {
            start_ticks: me.start_ticks + 1,
            ..me
        };
        attr.listeners.insert((7, 81), (Some(gone), old));
        assert_eq!(attr.listener(7, 81), None);
        assert!(attr.listener_pending(7, 81));
        // GC keeps an expired listener while its owner is kept, not once it is not.
        attr.retain_procs(|p| *p == me);
        assert!(attr.listeners.contains_key(&(7, 80)));
        assert!(!attr.listeners.contains_key(&(7, 81)));
    }

    #[test]
    fn new_udp_holders_cost_the_new_udp_sockets_not_the_churn() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let owners = FakeTable::new(8192);
        let udp = FakeTable::new(1024);
        for i in 0..5000 {
            owners.set(1_000_000 + i, me());
        }
        let ino = 77_000_001;
        owners.set(ino, owner_of(child.id()));
        udp.set(ino, bufscope_common::IPPROTO_UDP);
        let mut attr = Attributor::new(Procfs::new("/proc"), Some(owners.boxed()))
            .with_udp_sockets(Some(udp.boxed()));
        let found = attr.new_udp_holders();
        let sleeper = ProcRef {
            tgid: child.id(),
            start_ticks: Procfs::new("/proc").start_ticks(child.id()).unwrap(),
        };
        assert!(found.contains(&sleeper), "{found:?}");
        assert_eq!(attr.lookup_inode(ino), Some(sleeper));
        assert_eq!(owners.reads(), (0, 1), "one lookup, no read of all OWNERS");
        assert_eq!(udp.reads().0, 1);
        assert!(
            udp.is_empty(),
            "what was read is deleted: the next read is of new sockets"
        );
        // Nothing new: nothing looked up, nothing reported again.
        attr.udp.last = None;
        assert!(!attr.new_udp_holders().contains(&sleeper));
        assert_eq!(owners.reads(), (0, 1));
        // Many new UDP sockets at once (a UDP socket()/close() loop): one batch read of OWNERS.
        for i in 0..=(UDP_OWNERS_BATCH as u64) {
            udp.set(88_000_000 + i, bufscope_common::IPPROTO_UDP);
        }
        attr.udp.last = None;
        attr.new_udp_holders();
        assert_eq!(owners.reads(), (1, 1));
        let _ = child.kill();
        let _ = child.wait();
    }
}
