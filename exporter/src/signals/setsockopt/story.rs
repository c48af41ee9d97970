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
use crate::kernel::netlink::in_netns;
use crate::kernel::sock_diag::{Diag, netns_of};
use crate::labels::Proto;

/// Most sockets whose story is kept (an arbitrary old one goes first beyond).
pub const MAX_STORIES: usize = 20_000;

/// How often locked TCP sockets are read through sock_diag.
pub const DIAG_EVERY: Duration = Duration::from_secs(5);

/// How a process's network namespace sees the buffer limits, and whether it runs in a user
/// namespace other than the initial one.
///
/// `/proc/sys/net` shows the namespace of the thread that opens it, so the files are read by a
/// thread that enters the process's namespace ([`in_netns`], `setns`: `CAP_SYS_ADMIN` over it).
/// When that fails (no capability, the process already exited) the scope is
/// [`LimitScope::Unknown`] with the errno, and the finding says it could not be read.
pub fn ns_limits(procfs: &Procfs, pid: u32, host_netns: Option<u32>) -> NsLimits {
    let user_ns = {
        let mine = std::fs::read_link(procfs.pid_path(pid, "ns/user")).ok();
        let init = std::fs::read_link(procfs.pid_path(1, "ns/user")).ok();
        matches!((mine, init), (Some(a), Some(b)) if a != b)
    };
    let mut l = NsLimits {
        scope: LimitScope::Host,
        rmem_max: None,
        wmem_max: None,
        user_ns,
        unreadable: None,
    };
    let netns = procfs.netns(pid);
    if netns.is_some() && netns == host_netns {
        return l;
    }
    let read = in_netns(&procfs.pid_path(pid, "ns/net"), || {
        Ok((core_sysctl("rmem_max")?, core_sysctl("wmem_max")?))
    });
    match read {
        Ok((rmem, wmem)) => {
            l.scope = match rmem {
                None => LimitScope::Absent,
                Some((_, false)) => LimitScope::ReadOnly,
                Some((_, true)) => LimitScope::Writable,
            };
            l.rmem_max = rmem.and_then(|r| r.0);
            l.wmem_max = wmem.and_then(|w| w.0);
        }
        Err(e) => {
            tracing::debug!(pid, error = %e, "reading rmem_max in the socket's network namespace");
            l.scope = LimitScope::Unknown;
            l.unreadable = Some(e.raw_os_error().unwrap_or(libc::EIO));
        }
    }
    l
}

/// `/proc/sys/net/core/<name>` as the calling thread's network namespace shows it: None when
/// the namespace has no such file (kernels before 6.11 show the buffer limits only in the
/// initial one), else its value and whether its mode lets root write it (6.11+: 0444, the
/// initial namespace's value).
fn core_sysctl(name: &str) -> std::io::Result<Option<(Option<i64>, bool)>> {
    let p = Path::new("/proc/sys/net/core").join(name);
    let meta = match std::fs::metadata(&p) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let writable = meta.permissions().mode() & 0o200 != 0;
    let value = std::fs::read_to_string(&p)
        .ok()
        .and_then(|s| s.trim().parse().ok());
    Ok(Some((value, writable)))
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
    stories: &mut HashMap<u64, std::sync::Arc<SocketStory>>,
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
            std::sync::Arc::make_mut(s).sample(TcpSample { at: now, diag: *d });
        } else if let Some(e) = errors.get(&s.netns) {
            std::sync::Arc::make_mut(s).tcp_error = Some(e.clone());
        }
    }
    true
}
