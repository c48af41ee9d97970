//! Owner look-ups off the collector's lock, batched and rate-limited per cause.
//!
//! What the probes did not record (`OWNERS` is an LRU: a `socket()`/`close()` loop anywhere on
//! the node evicts the owners of long-lived sockets) must be looked for in `/proc/*/fd`, which
//! costs a `readlink` per open fd of the node. Under the collector's lock that pass stalls
//! every scrape; once per event or per newly counting socket it stalls them for good. So:
//!
//! 1. under the lock, a room asks ([`Attributor::resolve_inodes`], `refresh_holders`,
//!    `listener`, `tun`) and gets the answer the caches have, or none yet — the request is
//!    queued by [`Cause`] and the room holds its counts ([`Attributor::pending`] says the
//!    answer is still coming);
//! 2. [`Attributor::take_lookup`] hands every queued request to one [`Lookup`] when a pass is
//!    due, and [`Lookup::run`] runs it **without the lock**: one walk over `/proc/*/fd` serves
//!    every pending inode and TUN device, one `sock_diag` dump per network namespace every
//!    pending listener ([`crate::kernel::sock_diag`]), then the start time (and, for processes not known
//!    yet, the labels) of each process found;
//! 3. [`Attributor::apply_lookup`], under the lock again, files the answers (no syscall), and
//!    the rooms count what they held at their next poll.
//!
//! A pass is due when a cause with requests has a token (each cause earns one per
//! [`CAUSE_EVERY`], up to [`CAUSE_BURST`]: a flood of one kind of request cannot make passes
//! back to back), and no sooner than [`PASS_GAP`] and [`PASS_DUTY`] times the last pass's
//! length after it (background passes take at most a fifth of a core however the node
//! churns). A scrape whose counts wait runs its pass at once, rate limits aside, so that it
//! shows every count before it. Each cause queues at most [`MAX_PENDING`] requests; beyond
//! that a request is counted as dropped and its counts go to `comm="_unknown"`. Every pass serves every cause's requests.

use std::path::Path;
use std::time::{Duration, Instant};

use foldhash::{HashMap, HashMapExt as _, HashSet};
use prometheus::proto::MetricFamily;

use super::{Attributor, Procfs, TunHolders};
use crate::exposition::Spec;
use crate::kernel::sock_diag;

/// Why an owner is looked up (the `cause` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cause {
    /// A TCP connection reached ESTABLISHED and `OWNERS` no longer had its socket.
    Established,
    /// A socket with new drops whose owner is not known.
    Drops,
    /// A socket with new suppressed receive-buffer grows whose owner is not known.
    Autotune,
    /// The live holders of a socket with new counts: its first count, its holder exited, or
    /// the periodic re-listing ([`super::RESCAN_EVERY`]).
    Holders,
    /// The owner of a TCP listener (connections not accepted yet, their drops).
    Listener,
    /// The process holding a TUN/TAP device that drops.
    Tun,
}

impl Cause {
    /// Every cause, in label order.
    pub const ALL: [Cause; 6] = [
        Cause::Established,
        Cause::Drops,
        Cause::Autotune,
        Cause::Holders,
        Cause::Listener,
        Cause::Tun,
    ];

    /// The `cause` label.
    pub fn name(self) -> &'static str {
        match self {
            Cause::Established => "established",
            Cause::Drops => "drops",
            Cause::Autotune => "autotune",
            Cause::Holders => "holders",
            Cause::Listener => "listener",
            Cause::Tun => "tun",
        }
    }
}

/// Passes a cause may start back to back (its bucket's size).
pub const CAUSE_BURST: f64 = 3.0;
/// A cause earns the right to start one more pass this often.
pub const CAUSE_EVERY: Duration = Duration::from_secs(1);
/// The least time between the end of one pass and the start of the next.
pub const PASS_GAP: Duration = Duration::from_millis(200);
/// The next pass starts no sooner than this many times the last one's length after it.
pub const PASS_DUTY: u32 = 4;
/// Requests one cause may have waiting.
pub const MAX_PENDING: usize = 16_384;
/// A pass handed out and not applied after this long is taken for lost (its thread died):
/// its requests are queued again.
const LOST_AFTER: Duration = Duration::from_secs(60);

