//! TCP sockets as `ss -tnim` sees them: `NETLINK_SOCK_DIAG` `SOCK_DIAG_BY_FAMILY` dumps with
//! `INET_DIAG_INFO` (`struct tcp_info`: RTT, window scales, bytes moved, time limited by the
//! send buffer) and `INET_DIAG_SKMEMINFO` (`rb`/`tb`: `sk_rcvbuf`/`sk_sndbuf`), matched to the
//! sockets bufscope cares about by inode. Never by following `/proc/<pid>/fd` links.
//!
//! sock_diag answers for the network namespace the netlink socket was created in. A socket in
//! another namespace is read through a netlink socket made there: a short-lived thread enters
//! the namespace (`setns`, which needs `CAP_SYS_ADMIN` over it), creates the socket and
//! leaves; the socket keeps its namespace and is reused ([`Diag`] caches one per namespace).
//! Without the capability the dump of that namespace fails and its sockets have no `tcp_info`
//! (the finding says so).

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::Path;

use foldhash::HashSet;

/// `NETLINK_SOCK_DIAG`.
const NETLINK_SOCK_DIAG: i32 = 4;
/// `SOCK_DIAG_BY_FAMILY`.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `INET_DIAG_INFO` (attribute type; the request's `idiag_ext` bit is `1 << (type - 1)`).
const INET_DIAG_INFO: u16 = 2;
/// `INET_DIAG_SKMEMINFO`.
const INET_DIAG_SKMEMINFO: u16 = 7;
/// `NLMSG_DONE`, `NLMSG_ERROR`.
const NLMSG_DONE: u16 = 3;
const NLMSG_ERROR: u16 = 2;
/// `sizeof(struct nlmsghdr)`.
const NLMSG_HDR: usize = 16;
/// `sizeof(struct inet_diag_msg)`.
const DIAG_MSG: usize = 72;
/// Offset of `idiag_inode` in `struct inet_diag_msg`.
const DIAG_INODE: usize = 68;

/// What sock_diag reports for one TCP socket.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TcpDiag {
    /// `tcpi_state`.
    pub state: u8,
    /// `tcpi_snd_wscale` (the peer's scale, applied to its window).
    pub snd_wscale: u8,
    /// `tcpi_rcv_wscale` (ours: `ss -i` `wscale:snd,rcv`).
    pub rcv_wscale: u8,
    /// Whether window scaling was negotiated (`TCPI_OPT_WSCALE`).
    pub wscale_ok: bool,
    /// Smoothed RTT (µs, `tcpi_rtt`).
    pub rtt_us: u32,
    /// Receiver-side RTT estimate (µs, `tcpi_rcv_rtt`; 0 until measured).
    pub rcv_rtt_us: u32,
    /// Bytes acknowledged by the peer (`tcpi_bytes_acked`).
    pub bytes_acked: u64,
    /// Bytes received (`tcpi_bytes_received`).
    pub bytes_received: u64,
    /// Time (µs) the connection was busy sending (`tcpi_busy_time`, 4.10+).
    pub busy_us: u64,
    /// Of that, time limited by the send buffer (`tcpi_sndbuf_limited`, 4.10+).
    pub sndbuf_limited_us: u64,
    /// Of that, time limited by the peer's receive window (`tcpi_rwnd_limited`).
    pub rwnd_limited_us: u64,
    /// `sk_rcvbuf` (`ss -m` `rb`).
    pub rcvbuf: u32,
    /// `sk_sndbuf` (`ss -m` `tb`).
    pub sndbuf: u32,
    /// `sk_wmem_queued` (`ss -m` `w`): the memory the send queue charges against `sk_sndbuf`,
    /// each skb at its `truesize` (payload plus the skb's own overhead).
    pub wmem_queued: u32,
    /// Bytes written but not sent yet (`tcpi_notsent_bytes`).
    pub notsent_bytes: u32,
    /// Bytes sent, retransmissions included (`tcpi_bytes_sent`, 4.19+).
    pub bytes_sent: u64,
    /// Bytes retransmitted (`tcpi_bytes_retrans`, 4.19+).
    pub bytes_retrans: u64,
    /// Packets the socket dropped (`ss -m` `d`, `SK_MEMINFO_DROPS`; the `drops` column of
    /// `/proc/net/udp` for a UDP socket).
    pub drops: u32,
}

