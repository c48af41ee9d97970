//! Reading `/proc`: process names, cgroups, network namespaces, and which process holds which
//! socket (`/proc/<pid>/fd/*` → `socket:[inode]`). This is the fallback for sockets whose owner
//! the probes did not see (created before bufscope started, or by paths without a hook) and
//! the ground truth for garbage-collecting closed sockets.

use foldhash::{HashMap, HashMapExt as _, HashSet};
use std::path::{Path, PathBuf};

/// A `/proc` mount (normally `/proc`; `--path.procfs` in containers).
#[derive(Clone, Debug)]
pub struct Procfs {
    root: PathBuf,
}

impl Default for Procfs {
    fn default() -> Self {
        Self::new("/proc")
    }
}

/// Number of clock ticks per second (`_SC_CLK_TCK`), for `/proc/<pid>/stat` start times.
pub fn clk_tck() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if v > 0 { v as u64 } else { 100 }
}

impl Procfs {
    /// Uses `root` as the proc mount.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The mount's root (`/proc`, or `--path.procfs`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `/proc/<pid>/<rest>` under this mount.
    pub fn pid_path(&self, pid: u32, rest: &str) -> PathBuf {
        self.root.join(pid.to_string()).join(rest)
    }

    /// All numeric entries of `/proc` (thread-group ids).
    pub fn pids(&self) -> Vec<u32> {
        let Ok(dir) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        dir.filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect()
    }

    /// The raw `comm` of `pid` (the kernel appends one `\n`; a comm may itself contain one).
    pub fn comm(&self, pid: u32) -> Option<Vec<u8>> {
        let mut b = std::fs::read(self.pid_path(pid, "comm")).ok()?;
        if b.last() == Some(&b'\n') {
            b.pop();
        }
        Some(b)
    }

    /// Contents of `/proc/<pid>/cgroup` (lossy: cgroup names are bytes).
    pub fn cgroup(&self, pid: u32) -> Option<String> {
        crate::kernel::read_lossy(self.pid_path(pid, "cgroup"))
    }

    /// The network namespace inode of `pid`.
    pub fn netns(&self, pid: u32) -> Option<u32> {
        let link = std::fs::read_link(self.pid_path(pid, "ns/net")).ok()?;
        parse_bracketed(link.to_str()?, "net:[")
    }

    /// `/proc/<pid>/<file>` as text (e.g. `net/netlink`: the table of `pid`'s network
    /// namespace); None when it cannot be read (the process exited, the file does not exist).
    pub fn read_text(&self, pid: u32, file: &str) -> Option<String> {
        crate::kernel::read_lossy(self.pid_path(pid, file))
    }

    /// Start time of `pid` in clock ticks since boot (field 22 of `/proc/<pid>/stat`).
    pub fn start_ticks(&self, pid: u32) -> Option<u64> {
        stat_start_ticks(&std::fs::read(self.pid_path(pid, "stat")).ok()?)
    }

    /// The start time and raw `comm` of `pid` from one read of `/proc/<pid>/stat` (its
    /// second field is what `/proc/<pid>/comm` shows, without the newline): a process's
    /// liveness and its name for one file read instead of two.
    pub fn start_ticks_and_comm(&self, pid: u32) -> Option<(u64, Vec<u8>)> {
        let stat = std::fs::read(self.pid_path(pid, "stat")).ok()?;
        let ticks = stat_start_ticks(&stat)?;
        let open = stat.iter().position(|b| *b == b'(')?;
        let close = stat.iter().rposition(|b| *b == b')')?;
        Some((ticks, stat.get(open + 1..close)?.to_vec()))
    }

    /// Converts a BPF start time (ns since boot) to `/proc` clock ticks.
    pub fn ns_to_ticks(ns: u64) -> u64 {
        ns / (1_000_000_000 / clk_tck())
    }

    /// Socket inodes held open by `pid`.
    pub fn socket_inodes(&self, pid: u32) -> Vec<u64> {
        let Ok(dir) = std::fs::read_dir(self.pid_path(pid, "fd")) else {
            return Vec::new();
        };
        dir.filter_map(Result::ok)
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .filter_map(|l| parse_bracketed(l.to_str()?, "socket:["))
            .collect()
    }

    /// Socket fds of `pid`: (fd number, socket inode).
    pub fn socket_fds(&self, pid: u32) -> Vec<(u32, u64)> {
        let Ok(dir) = std::fs::read_dir(self.pid_path(pid, "fd")) else {
            return Vec::new();
        };
        dir.filter_map(Result::ok)
            .filter_map(|e| {
                let fd: u32 = e.file_name().to_str()?.parse().ok()?;
                let l = std::fs::read_link(e.path()).ok()?;
                Some((fd, parse_bracketed(l.to_str()?, "socket:[")?))
            })
            .collect()
    }

