//! The kernel's socket diagnostics (`NETLINK_SOCK_DIAG`, `SOCK_DIAG_BY_FAMILY` dumps of
//! `inet_diag`): the one home of bufscope's sock_diag requests. Sockets are matched to what
//! bufscope cares about by inode or port, never by following `/proc/<pid>/fd` links.
//!
//! - [`Diag`] (`info`): `tcp_info` and memory counters of given sockets (`ss -tnim`, `ss -uam`).
//! - [`tcp_listeners`] (`listeners`): the listening TCP sockets of a namespace by port.
//!
//! sock_diag answers for the network namespace the netlink socket was created in. A socket in
//! another namespace is read through a netlink socket made there: a short-lived thread enters
//! the namespace (`setns`, which needs `CAP_SYS_ADMIN` over it), creates the socket and
//! leaves ([`in_netns`]); the socket keeps its namespace and can be reused. Without the
//! capability the dump of that namespace fails, and the callers say so (a finding without
//! `tcp_info`; listeners read from `/proc/<pid>/net/tcp{,6}`).

mod info;
mod listeners;

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::Path;

pub use info::{Diag, TcpDiag, parse_tcp_info};
pub use listeners::{Listeners, tcp_listeners, tcp_listeners_in};

/// `NETLINK_SOCK_DIAG`.
const NETLINK_SOCK_DIAG: i32 = 4;
/// `SOCK_DIAG_BY_FAMILY`.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `NLMSG_DONE`, `NLMSG_ERROR`.
const NLMSG_DONE: u16 = 3;
const NLMSG_ERROR: u16 = 2;
/// `sizeof(struct nlmsghdr)`.
const NLMSG_HDR: usize = 16;
/// `sizeof(struct inet_diag_req_v2)`: family, protocol, ext, pad, states, the 48-byte id.
const REQ_LEN: usize = 56;
/// `sizeof(struct inet_diag_msg)`.
const DIAG_MSG: usize = 72;
/// Offset of `idiag_inode` in `struct inet_diag_msg`.
const DIAG_INODE: usize = 68;
/// Receive buffer of a dump: the kernel fills a dump's datagrams up to 32 KiB
/// (`netlink_recvmsg` caps the size it learns from readers there).
const RECV_BUF: usize = 32 * 1024;

/// Reads a host-order `u32` at `off` of `b`, 0 when `b` is shorter.
fn u32_at(b: &[u8], off: usize) -> u32 {
    b.get(off..off + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_ne_bytes)
}

/// Reads a host-order `u64` at `off` of `b`, 0 when `b` is shorter.
fn u64_at(b: &[u8], off: usize) -> u64 {
    b.get(off..off + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_ne_bytes)
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

/// The `inet_diag_req_v2` dump request (sequence `seq`) for the sockets of `family` and
/// `protocol` in the TCP states of the bit mask `states`, with the attributes of `ext`
/// (`1 << (INET_DIAG_* - 1)`).
fn request(family: u8, protocol: u8, states: u32, ext: u8, seq: u32) -> Vec<u8> {
    let len = NLMSG_HDR + REQ_LEN;
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&[family, protocol, ext, 0]);
    m.extend_from_slice(&states.to_ne_bytes());
    m.resize(len, 0);
    m
}

/// Sends the dump request `req` (sequence `seq`) on `fd` and calls `each` with the body of
/// every `SOCK_DIAG_BY_FAMILY` message of its answer (after the `nlmsghdr`), until the kernel
/// says the dump is done. `buf` is the receive buffer ([`RECV_BUF`] bytes).
fn dump(
    fd: &OwnedFd,
    req: &[u8],
    seq: u32,
    buf: &mut [u8],
    mut each: impl FnMut(&[u8]),
) -> io::Result<()> {
    // SAFETY: send(2) of a buffer we own; an unbound netlink socket sends to the kernel.
    let n = unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    loop {
        // SAFETY: recv(2) into a buffer we own, at most its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 || messages(&buf[..n as usize], seq, &mut each)? {
            return Ok(());
        }
    }
}

/// Walks the netlink messages of one datagram of the dump `seq` (messages of another
/// sequence, left over from an earlier dump, are skipped); true once the dump is done.
fn messages(mut b: &[u8], seq: u32, each: &mut impl FnMut(&[u8])) -> io::Result<bool> {
    while b.len() >= NLMSG_HDR {
        let len = u32_at(b, 0) as usize;
        let kind = u16::from_ne_bytes([b[4], b[5]]);
        if len < NLMSG_HDR || len > b.len() {
            return Err(io::Error::other("truncated sock_diag message"));
        }
        let msg = &b[NLMSG_HDR..len];
        if u32_at(b, 8) == seq {
            match kind {
                NLMSG_DONE => return Ok(true),
                NLMSG_ERROR => {
                    let errno = u32_at(msg, 0) as i32;
                    return Err(io::Error::from_raw_os_error(-errno));
                }
                SOCK_DIAG_BY_FAMILY => each(msg),
                _ => {}
            }
        }
        // Messages are 4-byte aligned.
        b = b.get((len + 3) & !3..).unwrap_or(&[]);
    }
    Ok(false)
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

    fn header(len: u32, kind: u16, seq: u32) -> Vec<u8> {
        let mut b = vec![0u8; NLMSG_HDR];
        b[0..4].copy_from_slice(&len.to_ne_bytes());
        b[4..6].copy_from_slice(&kind.to_ne_bytes());
        b[8..12].copy_from_slice(&seq.to_ne_bytes());
        b
    }

    #[test]
    fn truncated_messages_are_an_error() {
        let mut b = header(40, SOCK_DIAG_BY_FAMILY, 1);
        b.extend_from_slice(&[0; 4]);
        assert!(messages(&b, 1, &mut |_| ()).is_err());
        assert!(messages(&header(16, NLMSG_DONE, 1), 1, &mut |_| ()).unwrap());
    }

    /// A message of another dump (an earlier one's leftover) is neither passed on nor ends
    /// this dump; a kernel error ends it with the errno.
    #[test]
    fn other_sequences_are_skipped_and_errors_carry_the_errno() {
        let mut b = header(20, SOCK_DIAG_BY_FAMILY, 7);
        b.extend_from_slice(&[1, 2, 3, 4]);
        b.extend_from_slice(&header(16, NLMSG_DONE, 7));
        let mut seen = 0;
        assert!(!messages(&b, 1, &mut |_| seen += 1).unwrap());
        assert_eq!(seen, 0);
        let mut e = header(20, NLMSG_ERROR, 1);
        e.extend_from_slice(&(-libc::EPERM).to_ne_bytes());
        let err = messages(&e, 1, &mut |_| ()).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EPERM));
    }

    #[test]
    fn the_request_is_an_inet_diag_req_v2() {
        let r = request(
            libc::AF_INET6 as u8,
            libc::IPPROTO_TCP as u8,
            1 << 10,
            0x42,
            9,
        );
        assert_eq!(r.len(), NLMSG_HDR + REQ_LEN);
        assert_eq!(u32_at(&r, 0) as usize, r.len());
        assert_eq!(u32_at(&r, 8), 9);
        assert_eq!(
            &r[NLMSG_HDR..NLMSG_HDR + 4],
            &[libc::AF_INET6 as u8, 6, 0x42, 0]
        );
        assert_eq!(u32_at(&r, NLMSG_HDR + 4), 1 << 10);
    }

    #[test]
    fn netns_links_parse() {
        assert!(netns_of(Path::new("/proc/self/ns/net")).is_some());
        assert_eq!(netns_of(Path::new("/nonexistent")), None);
    }
}