/// Reads a little-endian (host order) `u32` at `off` of `b`, 0 when `b` is shorter.
fn u32_at(b: &[u8], off: usize) -> u32 {
    b.get(off..off + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_ne_bytes)
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    b.get(off..off + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_ne_bytes)
}

/// Fills `d` from a `struct tcp_info` as the kernel sent it (older kernels send a shorter
/// one: the fields past its end stay 0).
pub fn parse_tcp_info(b: &[u8], d: &mut TcpDiag) {
    d.state = b.first().copied().unwrap_or(0);
    let options = b.get(5).copied().unwrap_or(0);
    d.wscale_ok = options & 0x4 != 0; // TCPI_OPT_WSCALE
    let scales = b.get(6).copied().unwrap_or(0);
    d.snd_wscale = scales & 0xf;
    d.rcv_wscale = scales >> 4;
    d.rtt_us = u32_at(b, 68);
    d.rcv_rtt_us = u32_at(b, 92);
    d.bytes_acked = u64_at(b, 120);
    d.bytes_received = u64_at(b, 128);
    d.busy_us = u64_at(b, 168);
    d.rwnd_limited_us = u64_at(b, 176);
    d.sndbuf_limited_us = u64_at(b, 184);
    d.notsent_bytes = u32_at(b, 144);
    d.bytes_sent = u64_at(b, 200);
    d.bytes_retrans = u64_at(b, 208);
}

impl TcpDiag {
    /// The payload bytes the send queue holds: in flight (sent once, not acked yet) plus not
    /// sent yet. `None` when the kernel does not report `tcpi_bytes_sent` (before 4.19).
    pub fn queued_payload(&self) -> Option<u64> {
        if self.bytes_sent == 0 {
            return None;
        }
        // bytes_acked counts the SYN's sequence number too (1 byte): within noise here.
        let in_flight = self
            .bytes_sent
            .saturating_sub(self.bytes_retrans)
            .saturating_sub(self.bytes_acked);
        Some(in_flight + u64::from(self.notsent_bytes))
    }
}

/// The `inet_diag_req_v2` dump request for sockets of `family` and `protocol` in every state,
/// asking for `tcp_info` (TCP) and the memory counters.
fn request(family: u8, protocol: u8, seq: u32) -> Vec<u8> {
    let len = NLMSG_HDR + 56;
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    // struct inet_diag_req_v2: family, protocol, ext, pad, states, then the 48-byte id.
    m.push(family);
    m.push(protocol);
    let info = if i32::from(protocol) == libc::IPPROTO_TCP {
        1u8 << (INET_DIAG_INFO - 1)
    } else {
        0
    };
    m.push(info | (1u8 << (INET_DIAG_SKMEMINFO - 1)));
    m.push(0);
    m.extend_from_slice(&u32::MAX.to_ne_bytes());
    m.resize(len, 0);
    m
}

/// Parses one `SOCK_DIAG_BY_FAMILY` reply message (after its `nlmsghdr`).
fn parse_reply(body: &[u8]) -> Option<(u64, TcpDiag)> {
    if body.len() < DIAG_MSG {
        return None;
    }
    let inode = u64::from(u32_at(body, DIAG_INODE));
    let mut d = TcpDiag::default();
    let mut off = DIAG_MSG;
    while off + 4 <= body.len() {
        let alen = usize::from(u16::from_ne_bytes([body[off], body[off + 1]]));
        let atype = u16::from_ne_bytes([body[off + 2], body[off + 3]]);
        if alen < 4 || off + alen > body.len() {
            break;
        }
        let payload = &body[off + 4..off + alen];
        match atype {
            INET_DIAG_INFO => parse_tcp_info(payload, &mut d),
            INET_DIAG_SKMEMINFO => {
                // SK_MEMINFO_RCVBUF = 1, SK_MEMINFO_SNDBUF = 3, SK_MEMINFO_WMEM_QUEUED = 5,
                // SK_MEMINFO_DROPS = 8.
                d.rcvbuf = u32_at(payload, 4);
                d.sndbuf = u32_at(payload, 12);
                d.wmem_queued = u32_at(payload, 20);
                d.drops = u32_at(payload, 32);
            }
            _ => {}
        }
        off += (alen + 3) & !3;
    }
    Some((inode, d))
}