/// What a queued inode needs.
#[derive(Clone, Copy, Debug)]
struct Want {
    cause: Cause,
    /// Every live holder (to choose the one the counts go to), not just any.
    holders: bool,
    /// Counts wait for the answer (every request but the periodic re-listing of a socket
    /// whose holder lives: its counts go on meanwhile).
    urgent: bool,
}

/// One cause's bucket and counters.
#[derive(Clone, Debug, Default)]
struct CauseState {
    /// Requests queued (not yet handed to a pass).
    queued: usize,
    tokens: f64,
    refilled: Option<Instant>,
    found: u64,
    not_found: u64,
    dropped: u64,
    passes: u64,
}

/// Requests handed to a pass that has not come back yet.
#[derive(Default)]
struct InFlight {
    inodes: HashMap<u64, Want>,
    listeners: HashMap<(u32, u16), Cause>,
    tun: HashMap<(u32, String), Cause>,
    since: Option<Instant>,
}

/// The look-up queue and what passes did (the [`Attributor`]'s part).
#[derive(Default)]
pub(super) struct Lookups {
    inodes: HashMap<u64, Want>,
    listeners: HashMap<(u32, u16), Cause>,
    tun: HashMap<(u32, String), Cause>,
    /// Listeners of `listeners` (queued or in flight) that nothing waits for: a cached owner
    /// that is still alive is re-read by the background pass ([`Attributor::listener`]).
    refresh: HashSet<(u32, u16)>,
    flight: InFlight,
    causes: [CauseState; Cause::ALL.len()],
    last_end: Option<Instant>,
    last_took: Duration,
    passes: u64,
    pass_seconds: f64,
    /// Entering another network namespace was refused once (no `CAP_SYS_ADMIN`): its
    /// listeners are read from `/proc/<pid>/net/tcp{,6}` from then on.
    setns_denied: bool,
    /// Answer every request at once, in the caller (tests and one-shot tools).
    pub(super) inline: bool,
}

impl Lookups {
    /// Whether `ino` is queued or in a running pass.
    pub(super) fn asked(&self, ino: u64) -> bool {
        self.inodes.contains_key(&ino) || self.flight.inodes.contains_key(&ino)
    }

    fn pending_of(&self, c: Cause) -> usize {
        self.inodes.values().filter(|w| w.cause == c).count()
            + self.listeners.values().filter(|x| **x == c).count()
            + self.tun.values().filter(|x| **x == c).count()
    }

    fn is_empty(&self) -> bool {
        self.inodes.is_empty() && self.listeners.is_empty() && self.tun.is_empty()
    }

    /// Tops up every bucket to `now`.
    fn refill(&mut self, now: Instant) {
        for c in &mut self.causes {
            let since = c.refilled.map_or(CAUSE_EVERY.mul_f64(CAUSE_BURST), |t| {
                now.saturating_duration_since(t)
            });
            c.tokens =
                (c.tokens + since.as_secs_f64() / CAUSE_EVERY.as_secs_f64()).min(CAUSE_BURST);
            c.refilled = Some(now);
        }
    }

    /// The cause that pays for a pass starting now, if one is due.
    fn due(&mut self, now: Instant) -> Option<Cause> {
        if self.is_empty() || self.flight.since.is_some() {
            return None;
        }
        if let Some(end) = self.last_end {
            let gap = PASS_GAP.max(self.last_took * PASS_DUTY);
            if now.saturating_duration_since(end) < gap {
                return None;
            }
        }
        self.refill(now);
        let waiting: HashSet<Cause> = self
            .inodes
            .values()
            .map(|w| w.cause)
            .chain(self.listeners.values().copied())
            .chain(self.tun.values().copied())
            .collect();
        Cause::ALL
            .into_iter()
            .filter(|c| waiting.contains(c) && self.causes[*c as usize].tokens >= 1.0)
            .max_by(|a, b| {
                self.causes[*a as usize]
                    .tokens
                    .total_cmp(&self.causes[*b as usize].tokens)
            })
    }
}

