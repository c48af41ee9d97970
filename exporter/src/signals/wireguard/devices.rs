//! The name of the kernel WireGuard device behind a (namespace, listen port) of
//! `bufscope_wireguard_drops_total`: its `device` label.
//!
//! The devices of a namespace are read with [`crate::kernel::wg_netlink`] (rtnetlink for the
//! `wireguard` links, the module's generic netlink for each one's listen port), entering the
//! namespace from a short-lived thread where it is not bufscope's own. A namespace is found
//! by a bind mount under `/run/netns` (`ip netns add`, CNI) or by a process living in it.
//! Reads are cached per namespace: a namespace is read again when a drop names a port its
//! last read did not list (at most every [`UNKNOWN_RETRY`]) and every [`REFRESH`] (a device
//! renamed or replaced) — never per packet or per scrape.
//!
//! The drops' namespace is the outer device's: the namespace the WireGuard device was created
//! in, where its UDP socket stays. A device moved to another namespace after its creation
//! (`ip link set wg0 netns …`) is listed in that other namespace: its drops keep an empty
//! `device`. So do drops whose name cannot be read (no `CAP_SYS_ADMIN` over the namespace for
//! `setns`, no `CAP_NET_ADMIN` for `WG_CMD_GET_DEVICE`, no `wireguard` generic netlink
//! family): the log says why, once per cause. A failed read keeps the names an earlier one
//! found (a namespace deleted since keeps its series' labels).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::attribution::Procfs;
use crate::kernel::wg_netlink::{self, Device, WgNetlinkError};

/// Shortest time between two reads of a namespace prompted by a port it did not list.
pub const UNKNOWN_RETRY: Duration = Duration::from_secs(10);
/// Every namespace with drops is read again this often.
pub const REFRESH: Duration = Duration::from_secs(300);
/// The periodic read looks again at a namespace whose last read found no WireGuard device
/// this often (every period at those that had one, and at those first seen less than this
/// long ago: a namespace is often made first and given its devices right after).
pub const EMPTY_RECHECK: Duration = Duration::from_secs(60);
/// Where `ip netns` (and CNI plugins) bind-mount named namespaces.
const NETNS_DIRS: &[&str] = &["/run/netns", "/var/run/netns"];

/// Why a namespace's devices could not be read.
#[derive(Debug)]
pub struct Unreadable {
    /// A short, stable name of the cause (each is logged once).
    pub cause: &'static str,
    /// What happened.
    pub why: String,
}

impl From<WgNetlinkError> for Unreadable {
    fn from(e: WgNetlinkError) -> Self {
        Self {
            cause: e.cause(),
            why: e.to_string(),
        }
    }
}

/// Reads the WireGuard devices of a network namespace (netlink; a fake in tests).
pub trait Reader: Send {
    /// The devices of namespace `netns` (its inode number); `procfs` finds a process in it.
    fn read(&mut self, netns: u32, procfs: &Procfs) -> Result<Vec<Device>, Unreadable>;

    /// The devices of namespace `netns`, opened at `path` (a bind mount or a process's
    /// `ns/net`).
    fn read_at(&mut self, netns: u32, path: &Path) -> Result<Vec<Device>, Unreadable>;
}

/// The real [`Reader`]: generic netlink in the namespace.
pub struct Netlink {
    /// This process's own namespace (read without `setns`).
    own: Option<u32>,
}

impl Netlink {
    /// A reader for this process.
    pub fn new() -> Self {
        Self { own: own_netns() }
    }
}

impl Reader for Netlink {
    fn read(&mut self, netns: u32, procfs: &Procfs) -> Result<Vec<Device>, Unreadable> {
        let family = wg_netlink::family_id()?;
        if Some(netns) == self.own {
            return Ok(wg_netlink::devices(family)?);
        }
        let path = netns_path(netns, procfs).ok_or_else(|| Unreadable {
            cause: "no_path",
            why: format!(
                "network namespace {netns} has no bind mount under /run/netns and no process \
                 bufscope sees"
            ),
        })?;
        Ok(wg_netlink::devices_in(Some(&path), family)?)
    }

    fn read_at(&mut self, netns: u32, path: &Path) -> Result<Vec<Device>, Unreadable> {
        let family = wg_netlink::family_id()?;
        if Some(netns) == self.own {
            return Ok(wg_netlink::devices(family)?);
        }
        Ok(wg_netlink::devices_in(Some(path), family)?)
    }
}