    /// Whether `pid`'s fd `fd` is socket `inode` (one `readlink`: false once the process
    /// exited or closed, moved or replaced the fd).
    pub fn fd_is_socket(&self, pid: u32, fd: u32, inode: u64) -> bool {
        std::fs::read_link(self.pid_path(pid, &format!("fd/{fd}")))
            .ok()
            .and_then(|l| parse_bracketed::<u64>(l.to_str()?, "socket:["))
            == Some(inode)
    }

    /// Every process holding each of the `wanted` socket inodes, with the fd it holds it by
    /// (one pass over all of `/proc/*/fd`; pids in ascending order, one fd per process).
    pub fn all_holders_of(&self, wanted: &HashSet<u64>) -> HashMap<u64, Vec<(u32, u32)>> {
        let mut out: HashMap<u64, Vec<(u32, u32)>> = HashMap::new();
        if wanted.is_empty() {
            return out;
        }
        let mut pids = self.pids();
        pids.sort_unstable();
        for pid in pids {
            for (fd, ino) in self.socket_fds(pid) {
                if wanted.contains(&ino) {
                    let v = out.entry(ino).or_default();
                    if v.last().is_none_or(|(p, _)| *p != pid) {
                        v.push((pid, fd));
                    }
                }
            }
        }
        out
    }

    /// For every socket inode held by any process, one holder (the lowest pid).
    pub fn all_socket_holders(&self) -> HashMap<u64, u32> {
        let mut pids = self.pids();
        pids.sort_unstable();
        let mut out = HashMap::new();
        for pid in pids {
            for ino in self.socket_inodes(pid) {
                out.entry(ino).or_insert(pid);
            }
        }
        out
    }

    /// Finds which processes hold the `wanted` socket inodes (one pass over `/proc`).
    pub fn find_socket_holders(&self, wanted: &HashSet<u64>) -> HashMap<u64, u32> {
        let mut out = HashMap::new();
        if wanted.is_empty() {
            return out;
        }
        let mut pids = self.pids();
        pids.sort_unstable();
        for pid in pids {
            for ino in self.socket_inodes(pid) {
                if wanted.contains(&ino) {
                    out.entry(ino).or_insert(pid);
                }
            }
            if out.len() == wanted.len() {
                break;
            }
        }
        out
    }

    /// Inode of the TCP listener on `port` in the network namespace that `pid_in_ns` is in.
    pub fn tcp_listener_inode(&self, pid_in_ns: u32, port: u16) -> Option<u64> {
        for file in ["net/tcp", "net/tcp6"] {
            let Ok(text) = std::fs::read_to_string(self.pid_path(pid_in_ns, file)) else {
                continue;
            };
            for line in text.lines().skip(1) {
                let f: Vec<&str> = line.split_whitespace().collect();
                // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
                if f.len() < 10 || f[3] != "0A" {
                    continue;
                }
                let lport = f[1]
                    .rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok());
                if lport == Some(port) {
                    return f[9].parse().ok();
                }
            }
        }
        None
    }

    /// Inodes of the UDP (and UDP-Lite) sockets, v4 and v6, of the network namespace that
    /// `pid_in_ns` is in (`/proc/<pid>/net/udp*`: a socket is listed once bound or connected,
    /// i.e. once it can receive). None when none of the files could be read.
    pub fn udp_inodes(&self, pid_in_ns: u32) -> Option<HashSet<u64>> {
        let mut out = HashSet::default();
        let mut read_any = false;
        for file in ["net/udp", "net/udp6", "net/udplite", "net/udplite6"] {
            let Ok(text) = std::fs::read_to_string(self.pid_path(pid_in_ns, file)) else {
                continue;
            };
            read_any = true;
            for line in text.lines().skip(1) {
                // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ref pointer drops
                if let Some(ino) = line
                    .split_whitespace()
                    .nth(9)
                    .and_then(|f| f.parse::<u64>().ok())
                    && ino != 0
                {
                    out.insert(ino);
                }
            }
        }
        read_any.then_some(out)
    }

    /// TUN/TAP devices by (netns, interface name) → the process holding the device's fd
    /// (from `/proc/<pid>/fdinfo/<fd>`'s `iff:` line).
    pub fn tun_holders(&self) -> HashMap<(u32, String), u32> {
        let mut out = HashMap::new();
        let mut pids = self.pids();
        pids.sort_unstable();
        for pid in pids {
            let Ok(dir) = std::fs::read_dir(self.pid_path(pid, "fd")) else {
                continue;
            };
            for e in dir.filter_map(Result::ok) {
                let is_tun = std::fs::read_link(e.path())
                    .map(|l| l == Path::new("/dev/net/tun"))
                    .unwrap_or(false);
                if !is_tun {
                    continue;
                }
                let info = self.pid_path(pid, "fdinfo").join(e.file_name());
                // Lossy: an interface name is bytes.
                let Some(text) = crate::kernel::read_lossy(info) else {
                    continue;
                };
                if let Some(name) = text.lines().find_map(|l| l.strip_prefix("iff:")) {
                    let netns = self.netns(pid).unwrap_or(0);
                    out.entry((netns, name.trim().to_string())).or_insert(pid);
                }
            }
        }
        out
    }
}