/// A `NETLINK_SOCK_DIAG` socket of the calling thread's network namespace.
fn diag_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the fd is owned by the OwnedFd on success.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A `NETLINK_SOCK_DIAG` socket made in the network namespace `ns` (a `/proc/<pid>/ns/net`),
/// from a thread that enters it and exits: this process's threads stay where they are.
fn diag_socket_in(ns: &Path) -> io::Result<OwnedFd> {
    in_netns(ns, diag_socket)
}

/// Runs `f` on a short-lived thread switched into the network namespace `ns` (a
/// `/proc/<pid>/ns/net`; `setns` needs `CAP_SYS_ADMIN` over it): sockets it makes and
/// `/proc/sys/net` paths it opens are that namespace's. This process's threads stay where
/// they are.
pub fn in_netns<T: Send>(ns: &Path, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
    let ns = File::open(ns)?;
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns on this short-lived thread only; it ends right after.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            f()
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("network namespace thread panicked")))
    })
}

/// Dumps the sockets of `protocol` (TCP or UDP) of `fd`'s namespace and keeps those in
/// `want`.
fn dump(
    fd: &OwnedFd,
    protocol: u8,
    want: &HashSet<u64>,
    out: &mut HashMap<u64, TcpDiag>,
) -> io::Result<()> {
    let mut buf = vec![0u8; 32 * 1024];
    for (seq, family) in [(1u32, libc::AF_INET as u8), (2, libc::AF_INET6 as u8)] {
        let req = request(family, protocol, seq);
        // SAFETY: send(2) of a buffer we own; the kernel's netlink address is the default.
        let n = unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        'recv: loop {
            // SAFETY: recv(2) into a buffer we own, at most its length.
            let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let n = n as usize;
            if n == 0 {
                break;
            }
            let mut off = 0;
            while off + NLMSG_HDR <= n {
                let len = u32_at(&buf[..n], off) as usize;
                let kind = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
                if len < NLMSG_HDR || off + len > n {
                    break 'recv;
                }
                match kind {
                    NLMSG_DONE => break 'recv,
                    NLMSG_ERROR => {
                        let errno = i32::from_ne_bytes(
                            buf[off + NLMSG_HDR..off + NLMSG_HDR + 4]
                                .try_into()
                                .unwrap_or([0; 4]),
                        );
                        return Err(io::Error::from_raw_os_error(-errno));
                    }
                    SOCK_DIAG_BY_FAMILY => {
                        if let Some((inode, d)) = parse_reply(&buf[off + NLMSG_HDR..off + len])
                            && want.contains(&inode)
                        {
                            out.insert(inode, d);
                        }
                    }
                    _ => {}
                }
                off += (len + 3) & !3;
            }
        }
    }
    Ok(())
}

/// sock_diag sockets, one per network namespace, made on first use.
#[derive(Default)]
pub struct Diag {
    /// By namespace inode: the socket, or why there is none (kept so a refused `setns` is not
    /// retried on every read).
    sockets: HashMap<u64, Result<OwnedFd, String>>,
    /// This process's namespace (its sockets need no `setns`).
    own: Option<u64>,
}

impl Diag {
    /// No sockets yet.
    pub fn new() -> Self {
        Self {
            sockets: HashMap::new(),
            own: netns_of(Path::new("/proc/self/ns/net")),
        }
    }

    /// `tcp_info` and buffer sizes of the sockets `inodes` in namespace `netns`, entered
    /// through `ns_path` (a `/proc/<pid>/ns/net` of a process in it) when it is not this
    /// process's own. Err: why the namespace cannot be read (e.g. no `CAP_SYS_ADMIN` for
    /// `setns`).
    pub fn read(
        &mut self,
        netns: u64,
        ns_path: &Path,
        inodes: &HashSet<u64>,
    ) -> Result<HashMap<u64, TcpDiag>, String> {
        self.read_proto(netns, ns_path, libc::IPPROTO_TCP as u8, inodes)
    }

    /// Buffer sizes and drops (`ss -uam` `rb`, `d`) of the UDP sockets `inodes` in namespace
    /// `netns` (only the memory fields are set).
    pub fn read_udp(
        &mut self,
        netns: u64,
        ns_path: &Path,
        inodes: &HashSet<u64>,
    ) -> Result<HashMap<u64, TcpDiag>, String> {
        self.read_proto(netns, ns_path, libc::IPPROTO_UDP as u8, inodes)
    }