/// Every network namespace the periodic read looks at, each with a path that opens it: the
/// bind mounts under `/run/netns` (a namespace nothing lives in, as `ip netns add` leaves
/// it), then one process of each namespace processes live in (`namespaces`, shared with the
/// per-namespace counters' way of finding them), and this process's own.
pub fn scan_targets(
    namespaces: &mut crate::signals::netlink::namespaces::Namespaces,
    procfs: &Procfs,
    pids: &[u32],
    now: Instant,
) -> BTreeMap<u32, PathBuf> {
    let mut out = BTreeMap::new();
    // A bind mount of a namespace is on nsfs, as this process's own namespace file is (a file
    // left where a mount failed is not).
    let nsfs = std::fs::metadata("/proc/self/ns/net").ok().map(|m| m.dev());
    for dir in NETNS_DIRS {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if let Ok(m) = std::fs::metadata(&p)
                && Some(m.dev()) == nsfs
                && let Ok(ino) = u32::try_from(m.ino())
            {
                out.entry(ino).or_insert(p);
            }
        }
    }
    for (ns, pid) in namespaces.refresh_from(procfs, pids, now) {
        out.entry(ns)
            .or_insert_with(|| procfs.pid_path(pid, "ns/net"));
    }
    if let Some(own) = own_netns() {
        out.entry(own)
            .or_insert_with(|| PathBuf::from("/proc/self/ns/net"));
    }
    out
}

/// This process's network namespace.
fn own_netns() -> Option<u32> {
    crate::kernel::sock_diag::netns_of(std::path::Path::new("/proc/self/ns/net"))
        .and_then(|n| u32::try_from(n).ok())
}

/// A path that opens namespace `netns`: a bind mount under `/run/netns`, else
/// `/proc/<pid>/ns/net` of a process in it.
fn netns_path(netns: u32, procfs: &Procfs) -> Option<PathBuf> {
    for dir in NETNS_DIRS {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            // A bind mount of the namespace: its inode is the namespace's.
            if std::fs::metadata(&p).is_ok_and(|m| m.ino() == u64::from(netns)) {
                return Some(p);
            }
        }
    }
    procfs
        .pids()
        .into_iter()
        .find(|p| procfs.netns(*p) == Some(netns))
        .map(|pid| procfs.pid_path(pid, "ns/net"))
}

/// What the last read of a namespace found.
#[derive(Debug)]
struct Known {
    /// Listen port → device name.
    ports: BTreeMap<u16, String>,
    /// When it was read.
    read_at: Instant,
    /// Read by the periodic read, asked for a poll or more before: a port it does not list is
    /// read again at once (it may predate the device's port), not after [`UNKNOWN_RETRY`].
    periodic: bool,
}

/// The device names of (namespace, port), read and cached per namespace.
pub struct Devices {
    reader: Box<dyn Reader>,
    known: HashMap<u32, Known>,
    /// The causes already logged.
    said: HashSet<&'static str>,
}

impl Devices {
    /// An empty cache reading with `reader`.
    pub fn new(reader: Box<dyn Reader>) -> Self {
        Self {
            reader,
            known: HashMap::new(),
            said: HashSet::new(),
        }
    }

    /// Learns the names of namespace `ns`'s devices from a periodic read ([`Scanner::scan`]);
    /// a read that found none leaves what is known.
    pub fn learn(&mut self, ns: u32, devs: &[Device], now: Instant) {
        // A periodic read's result arrives a poll after it was asked for: a read of the names
        // made since (for a drop's new port) is newer and stays.
        if devs.is_empty() || self.known.get(&ns).is_some_and(|k| k.read_at > now) {
            return;
        }
        self.known.insert(
            ns,
            Known {
                ports: devs
                    .iter()
                    .filter(|d| d.listen_port != 0)
                    .map(|d| (d.listen_port, d.name.clone()))
                    .collect(),
                read_at: now,
                periodic: true,
            },
        );
    }