/// Field 22 (start time) of a `/proc/<pid>/stat` record, read as bytes: the comm in
/// parentheses is whatever bytes the process chose (not UTF-8, spaces, `)`), so the fields
/// are counted from the last `)`.
pub fn stat_start_ticks(stat: &[u8]) -> Option<u64> {
    let close = stat.iter().rposition(|b| *b == b')')?;
    let rest = stat.get(close + 1..)?;
    let field = rest
        .split(|b| b.is_ascii_whitespace())
        .filter(|f| !f.is_empty())
        .nth(19)?;
    std::str::from_utf8(field).ok()?.parse().ok()
}

/// Parses the number in `prefix<N>]` (`socket:[123]`, `net:[4026531840]`).
fn parse_bracketed<T: std::str::FromStr>(s: &str, prefix: &str) -> Option<T> {
    s.strip_prefix(prefix)?.strip_suffix(']')?.parse().ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn finds_own_socket() {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let link = std::fs::read_link(format!("/proc/self/fd/{}", s.as_raw_fd())).unwrap();
        let ino: u64 = parse_bracketed(link.to_str().unwrap(), "socket:[").unwrap();
        let p = Procfs::default();
        let me = std::process::id();
        assert!(p.socket_inodes(me).contains(&ino));
        let found = p.find_socket_holders(&HashSet::from_iter([ino]));
        assert_eq!(found.get(&ino), Some(&me));
    }

    #[test]
    fn finds_every_holder_with_its_fd() {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let fd = s.as_raw_fd() as u32;
        let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap();
        let ino: u64 = parse_bracketed(link.to_str().unwrap(), "socket:[").unwrap();
        let p = Procfs::default();
        let me = std::process::id();
        assert!(p.fd_is_socket(me, fd, ino));
        assert!(!p.fd_is_socket(me, fd, ino + 1));
        let found = p.all_holders_of(&HashSet::from_iter([ino]));
        assert_eq!(found.get(&ino), Some(&vec![(me, fd)]));
    }

    #[test]
    fn comm_keeps_inner_newlines() {
        let p = Procfs::default();
        let c = p.comm(std::process::id()).unwrap();
        assert!(!c.is_empty() && !c.ends_with(b"\n"));
    }

    #[test]
    fn stat_fields_count_from_the_last_paren_whatever_the_comm_bytes() {
        let tail = b" S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 424242 20 21\n";
        for comm in [&b"sh"[..], b"\xff\xfe-rcv\xc3", b"a) b (c", b") ) )", b""] {
            let mut stat = b"1234 (".to_vec();
            stat.extend_from_slice(comm);
            stat.push(b')');
            stat.extend_from_slice(tail);
            assert_eq!(stat_start_ticks(&stat), Some(424242), "{comm:?}");
        }
        assert_eq!(stat_start_ticks(b"1234 (no close paren"), None);
        assert_eq!(stat_start_ticks(b"1234 (x) S 1 2"), None);
    }

    #[test]
    fn start_ticks_parse() {
        let p = Procfs::default();
        assert!(p.start_ticks(std::process::id()).unwrap() > 0);
        let (ticks, comm) = p.start_ticks_and_comm(std::process::id()).unwrap();
        assert_eq!(Some(ticks), p.start_ticks(std::process::id()));
        assert_eq!(
            Some(comm),
            p.comm(std::process::id()),
            "stat's comm is comm's"
        );
        assert!(p.netns(std::process::id()).unwrap() > 0);
    }

    #[test]
    fn lists_own_udp_sockets_once_bound() {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let s6 = std::net::UdpSocket::bind("[::1]:0");
        let ino = |fd: i32| -> u64 {
            let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap();
            parse_bracketed(link.to_str().unwrap(), "socket:[").unwrap()
        };
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let udp = Procfs::default().udp_inodes(std::process::id()).unwrap();
        assert!(udp.contains(&ino(s.as_raw_fd())), "the bound UDP socket");
        if let Ok(s6) = &s6 {
            assert!(udp.contains(&ino(s6.as_raw_fd())), "the bound UDPv6 socket");
        }
        assert!(!udp.contains(&ino(tcp.as_raw_fd())), "not the TCP listener");
    }

    #[test]
    fn finds_tcp_listener() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let link = std::fs::read_link(format!("/proc/self/fd/{}", l.as_raw_fd())).unwrap();
        let ino: u64 = parse_bracketed(link.to_str().unwrap(), "socket:[").unwrap();
        assert_eq!(
            Procfs::default().tcp_listener_inode(std::process::id(), port),
            Some(ino)
        );
    }
}