/// One pass, as handed out by [`Attributor::take_lookup`]: run it without the lock.
pub struct Lookup {
    procfs: Procfs,
    /// Inodes to find (true: every holder).
    inodes: HashMap<u64, bool>,
    listeners: Vec<(u32, u16)>,
    tun: bool,
    /// A known process in each network namespace.
    netns_pids: HashMap<u32, u32>,
    /// Processes whose labels are known (only their start time is read).
    known: HashSet<u32>,
    setns_denied: bool,
}

/// What a process found by a pass is.
#[derive(Clone, Debug, Default)]
pub(super) struct ProcInfo {
    pub start_ticks: u64,
    /// `comm` and `cgroup`, for processes that were not known when the pass began.
    pub comm: Option<Vec<u8>>,
    pub cgroup: Option<String>,
}

/// Every live holder of each socket inode: (pid, fd), pids ascending.
pub type SocketHolders = HashMap<u64, Vec<(u32, u32)>>;

/// What a [`Lookup`] found.
pub struct Found {
    /// Every live holder of each inode asked for: (pid, fd), pids ascending.
    pub(super) holders: SocketHolders,
    /// The listening socket of each (netns, port) asked for.
    pub(super) listeners: Vec<((u32, u16), Option<u64>)>,
    /// Every TUN/TAP device's holder, when asked.
    pub(super) tun: Option<TunHolders>,
    pub(super) procs: HashMap<u32, ProcInfo>,
    pub(super) netns_pids: HashMap<u32, u32>,
    pub(super) setns_denied: bool,
    /// How long the pass took.
    pub took: Duration,
}