    /// Reads the namespaces of `wanted` (namespace, port) that are due: never read, a port
    /// their last read did not list (after [`UNKNOWN_RETRY`]), or read [`REFRESH`] ago.
    /// Port 0 (a packet whose port the probe could not read) is never looked up.
    pub fn update(
        &mut self,
        wanted: impl IntoIterator<Item = (u32, u16)>,
        procfs: &Procfs,
        now: Instant,
    ) {
        let mut by_ns: BTreeMap<u32, BTreeSet<u16>> = BTreeMap::new();
        for (ns, port) in wanted {
            if port != 0 {
                by_ns.entry(ns).or_default().insert(port);
            }
        }
        for (ns, ports) in by_ns {
            let due = match self.known.get(&ns) {
                None => true,
                Some(k) => {
                    let age = now.saturating_duration_since(k.read_at);
                    age >= REFRESH
                        || ((k.periodic || age >= UNKNOWN_RETRY)
                            && ports.iter().any(|p| !k.ports.contains_key(p)))
                }
            };
            if due {
                self.read(ns, &ports, procfs, now);
            }
        }
    }

    /// Reads namespace `ns` (whose drops name `ports`).
    fn read(&mut self, ns: u32, ports: &BTreeSet<u16>, procfs: &Procfs, now: Instant) {
        let found = match self.reader.read(ns, procfs) {
            Ok(devs) => devs
                .into_iter()
                .filter(|d| d.listen_port != 0)
                .map(|d| (d.listen_port, d.name))
                .collect(),
            Err(e) => {
                if self.said.insert(e.cause) {
                    tracing::warn!(
                        netns = ns,
                        "kernel WireGuard's device names cannot be read ({}): \
                         bufscope_wireguard_drops_total keeps device=\"\" where it fails \
                         (said once)",
                        e.why
                    );
                } else {
                    tracing::debug!(netns = ns, "WireGuard devices unreadable: {}", e.why);
                }
                // The names read before stay (a namespace gone since, a passing failure):
                // its series keep their labels.
                self.known.remove(&ns).map(|k| k.ports).unwrap_or_default()
            }
        };
        for p in ports.iter().filter(|p| !found.contains_key(p)) {
            tracing::debug!(
                netns = ns,
                port = p,
                "no WireGuard device of this namespace listens on the port (moved to another \
                 namespace after its creation, or gone)"
            );
        }
        self.known.insert(
            ns,
            Known {
                ports: found,
                read_at: now,
                periodic: false,
            },
        );
    }

    /// The device of namespace `ns` listening on `port` ("" when unknown).
    pub fn name(&self, ns: u32, port: u16) -> &str {
        self.known
            .get(&ns)
            .and_then(|k| k.ports.get(&port))
            .map_or("", String::as_str)
    }
}

/// The stall signal's periodic read of every namespace's devices, with its own netlink reader:
/// it runs on [`ScanThread`], away from the collector.
pub struct Scanner {
    reader: Box<dyn Reader>,
    /// The periodic read's namespaces: whether the last read found a device, when, and when
    /// the namespace was first seen.
    scanned: HashMap<u32, (bool, Instant, Instant)>,
    /// The causes already logged.
    said: HashSet<&'static str>,
}

impl Scanner {
    /// A scanner reading with `reader`.
    pub fn new(reader: Box<dyn Reader>) -> Self {
        Self {
            reader,
            scanned: HashMap::new(),
            said: HashSet::new(),
        }
    }

    /// The periodic read: every namespace of `targets` due (one that had WireGuard devices at
    /// its last read, or whose last read found none [`EMPTY_RECHECK`] ago or never was), one
    /// `RTM_GETLINK` dump and one `WG_CMD_GET_DEVICE` dump per device each. Returns what each
    /// namespace read lists (all its devices, peers included), for [`Devices::learn`] and the
    /// stall rule. Namespaces not in `targets` are forgotten.
    pub fn scan(
        &mut self,
        targets: &BTreeMap<u32, PathBuf>,
        now: Instant,
    ) -> Vec<(u32, Vec<Device>)> {
        self.scanned.retain(|ns, _| targets.contains_key(ns));
        let mut out = Vec::new();
        for (ns, path) in targets {
            let first = self.scanned.get(ns).map_or(now, |s| s.2);
            let due = match self.scanned.get(ns) {
                None => true,
                Some((had, at, first)) => {
                    *had || now.saturating_duration_since(*at) >= EMPTY_RECHECK
                        || now.saturating_duration_since(*first) < EMPTY_RECHECK
                }
            };
            if !due {
                continue;
            }
            match self.reader.read_at(*ns, path) {
                Ok(devs) => {
                    self.scanned.insert(*ns, (!devs.is_empty(), now, first));
                    out.push((*ns, devs));
                }
                Err(e) => {
                    // Not read: looked at again after EMPTY_RECHECK, its stall state kept.
                    self.scanned.insert(*ns, (false, now, first));
                    if self.said.insert(e.cause) {
                        tracing::warn!(
                            netns = ns,
                            "kernel WireGuard's devices cannot be read ({}): their stalls are \
                             not followed there (said once)",
                            e.why
                        );
                    }
                }
            }
        }
        out
    }
}

