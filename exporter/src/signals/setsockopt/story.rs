//! Each socket's buffer story (every call in order, bounded) and what advice needs beside it:
//! how the socket's network namespace sees `rmem_max`/`wmem_max`, and, for locked TCP sockets,
//! `tcp_info` from sock_diag (RTT, scales, bytes moved, time limited by the send buffer).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use foldhash::{HashMap, HashMapExt as _, HashSet};

use crate::advice::{LimitScope, NsLimits, SocketStory, TcpSample};
use crate::attribution::Procfs;
use crate::kernel::sock_diag::{Diag, netns_of};
use crate::labels::Proto;

/// Most sockets whose story is kept (an arbitrary old one goes first beyond).
pub const MAX_STORIES: usize = 20_000;

/// How often locked TCP sockets are read through sock_diag.
pub const DIAG_EVERY: Duration = Duration::from_secs(5);

/// How a process's network namespace sees the buffer limits (`/proc/<pid>/sys/net/core/*`,
/// which shows the process's own namespace), and whether it runs in a user namespace other
/// than the initial one.
pub fn ns_limits(procfs: &Procfs, pid: u32, host_netns: Option<u32>) -> NsLimits {
    let read = |name: &str| -> (Option<i64>, Option<bool>) {
        let p = procfs.pid_path(pid, &format!("sys/net/core/{name}"));
        let writable = std::fs::metadata(&p)
            .ok()
            .map(|m| m.permissions().mode() & 0o222 != 0);
        let v = std::fs::read_to_string(&p)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        (v, writable)
    };
    let (rmem_max, rw) = read("rmem_max");
    let (wmem_max, _) = read("wmem_max");
    let netns = procfs.netns(pid);
    let scope = if netns.is_some() && netns == host_netns {
        LimitScope::Host
    } else {
        match rw {
            None => LimitScope::Absent,
            Some(false) => LimitScope::ReadOnly,
            Some(true) => LimitScope::Writable,
        }
    };
    let user_ns = {
        let mine = std::fs::read_link(procfs.pid_path(pid, "ns/user")).ok();
        let init = std::fs::read_link(procfs.pid_path(1, "ns/user")).ok();
        matches!((mine, init), (Some(a), Some(b)) if a != b)
    };
    NsLimits {
        scope,
        rmem_max,
        wmem_max,
        user_ns,
    }
}

/// The network namespace bufscope itself runs in (the host's, under a DaemonSet with
/// hostNetwork).
pub fn own_netns() -> Option<u32> {
    netns_of(Path::new("/proc/self/ns/net")).and_then(|n| u32::try_from(n).ok())
}

/// Reads sock_diag for the TCP sockets of `stories` that hold a buffer lock, at most every
/// [`DIAG_EVERY`]; returns whether anything was read.
pub fn refresh_tcp(
    diag: &mut Diag,
    last: &mut Option<Instant>,
    stories: &mut HashMap<u64, SocketStory>,
    procfs: &Procfs,
    now: Instant,
) -> bool {
    if last.is_some_and(|t| now.duration_since(t) < DIAG_EVERY) {
        return false;
    }
    *last = Some(now);
    // Namespace → (a pid in it, the inodes wanted).
    let mut by_ns: BTreeMap<u32, (u32, HashSet<u64>)> = BTreeMap::new();
    for s in stories.values() {
        if s.proto == Proto::Tcp && s.locks != 0 {
            by_ns
                .entry(s.netns)
                .or_insert_with(|| (s.owner.tgid, HashSet::default()))
                .1
                .insert(s.inode);
        }
    }
    if by_ns.is_empty() {
        return false;
    }
    let mut read = HashMap::new();
    let mut errors: HashMap<u32, String> = HashMap::new();
    for (ns, (pid, inodes)) in &by_ns {
        match diag.read(u64::from(*ns), &procfs.pid_path(*pid, "ns/net"), inodes) {
            Ok(m) => read.extend(m),
            Err(e) => {
                tracing::debug!(netns = ns, error = %e, "sock_diag");
                errors.insert(*ns, e);
            }
        }
    }
    diag.retain(&by_ns.keys().map(|n| u64::from(*n)).collect());
    for s in stories.values_mut() {
        if s.proto != Proto::Tcp || s.locks == 0 {
            continue;
        }
        if let Some(d) = read.get(&s.inode) {
            s.sample(TcpSample { at: now, diag: *d });
        } else if let Some(e) = errors.get(&s.netns) {
            s.tcp_error = Some(e.clone());
        }
    }
    true
}