/// This process's network namespace (its own `/proc`, whatever `--path.procfs` says).
fn own_netns() -> Option<u32> {
    let link = std::fs::read_link("/proc/self/ns/net").ok()?;
    link.to_str()?
        .strip_prefix("net:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

impl Lookup {
    /// Runs the pass: listeners first (their sockets join the `/proc/*/fd` walk), then one
    /// walk for every inode and TUN device, then the processes found.
    pub fn run(mut self) -> Found {
        let started = Instant::now();
        let listeners = self.listeners();
        let mut wanted: HashMap<u64, bool> = self.inodes.clone();
        for ino in listeners.iter().filter_map(|(_, i)| *i) {
            wanted.entry(ino).or_insert(false);
        }
        let (holders, tun) = self.procfs.walk_fds(&wanted, self.tun);
        let mut procs = HashMap::new();
        let pids = holders
            .values()
            .flatten()
            .map(|(pid, _)| *pid)
            .chain(tun.iter().flat_map(|t| t.values().copied()));
        for pid in pids {
            if procs.contains_key(&pid) {
                continue;
            }
            let Some(start_ticks) = self.procfs.start_ticks(pid) else {
                continue;
            };
            let new = !self.known.contains(&pid);
            procs.insert(
                pid,
                ProcInfo {
                    start_ticks,
                    comm: new.then(|| self.procfs.comm(pid)).flatten(),
                    cgroup: new.then(|| self.procfs.cgroup(pid)).flatten(),
                },
            );
        }
        Found {
            holders,
            listeners,
            tun,
            procs,
            netns_pids: self.netns_pids,
            setns_denied: self.setns_denied,
            took: started.elapsed(),
        }
    }

    /// The listening socket of each (netns, port) asked for: one `sock_diag` dump per
    /// namespace (its `/proc/<pid>/net/tcp{,6}` where entering it is refused).
    fn listeners(&mut self) -> Vec<((u32, u16), Option<u64>)> {
        let mut by_ns: HashMap<u32, Vec<u16>> = HashMap::new();
        for (ns, port) in &self.listeners {
            by_ns.entry(*ns).or_default().push(*port);
        }
        let own = own_netns();
        let mut out = Vec::new();
        for (ns, ports) in by_ns {
            let pid = self.pid_in_netns(ns);
            let dump = if Some(ns) == own {
                sock_diag::tcp_listeners().ok()
            } else if let (Some(pid), false) = (pid, self.setns_denied) {
                let path = self.procfs.root().join(pid.to_string()).join("ns/net");
                match sock_diag::tcp_listeners_in(&path) {
                    Ok(d) => Some(d),
                    Err(e) => {
                        if e.raw_os_error() == Some(libc::EPERM) {
                            self.setns_denied = true;
                        }
                        tracing::debug!(netns = ns, "sock_diag in another namespace: {e}");
                        None
                    }
                }
            } else {
                None
            };
            for port in ports {
                let ino = match &dump {
                    Some(d) => d.get(&port).copied(),
                    None => pid.and_then(|pid| self.procfs.tcp_listener_inode(pid, port)),
                };
                out.push(((ns, port), ino));
            }
        }
        out
    }

    /// A process in network namespace `netns` (the hint when it is still there).
    fn pid_in_netns(&mut self, netns: u32) -> Option<u32> {
        if let Some(pid) = self.netns_pids.get(&netns)
            && self.procfs.netns(*pid) == Some(netns)
        {
            return Some(*pid);
        }
        let pid = self
            .procfs
            .pids()
            .into_iter()
            .find(|p| self.procfs.netns(*p) == Some(netns))?;
        self.netns_pids.insert(netns, pid);
        Some(pid)
    }
}

const LOOKUPS: Spec = Spec::counter(
    "bufscope_attribution_lookups_total",
    "Owner look-ups that the probes' records could not answer, by cause and result (found, \
     not_found, dropped: 16384 of that cause were already waiting; their counts go to \
     comm=\"_unknown\").",
    &["cause", "result"],
);
const PENDING: Spec = Spec::gauge(
    "bufscope_attribution_lookups_pending",
    "Owner look-ups waiting for the next pass over /proc (their counts are held meanwhile).",
    &["cause"],
);
const PASSES: Spec = Spec::counter(
    "bufscope_attribution_lookup_passes_total",
    "Passes over /proc/*/fd (and sock_diag dumps) that answered owner look-ups, by the cause \
     that started them; each serves every cause's pending look-ups, without the collector's \
     lock.",
    &["cause"],
);
const PASS_SECONDS: Spec = Spec::counter(
    "bufscope_attribution_lookup_pass_seconds_total",
    "Time spent in those passes (without the collector's lock).",
    &[],
);

impl Attributor {
    /// Queues a look-up of `ino`'s owner (every live holder with `holders`), unless one is
    /// already queued or in flight.
    pub(super) fn request_inode(&mut self, cause: Cause, ino: u64, holders: bool) {
        self.request(cause, ino, holders, true);
    }

    /// [`Attributor::request_inode`] for a re-listing that nothing waits for.
    pub(super) fn request_relisting(&mut self, ino: u64) {
        self.request(Cause::Holders, ino, true, false);
    }

    fn request(&mut self, cause: Cause, ino: u64, holders: bool, urgent: bool) {
        let l = &mut self.lookups;
        if let Some(w) = l
            .inodes
            .get_mut(&ino)
            .or_else(|| l.flight.inodes.get_mut(&ino))
        {
            w.holders |= holders;
            w.urgent |= urgent;
            return;
        }
        let s = &mut l.causes[cause as usize];
        if s.queued >= MAX_PENDING {
            s.dropped += 1;
            self.negative.insert(ino, Instant::now());
            self.unsettled.remove(&ino);
            return;
        }
        s.queued += 1;
        l.inodes.insert(
            ino,
            Want {
                cause,
                holders,
                urgent,
            },
        );
    }

    /// Queues a look-up of the listener on (`netns`, `port`).
    pub(super) fn request_listener(&mut self, netns: u32, port: u16) {
        self.request_listener_as(netns, port, true);
    }

    /// Queues a look-up of the listener on (`netns`, `port`); `urgent`: counts wait for it
    /// (a request then runs the pass before it answers), else the background pass re-reads
    /// it when its turn comes.
    pub(super) fn request_listener_as(&mut self, netns: u32, port: u16, urgent: bool) {
        let l = &mut self.lookups;
        let key = (netns, port);
        if l.listeners.contains_key(&key) || l.flight.listeners.contains_key(&key) {
            if urgent {
                l.refresh.remove(&key);
            }
            return;
        }
        let s = &mut l.causes[Cause::Listener as usize];
        if s.queued >= MAX_PENDING {
            s.dropped += 1;
            self.listeners.insert(key, (None, Instant::now()));
            return;
        }
        s.queued += 1;
        l.listeners.insert(key, Cause::Listener);
        if !urgent {
            l.refresh.insert(key);
        }
    }

    /// Queues a look-up of the holder of TUN/TAP device `ifname` in `netns`.
    pub(super) fn request_tun(&mut self, netns: u32, ifname: &str) {
        let l = &mut self.lookups;
        let key = (netns, ifname.to_string());
        if l.tun.contains_key(&key) || l.flight.tun.contains_key(&key) {
            return;
        }
        let s = &mut l.causes[Cause::Tun as usize];
        if s.queued >= MAX_PENDING {
            s.dropped += 1;
            return;
        }
        s.queued += 1;
        l.tun.insert(key, Cause::Tun);
    }

    /// Whether the owner of `ino` is still being looked up (queued or in a running pass): a
    /// room holds the socket's counts meanwhile.
    pub fn pending(&self, ino: u64) -> bool {
        self.lookups.asked(ino)
    }

    /// Whether the listener on (`netns`, `port`) is still being looked up.
    pub fn listener_pending(&self, netns: u32, port: u16) -> bool {
        let key = (netns, port);
        self.lookups.listeners.contains_key(&key)
            || self.lookups.flight.listeners.contains_key(&key)
    }

    /// Whether a pass is running (taken, not applied yet) that counts wait for: a request
    /// that wants every count before it waits for its answer.
    pub fn urgent_in_flight(&self) -> bool {
        let f = &self.lookups.flight;
        f.since.is_some()
            && (f
                .listeners
                .keys()
                .any(|k| !self.lookups.refresh.contains(k))
                || !f.tun.is_empty()
                || f.inodes.values().any(|w| w.urgent))
    }

    /// Whether counts wait for a queued look-up (a scrape then runs the pass, when due,
    /// before it answers; a re-listing nothing waits for is left to the background).
    pub fn lookups_urgent(&self) -> bool {
        let l = &self.lookups;
        l.listeners.keys().any(|k| !l.refresh.contains(k))
            || !l.tun.is_empty()
            || l.inodes.values().any(|w| w.urgent)
    }

    /// The next pass when one is due (see the module documentation); `force` skips the rate
    /// limits (tests, inline look-ups). Its requests stay [`Attributor::pending`] until
    /// [`Attributor::apply_lookup`].
    pub fn take_lookup(&mut self, now: Instant, force: bool) -> Option<Lookup> {
        let l = &mut self.lookups;
        if let Some(since) = l.flight.since
            && now.saturating_duration_since(since) >= LOST_AFTER
        {
            tracing::warn!("an owner look-up pass never came back: its requests are queued again");
            let flight = std::mem::take(&mut l.flight);
            l.inodes.extend(flight.inodes);
            l.listeners.extend(flight.listeners);
            l.tun.extend(flight.tun);
            for c in Cause::ALL {
                l.causes[c as usize].queued = l.pending_of(c);
            }
        }
        let payer = if force {
            if l.is_empty() || l.flight.since.is_some() {
                return None;
            }
            None
        } else {
            Some(l.due(now)?)
        };
        if let Some(c) = payer {
            let s = &mut l.causes[c as usize];
            s.tokens -= 1.0;
            s.passes += 1;
        }
        for s in &mut l.causes {
            s.queued = 0;
        }
        l.flight = InFlight {
            inodes: std::mem::take(&mut l.inodes),
            listeners: std::mem::take(&mut l.listeners),
            tun: std::mem::take(&mut l.tun),
            since: Some(now),
        };
        let f = &l.flight;
        Some(Lookup {
            procfs: self.procfs.clone(),
            inodes: f.inodes.iter().map(|(i, w)| (*i, w.holders)).collect(),
            listeners: f.listeners.keys().copied().collect(),
            tun: !f.tun.is_empty(),
            netns_pids: self.netns_pid.clone(),
            known: self.meta.keys().map(|p| p.tgid).collect(),
            setns_denied: l.setns_denied,
        })
    }

    /// Files what a pass found (no syscall but for processes that left the caches since the
    /// pass began): owners, holders, listeners, TUN holders. Counts held for them are counted
    /// at the rooms' next poll.
    pub fn apply_lookup(&mut self, found: Found) {
        let now = Instant::now();
        let flight = std::mem::take(&mut self.lookups.flight);
        let l = &mut self.lookups;
        l.last_end = Some(now);
        l.last_took = found.took;
        l.passes += 1;
        l.pass_seconds += found.took.as_secs_f64();
        l.setns_denied |= found.setns_denied;
        self.scans += 1;
        self.netns_pid
            .extend(found.netns_pids.iter().map(|(n, p)| (*n, *p)));
        for (ino, want) in &flight.inodes {
            let holders = found.holders.get(ino).map(Vec::as_slice).unwrap_or(&[]);
            let hit = if want.holders {
                self.choose_holder(*ino, holders, &found, now)
            } else {
                self.first_holder(*ino, holders, &found, now)
            };
            let s = &mut self.lookups.causes[want.cause as usize];
            if hit {
                s.found += 1;
            } else {
                s.not_found += 1;
            }
        }
        for (key, ino) in &found.listeners {
            self.lookups.refresh.remove(key);
            let owner = ino.and_then(|i| {
                self.lookup_inode(i).or_else(|| {
                    let holders = found.holders.get(&i).map(Vec::as_slice).unwrap_or(&[]);
                    self.first_holder(i, holders, &found, now)
                        .then(|| self.lookup_inode(i))
                        .flatten()
                })
            });
            let s = &mut self.lookups.causes[Cause::Listener as usize];
            if owner.is_some() {
                s.found += 1;
            } else {
                s.not_found += 1;
            }
            self.listeners.insert(*key, (owner, now));
        }
        if let Some(tun) = found.tun {
            for key in flight.tun.keys() {
                self.tun_answered.insert(key.clone(), now);
                let s = &mut self.lookups.causes[Cause::Tun as usize];
                if tun.contains_key(key) {
                    s.found += 1;
                } else {
                    s.not_found += 1;
                }
            }
            for pid in tun.values() {
                if let Some(info) = found.procs.get(pid) {
                    self.proc_from_info(*pid, info);
                }
            }
            self.tun = Some((tun, now));
        }
    }

    /// Runs every queued look-up now, in the caller ([`Lookups::inline`]; tests).
    pub(super) fn serve_inline(&mut self) {
        if self.lookups.inline
            && let Some(l) = self.take_lookup(Instant::now(), true)
        {
            let found = l.run();
            self.apply_lookup(found);
        }
    }

    /// With `inline`, look-ups run in the caller, at once (tests and one-shot tools): every
    /// request is answered before the call that made it returns. Off (the default), they
    /// wait for [`Attributor::take_lookup`].
    pub fn with_inline_lookups(mut self, inline: bool) -> Self {
        self.lookups.inline = inline;
        self
    }

    /// Runs every queued look-up now, rate limits aside (tests; the collector runs them off
    /// its lock).
    pub fn settle(&mut self) {
        if let Some(l) = self.take_lookup(Instant::now(), true) {
            let found = l.run();
            self.apply_lookup(found);
        }
    }

    /// `ino`'s owner from a pass that asked for any holder: the lowest pid holding it.
    fn first_holder(
        &mut self,
        ino: u64,
        holders: &[(u32, u32)],
        found: &Found,
        now: Instant,
    ) -> bool {
        let p = holders
            .iter()
            .find_map(|(pid, _)| self.proc_from_info(*pid, found.procs.get(pid)?));
        match p {
            Some(p) => {
                self.inode_owner.insert(ino, p);
                self.negative.remove(&ino);
                self.unsettled.remove(&ino);
                true
            }
            None => {
                self.negative.insert(ino, now);
                self.unsettled.remove(&ino);
                false
            }
        }
    }

    /// The look-up families: a cause once it asked for a look-up, a result once it happened.
    pub fn lookup_families(&self, out: &mut Vec<MetricFamily>) {
        let l = &self.lookups;
        let mut f = LOOKUPS.family();
        let mut pending = PENDING.family();
        let mut passes = PASSES.family();
        for c in Cause::ALL {
            let s = &l.causes[c as usize];
            let waiting = l.pending_of(c)
                + l.flight.inodes.values().filter(|w| w.cause == c).count()
                + l.flight.listeners.values().filter(|x| **x == c).count()
                + l.flight.tun.values().filter(|x| **x == c).count();
            // A cause is shown once it asked for a look-up, a result once it happened: no
            // series that never move (the node's series budget).
            if s.found + s.not_found + s.dropped + s.passes == 0 && waiting == 0 {
                continue;
            }
            for (result, v) in [
                ("found", s.found),
                ("not_found", s.not_found),
                ("dropped", s.dropped),
            ] {
                if v > 0 {
                    f.push(&[c.name(), result], v as f64);
                }
            }
            pending.push(&[c.name()], waiting as f64);
            passes.push(&[c.name()], s.passes as f64);
        }
        f.done(out);
        pending.done(out);
        passes.done(out);
        let mut f = PASS_SECONDS.family();
        f.push(&[], l.pass_seconds);
        f.done(out);
    }
}

impl Procfs {
    /// One walk over every `/proc/<pid>/fd`: each process holding one of `wanted`'s socket
    /// inodes with the fd it holds it by (pids ascending, one fd per process), and with
    /// `tun` every TUN/TAP device's holder (its `fdinfo` `iff:` line). The walk stops early
    /// once every inode that needs only one holder (`false`) was found and nothing else is
    /// wanted.
    pub fn walk_fds(
        &self,
        wanted: &HashMap<u64, bool>,
        tun: bool,
    ) -> (SocketHolders, Option<TunHolders>) {
        let mut out = SocketHolders::new();
        let mut tuns = tun.then(TunHolders::new);
        if wanted.is_empty() && !tun {
            return (out, tuns);
        }
        let every = tun || wanted.values().any(|all| *all);
        let mut pids = self.pids();
        pids.sort_unstable();
        for pid in pids {
            let Ok(dir) = std::fs::read_dir(self.root().join(pid.to_string()).join("fd")) else {
                continue;
            };
            for e in dir.filter_map(Result::ok) {
                let Ok(link) = std::fs::read_link(e.path()) else {
                    continue;
                };
                if let Some(tuns) = &mut tuns
                    && link == Path::new("/dev/net/tun")
                {
                    let info = self
                        .root()
                        .join(pid.to_string())
                        .join("fdinfo")
                        .join(e.file_name());
                    if let Some(name) = crate::kernel::read_lossy(info).and_then(|t| {
                        t.lines()
                            .find_map(|l| Some(l.strip_prefix("iff:")?.trim().to_string()))
                    }) {
                        let netns = self.netns(pid).unwrap_or(0);
                        tuns.entry((netns, name)).or_insert(pid);
                    }
                    continue;
                }
                let Some(ino) = link.to_str().and_then(|l| {
                    l.strip_prefix("socket:[")?
                        .strip_suffix(']')?
                        .parse::<u64>()
                        .ok()
                }) else {
                    continue;
                };
                if !wanted.contains_key(&ino) {
                    continue;
                }
                let Ok(fd) = e.file_name().to_string_lossy().parse::<u32>() else {
                    continue;
                };
                let v = out.entry(ino).or_default();
                if v.last().is_none_or(|(p, _)| *p != pid) {
                    v.push((pid, fd));
                }
            }
            if !every && out.len() == wanted.len() {
                break;
            }
        }
        (out, tuns)
    }
}