/// One periodic read's result: the namespaces it looked at (`targets`), what each namespace
/// read found, and the time it was asked for.
pub struct Scanned {
    /// The namespaces of the read's targets (the others are gone).
    pub targets: BTreeSet<u32>,
    /// What each namespace read lists.
    pub read: Vec<(u32, Vec<Device>)>,
    /// When the read was asked for (its time for the stall rule).
    pub at: Instant,
    /// How long it took.
    pub took: Duration,
}

/// The thread the periodic read runs on. The collector hands it the targets and picks the
/// result up at a later poll: a read enters every namespace and dumps every device over
/// netlink, which took a worst of 40–729 ms in a loaded emulated guest, and the collector's
/// lock is held while rooms poll. At most one read is asked for at a time; the thread ends
/// when this is dropped.
pub struct ScanThread {
    jobs: std::sync::mpsc::SyncSender<(BTreeMap<u32, PathBuf>, Instant)>,
    results: std::sync::mpsc::Receiver<Scanned>,
    busy: bool,
}

impl ScanThread {
    /// Starts the thread with `scanner`.
    pub fn spawn(mut scanner: Scanner) -> std::io::Result<Self> {
        let (jobs, job_rx) = std::sync::mpsc::sync_channel::<(BTreeMap<u32, PathBuf>, Instant)>(1);
        let (result_tx, results) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("wg-stall-read".into())
            .spawn(move || {
                for (targets, at) in job_rx {
                    let t0 = Instant::now();
                    let read = scanner.scan(&targets, at);
                    let done = Scanned {
                        targets: targets.into_keys().collect(),
                        read,
                        at,
                        took: t0.elapsed(),
                    };
                    if result_tx.send(done).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Self {
            jobs,
            results,
            busy: false,
        })
    }

    /// Asks for a read of `targets` at `at`; false (nothing asked) while one is under way.
    pub fn ask(&mut self, targets: BTreeMap<u32, PathBuf>, at: Instant) -> bool {
        if self.busy {
            return false;
        }
        self.busy = self.jobs.try_send((targets, at)).is_ok();
        self.busy
    }

    /// The result of the read asked for, once it is done.
    pub fn take(&mut self) -> Option<Scanned> {
        let r = self.results.try_recv().ok()?;
        self.busy = false;
        Some(r)
    }

    /// Whether a read is under way.
    #[cfg(test)]
    pub fn busy(&self) -> bool {
        self.busy
    }

    /// Waits up to `timeout` for the read asked for (tests).
    #[cfg(test)]
    pub fn wait(&mut self, timeout: Duration) -> Option<Scanned> {
        let r = self.results.recv_timeout(timeout).ok()?;
        self.busy = false;
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A namespace's devices (port, name), or the cause of a failed read.
    type Answer = Result<Vec<(u16, &'static str)>, &'static str>;

    /// A reader answering from a table, counting its reads.
    #[derive(Clone, Default)]
    struct Fake {
        devices: Arc<Mutex<HashMap<u32, Answer>>>,
        reads: Arc<Mutex<Vec<u32>>>,
    }

    impl Fake {
        /// What a read of namespace `netns` answers from now on.
        fn answer(&self, netns: u32, a: Answer) {
            self.devices.lock().unwrap().insert(netns, a);
        }
    }

    impl Reader for Fake {
        fn read_at(&mut self, netns: u32, _: &Path) -> Result<Vec<Device>, Unreadable> {
            self.read(netns, &Procfs::default())
        }

        fn read(&mut self, netns: u32, _: &Procfs) -> Result<Vec<Device>, Unreadable> {
            self.reads.lock().unwrap().push(netns);
            match self.devices.lock().unwrap().get(&netns) {
                Some(Ok(d)) => Ok(d
                    .iter()
                    .enumerate()
                    .map(|(i, (port, name))| Device {
                        ifindex: i as u32 + 2,
                        name: (*name).to_string(),
                        listen_port: *port,
                        peers: Vec::new(),
                    })
                    .collect()),
                Some(Err(cause)) => Err(Unreadable {
                    cause,
                    why: (*cause).to_string(),
                }),
                None => Ok(Vec::new()),
            }
        }
    }

    #[test]
    fn names_are_read_once_per_namespace_and_again_only_when_due() {
        let fake = Fake::default();
        fake.answer(10, Ok(vec![(51820, "wg0"), (51821, "wg1")]));
        fake.answer(11, Err("setns"));
        let mut d = Devices::new(Box::new(fake.clone()));
        let procfs = Procfs::default();
        let t0 = Instant::now();
        d.update(
            [(10, 51820), (10, 51821), (11, 51820), (12, 0)],
            &procfs,
            t0,
        );
        assert_eq!(d.name(10, 51820), "wg0");
        assert_eq!(d.name(10, 51821), "wg1");
        assert_eq!(d.name(11, 51820), "", "unreadable: empty");
        assert_eq!(d.name(12, 0), "", "port 0 is never looked up");
        assert_eq!(*fake.reads.lock().unwrap(), vec![10, 11]);
        // Known ports: not read again before REFRESH, whatever the polls.
        for s in [1, 60, 299] {
            d.update([(10, 51820)], &procfs, t0 + Duration::from_secs(s));
        }
        assert_eq!(fake.reads.lock().unwrap().len(), 2);
        // A port the last read did not list: read again, but not before UNKNOWN_RETRY.
        fake.answer(10, Ok(vec![(51820, "wg0"), (51821, "wg1"), (40000, "wg2")]));
        d.update([(10, 40000)], &procfs, t0 + Duration::from_secs(5));
        assert_eq!(d.name(10, 40000), "");
        d.update([(10, 40000)], &procfs, t0 + UNKNOWN_RETRY);
        assert_eq!(d.name(10, 40000), "wg2");
        assert_eq!(*fake.reads.lock().unwrap(), vec![10, 11, 10]);
        // A failed read keeps what the last one found.
        fake.answer(10, Err("no_path"));
        d.update([(10, 51820)], &procfs, t0 + UNKNOWN_RETRY + REFRESH);
        assert_eq!(d.name(10, 51820), "wg0");
        // The slow timer: a renamed device is seen.
        fake.answer(10, Ok(vec![(51820, "wg-renamed")]));
        d.update([(10, 51820)], &procfs, t0 + UNKNOWN_RETRY + REFRESH * 2);
        assert_eq!(d.name(10, 51820), "wg-renamed");
    }

    /// A periodic read asked for before a newer read of the names (its result is taken a
    /// poll later) does not replace them: a device made in between keeps its name.
    #[test]
    fn an_older_periodic_read_does_not_replace_newer_names() {
        let fake = Fake::default();
        fake.answer(10, Ok(vec![(51820, "wg0"), (51821, "wg1")]));
        let mut d = Devices::new(Box::new(fake.clone()));
        let t0 = Instant::now();
        let older = vec![Device {
            ifindex: 3,
            name: "wg1".into(),
            listen_port: 51821,
            peers: Vec::new(),
        }];
        d.update(
            [(10, 51820)],
            &Procfs::default(),
            t0 + Duration::from_secs(1),
        );
        d.learn(10, &older, t0);
        assert_eq!(d.name(10, 51820), "wg0");
        // A newer periodic read does replace them; a port it does not list (it may have read
        // the device before its port was set) is read again at the next drop, not 10 s later.
        d.learn(10, &older, t0 + Duration::from_secs(2));
        assert_eq!(d.name(10, 51820), "");
        assert_eq!(d.name(10, 51821), "wg1");
        d.update(
            [(10, 51820)],
            &Procfs::default(),
            t0 + Duration::from_secs(3),
        );
        assert_eq!(d.name(10, 51820), "wg0");
        assert_eq!(fake.reads.lock().unwrap().len(), 2);
    }

    /// The periodic read: a namespace with a device at every period, one without at every
    /// period while young, then only every EMPTY_RECHECK; names learned for the drops' label; a
    /// namespace that went is forgotten.
    #[test]
    fn the_periodic_read_skips_namespaces_without_devices_between_rechecks() {
        let fake = Fake::default();
        fake.answer(10, Ok(vec![(51820, "wg0")]));
        let mut d = Scanner::new(Box::new(fake.clone()));
        let mut names = Devices::new(Box::new(fake.clone()));
        let targets: BTreeMap<u32, PathBuf> = [
            (10, PathBuf::from("/run/netns/a")),
            (11, PathBuf::from("/proc/1/ns/net")),
        ]
        .into_iter()
        .collect();
        let t0 = Instant::now();
        let read = d.scan(&targets, t0);
        assert_eq!(read.len(), 2);
        for (ns, devs) in &read {
            names.learn(*ns, devs, t0);
        }
        assert_eq!(names.name(10, 51820), "wg0", "learned for the drops");
        // Young: both read at every period for EMPTY_RECHECK.
        d.scan(&targets, t0 + Duration::from_secs(10));
        assert_eq!(*fake.reads.lock().unwrap(), vec![10, 11, 10, 11]);
        d.scan(&targets, t0 + EMPTY_RECHECK);
        d.scan(&targets, t0 + EMPTY_RECHECK + Duration::from_secs(10));
        // Then 11 only EMPTY_RECHECK after its last read (at 10 s): at 70 s.
        assert_eq!(
            *fake.reads.lock().unwrap(),
            vec![10, 11, 10, 11, 10, 10, 11]
        );
        // Namespace 11 went; 12 appeared: read at once.
        let targets: BTreeMap<u32, PathBuf> = [
            (10, PathBuf::from("/run/netns/a")),
            (12, PathBuf::from("/proc/2/ns/net")),
        ]
        .into_iter()
        .collect();
        d.scan(&targets, t0 + EMPTY_RECHECK + Duration::from_secs(20));
        assert_eq!(
            *fake.reads.lock().unwrap(),
            vec![10, 11, 10, 11, 10, 10, 11, 10, 12]
        );
        assert!(!d.scanned.contains_key(&11));
    }

    /// The read runs on its own thread: asked once at a time, its result picked up later.
    #[test]
    fn the_periodic_read_runs_on_its_thread_one_at_a_time() {
        let fake = Fake::default();
        fake.answer(10, Ok(vec![(51820, "wg0")]));
        let mut t = ScanThread::spawn(Scanner::new(Box::new(fake.clone()))).unwrap();
        let targets: BTreeMap<u32, PathBuf> =
            [(10, PathBuf::from("/run/netns/a"))].into_iter().collect();
        let t0 = Instant::now();
        assert!(t.ask(targets.clone(), t0));
        assert!(!t.ask(targets.clone(), t0), "one read at a time");
        let done = t.wait(Duration::from_secs(10)).unwrap();
        assert_eq!(done.at, t0);
        assert_eq!(done.targets, BTreeSet::from([10]));
        assert_eq!(done.read[0].1[0].name, "wg0");
        assert!(t.take().is_none());
        assert!(t.ask(targets, t0 + Duration::from_secs(10)), "free again");
    }

    /// This machine: its own namespace is a target, and every target opens a namespace file
    /// whose inode is the target's.
    #[test]
    fn scan_targets_are_namespaces_that_open() {
        let procfs = Procfs::default();
        let pids = procfs.pids();
        let mut ns = crate::signals::netlink::namespaces::Namespaces::new();
        let targets = scan_targets(&mut ns, &procfs, &pids, Instant::now());
        let own = own_netns().unwrap();
        assert!(targets.contains_key(&own), "{targets:?}");
        for (ino, path) in &targets {
            if let Ok(m) = std::fs::metadata(path) {
                assert_eq!(m.ino(), u64::from(*ino), "{path:?}");
            }
        }
    }

    #[test]
    fn this_namespace_reads_without_error_or_says_why() {
        // Without the module (this VM) the family is missing; with it, the list is read.
        let r = Netlink::new().read(own_netns().unwrap(), &Procfs::default());
        match r {
            Ok(_) => {}
            Err(e) => assert!(
                ["no_family", "WG_CMD_GET_DEVICE"].contains(&e.cause),
                "{}: {}",
                e.cause,
                e.why
            ),
        }
    }
}
