//! `tcp_info` and memory counters of the sockets bufscope cares about (`ss -tnim`, `ss -uam`),
//! matched by inode: [`Diag`] keeps one sock_diag socket per network namespace.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::Path;

use foldhash::HashSet;

use super::{DIAG_INODE, DIAG_MSG, diag_socket, dump, in_netns, netns_of, request};
use super::{u32_at, u64_at};

/// `INET_DIAG_INFO` (attribute type; the request's `idiag_ext` bit is `1 << (type - 1)`).
const INET_DIAG_INFO: u16 = 2;
/// `INET_DIAG_SKMEMINFO`.
const INET_DIAG_SKMEMINFO: u16 = 7;

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

/// Dumps the sockets of `protocol` (TCP or UDP) of `fd`'s namespace, in every state, and
/// keeps those in `want`.
fn dump_sockets(
    fd: &OwnedFd,
    protocol: u8,
    want: &HashSet<u64>,
    out: &mut HashMap<u64, TcpDiag>,
) -> std::io::Result<()> {
    let info = if i32::from(protocol) == libc::IPPROTO_TCP {
        1u8 << (INET_DIAG_INFO - 1)
    } else {
        0
    };
    let ext = info | (1u8 << (INET_DIAG_SKMEMINFO - 1));
    for (seq, family) in [(1u32, libc::AF_INET as u8), (2, libc::AF_INET6 as u8)] {
        let req = request(family, protocol, u32::MAX, ext, seq);
        dump(fd, &req, seq, |msg| {
            if let Some((inode, d)) = parse_reply(msg)
                && want.contains(&inode)
            {
                out.insert(inode, d);
            }
        })?;
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
                in_netns(ns_path, diag_socket)
            }
            .map_err(|e| format!("cannot open sock_diag in network namespace {netns}: {e}"))
        });
        let fd = entry.as_ref().map_err(Clone::clone)?;
        let mut out = HashMap::new();
        if let Err(e) = dump_sockets(fd, protocol, inodes, &mut out) {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::io::{Read as _, Write as _};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd as _;
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
}