    fn read_proto(
        &mut self,
        netns: u64,
        ns_path: &Path,
        protocol: u8,
        inodes: &HashSet<u64>,
    ) -> Result<HashMap<u64, TcpDiag>, String> {
        let own = self.own == Some(netns) || netns == 0;
        let entry = self.sockets.entry(netns).or_insert_with(|| {
            if own {
                diag_socket()
            } else {
                diag_socket_in(ns_path)
            }
            .map_err(|e| format!("cannot open sock_diag in network namespace {netns}: {e}"))
        });
        let fd = entry.as_ref().map_err(Clone::clone)?;
        let mut out = HashMap::new();
        if let Err(e) = dump(fd, protocol, inodes, &mut out) {
            // A broken socket is made anew next time.
            self.sockets.remove(&netns);
            return Err(format!("sock_diag dump of network namespace {netns}: {e}"));
        }
        Ok(out)
    }

    /// Forgets the sockets of namespaces not in `keep`.
    pub fn retain(&mut self, keep: &HashSet<u64>) {
        self.sockets.retain(|ns, _| keep.contains(ns));
    }
}

/// The inode of the network namespace at `path` (`net:[N]`).
pub fn netns_of(path: &Path) -> Option<u64> {
    let link = std::fs::read_link(path).ok()?;
    let s = link.to_str()?;
    s.strip_prefix("net:[")?.strip_suffix(']')?.parse().ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::io::{Read as _, Write as _};
    use std::net::{TcpListener, TcpStream};
    use std::os::unix::fs::MetadataExt as _;

    fn inode_of(fd: i32) -> u64 {
        std::fs::metadata(format!("/proc/self/fd/{fd}"))
            .unwrap()
            .ino()
    }

    /// The kernel's own `getsockopt(TCP_INFO)` of the same socket.
    fn tcp_info(fd: i32) -> Vec<u8> {
        let mut b = vec![0u8; 512];
        let mut len = b.len() as libc::socklen_t;
        // SAFETY: getsockopt into a buffer we own.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                b.as_mut_ptr().cast(),
                &mut len,
            )
        };
        assert_eq!(r, 0);
        b.truncate(len as usize);
        b
    }

    /// A loopback connection with a locked 96,000-byte send buffer: sock_diag's tcp_info and
    /// skmeminfo equal what getsockopt says of the same socket (no root needed in one's own
    /// namespace).
    #[test]
    fn the_dump_matches_getsockopt_of_the_same_socket() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        socket2::SockRef::from(&c)
            .set_send_buffer_size(96_000)
            .unwrap();
        let mut c = c;
        c.write_all(&[7u8; 100_000]).unwrap();
        let mut got = vec![0u8; 100_000];
        s.read_exact(&mut got).unwrap();
        let fd = c.as_raw_fd();
        let ino = inode_of(fd);
        let mut diag = Diag::new();
        let want: HashSet<u64> = [ino].into_iter().collect();
        let own = diag.own.unwrap_or(0);
        let m = diag
            .read(own, Path::new("/proc/self/ns/net"), &want)
            .unwrap();
        let d = m.get(&ino).copied().unwrap();
        let mut k = TcpDiag::default();
        parse_tcp_info(&tcp_info(fd), &mut k);
        // tb as getsockopt reads it (192,000 for the request, unless a buffer guard attached
        // at the cgroup root skipped it: either way both must agree).
        let sock = socket2::SockRef::from(&c);
        assert_eq!(d.sndbuf as usize, sock.send_buffer_size().unwrap());
        assert_eq!(d.rcvbuf as usize, sock.recv_buffer_size().unwrap());
        assert_eq!((d.rcv_wscale, d.snd_wscale), (k.rcv_wscale, k.snd_wscale));
        assert!(d.wscale_ok && d.rcv_wscale > 0, "{d:?}");
        assert_eq!(d.bytes_acked, k.bytes_acked);
        assert!(d.bytes_acked >= 100_000, "{d:?}");
        assert!(d.rtt_us > 0 && d.state == 1, "{d:?}");
        assert_eq!(m.len(), 1, "only the socket asked for");
    }

    /// The drops column of UDP socket `inode` in `/proc/self/net/udp`.
    fn proc_udp_drops(inode: u64) -> Option<u32> {
        let text = std::fs::read_to_string("/proc/self/net/udp").ok()?;
        text.lines().skip(1).find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(9)?.parse::<u64>().ok()? == inode)
                .then(|| f.last()?.parse().ok())
                .flatten()
        })
    }

    /// A UDP socket that overflowed: sock_diag's rb equals getsockopt(SO_RCVBUF) and its drops
    /// the drops column of /proc/net/udp.
    #[test]
    fn the_udp_dump_matches_getsockopt_and_proc_net_udp() {
        let r = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        socket2::SockRef::from(&r)
            .set_recv_buffer_size(4096)
            .unwrap();
        // Enough to overflow whatever the kernel granted (a buffer guard may have raised it):
        // each 1000-byte datagram is charged more than 1000 bytes.
        let rb = socket2::SockRef::from(&r).recv_buffer_size().unwrap();
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..rb / 1000 + 200 {
            s.send_to(&[1u8; 1000], r.local_addr().unwrap()).unwrap();
        }
        let ino = inode_of(r.as_raw_fd());
        let want: HashSet<u64> = [ino].into_iter().collect();
        let mut diag = Diag::new();
        let own = diag.own.unwrap_or(0);
        let m = diag
            .read_udp(own, Path::new("/proc/self/ns/net"), &want)
            .unwrap();
        let d = m.get(&ino).copied().unwrap();
        assert_eq!(d.rcvbuf as usize, rb);
        let drops = proc_udp_drops(ino).unwrap();
        assert!(drops > 0, "the datagrams overflow {rb} B");
        assert_eq!(d.drops, drops);
        assert_eq!(m.len(), 1);
    }

    #[test]
    fn short_tcp_info_leaves_the_rest_zero() {
        let mut d = TcpDiag::default();
        let mut b = vec![0u8; 72];
        b[0] = 1;
        b[5] = 0x4;
        b[6] = 0x7a;
        b[68..72].copy_from_slice(&190_000u32.to_ne_bytes());
        parse_tcp_info(&b, &mut d);
        assert_eq!(
            (d.state, d.wscale_ok, d.snd_wscale, d.rcv_wscale, d.rtt_us),
            (1, true, 0xa, 0x7, 190_000)
        );
        assert_eq!(d.sndbuf_limited_us, 0);
    }

    #[test]
    fn tcp_info_queue_fields_parse_at_their_offsets() {
        let mut d = TcpDiag::default();
        let mut b = vec![0u8; 232];
        b[120..128].copy_from_slice(&1_000u64.to_ne_bytes());
        b[144..148].copy_from_slice(&300u32.to_ne_bytes());
        b[200..208].copy_from_slice(&5_000u64.to_ne_bytes());
        b[208..216].copy_from_slice(&500u64.to_ne_bytes());
        parse_tcp_info(&b, &mut d);
        assert_eq!(
            (d.notsent_bytes, d.bytes_sent, d.bytes_retrans),
            (300, 5_000, 500)
        );
        assert_eq!(d.queued_payload(), Some(5_000 - 500 - 1_000 + 300));
        // A kernel without tcpi_bytes_sent (before 4.19) says nothing.
        let mut old = TcpDiag::default();
        parse_tcp_info(&b[..192], &mut old);
        assert_eq!(old.queued_payload(), None);
    }

    /// A real connection whose reader does not read: the queue's payload (tcp_info) against
    /// its memory (`wmem_queued`) is at most 1, and below it by the skbs' overhead.
    #[test]
    fn a_full_send_queue_is_payload_plus_overhead() {
        use std::io::Write as _;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_peer, _) = l.accept().unwrap();
        c.set_nonblocking(true).unwrap();
        let chunk = [7u8; 16384];
        while c.write(&chunk).is_ok() {}
        let ino = inode_of(c.as_raw_fd());
        let want: HashSet<u64> = [ino].into_iter().collect();
        let mut diag = Diag::new();
        let own = diag.own.unwrap_or(0);
        let m = diag
            .read(own, Path::new("/proc/self/ns/net"), &want)
            .unwrap();
        let d = m.get(&ino).copied().unwrap();
        let payload = d.queued_payload().unwrap();
        assert!(d.wmem_queued > 0 && payload > 0, "{d:?}");
        assert!(payload <= u64::from(d.wmem_queued), "{payload} > {d:?}");
    }

    #[test]
    fn netns_links_parse() {
        assert!(netns_of(Path::new("/proc/self/ns/net")).is_some());
        assert_eq!(netns_of(Path::new("/nonexistent")), None);
    }
}
