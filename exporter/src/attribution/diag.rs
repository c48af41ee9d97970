//! TCP listeners from the kernel's socket diagnostics (`NETLINK_SOCK_DIAG`, `inet_diag`):
//! one dump of the listening sockets of a network namespace, IPv4 and IPv6, gives each
//! listening port's socket inode — a few records however many connections the namespace
//! has, where `/proc/<pid>/net/tcp{,6}` lists every connection as text.
//!
//! A netlink socket answers for the namespace it was created in: bufscope's own directly,
//! another one from a thread that entered it (`setns`, which needs `CAP_SYS_ADMIN`; without
//! it [`Listeners`] reads that namespace's `/proc/<pid>/net/tcp{,6}`).

use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::Path;

use foldhash::{HashMap, HashMapExt as _};

/// `SOCK_DIAG_BY_FAMILY`.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `NLMSG_ERROR`, `NLMSG_DONE`.
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
/// `TCP_LISTEN`.
const TCP_LISTEN: u32 = 10;
/// `sizeof(struct nlmsghdr)`.
const NLMSG_HDR: usize = 16;
/// `sizeof(struct inet_diag_req_v2)`: family, protocol, ext, pad, states, sockid (48).
const REQ_LEN: usize = 56;
/// `struct inet_diag_msg`: family, state, timer, retrans, sockid (48), expires, rqueue,
/// wqueue, uid, inode.
const MSG_INODE_AT: usize = 4 + 48 + 16;
const MSG_LEN: usize = MSG_INODE_AT + 4;

/// Listening TCP sockets of one namespace: local port → socket inode (the first found
/// when several listen on the port, e.g. v4 and v6).
pub type Listeners = HashMap<u16, u64>;

/// The TCP listeners of the namespace the calling thread is in.
pub fn tcp_listeners() -> io::Result<Listeners> {
    // SAFETY: plain socket(2); the fd is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just created and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut out = Listeners::new();
    for (seq, family) in [(1u32, libc::AF_INET), (2, libc::AF_INET6)] {
        dump(&fd, seq, family as u8, &mut out)?;
    }
    Ok(out)
}

/// The TCP listeners of the namespace `netns` (a `/proc/<pid>/ns/net`), from a thread that
/// enters it (the caller's own threads stay where they are).
pub fn tcp_listeners_in(netns: &Path) -> io::Result<Listeners> {
    let ns = std::fs::File::open(netns)?;
    std::thread::Builder::new()
        .name("bufscope-diag".into())
        .spawn(move || {
            // SAFETY: an open namespace fd; only this short-lived thread moves.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            tcp_listeners()
        })?
        .join()
        .map_err(|_| io::Error::other("the sock_diag thread panicked"))?
}

/// One `inet_diag` dump of `family`'s listening TCP sockets into `out`.
fn dump(fd: &OwnedFd, seq: u32, family: u8, out: &mut Listeners) -> io::Result<()> {
    let mut req = [0u8; NLMSG_HDR + REQ_LEN];
    req[0..4].copy_from_slice(&((NLMSG_HDR + REQ_LEN) as u32).to_ne_bytes());
    req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    req[6..8].copy_from_slice(&flags.to_ne_bytes());
    req[8..12].copy_from_slice(&seq.to_ne_bytes());
    req[NLMSG_HDR] = family;
    req[NLMSG_HDR + 1] = libc::IPPROTO_TCP as u8;
    req[NLMSG_HDR + 4..NLMSG_HDR + 8].copy_from_slice(&(1u32 << TCP_LISTEN).to_ne_bytes());
    // SAFETY: a zeroed sockaddr_nl addressed to the kernel (pid 0).
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as u16;
    // SAFETY: the request buffer and the address are valid for their lengths.
    let sent = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            req.as_ptr().cast(),
            req.len(),
            0,
            (&raw const kernel).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // SAFETY: buf is valid for its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if parse(&buf[..n as usize], seq, out)? {
            return Ok(());
        }
    }
}

/// Parses one datagram of a dump into `out`; true once the dump is done.
fn parse(mut b: &[u8], seq: u32, out: &mut Listeners) -> io::Result<bool> {
    let u32_at = |b: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    while b.len() >= NLMSG_HDR {
        let len = u32_at(b, 0).unwrap_or(0) as usize;
        let kind = u16::from_ne_bytes([b[4], b[5]]);
        if len < NLMSG_HDR || len > b.len() {
            return Err(io::Error::other("truncated sock_diag message"));
        }
        let msg = &b[NLMSG_HDR..len];
        if u32_at(b, 8) == Some(seq) {
            match kind {
                NLMSG_DONE => return Ok(true),
                NLMSG_ERROR => {
                    let errno = u32_at(msg, 0).map_or(0, |e| e as i32);
                    return Err(io::Error::from_raw_os_error(-errno));
                }
                SOCK_DIAG_BY_FAMILY if msg.len() >= MSG_LEN => {
                    // idiag_sport, network byte order.
                    let port = u16::from_be_bytes([msg[4], msg[5]]);
                    if let Some(inode) = u32_at(msg, MSG_INODE_AT).filter(|i| *i != 0) {
                        out.entry(port).or_insert(u64::from(inode));
                    }
                }
                _ => {}
            }
        }
        // Messages are 4-byte aligned.
        let next = (len + 3) & !3;
        b = b.get(next..).unwrap_or(&[]);
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn inode_of(fd: i32) -> u64 {
        let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap();
        let s = link.to_str().unwrap();
        s.trim_start_matches("socket:[")
            .trim_end_matches(']')
            .parse()
            .unwrap()
    }

    /// The kernel's own answer for this process's listeners, v4 and v6; a connected socket
    /// is not a listener.
    #[test]
    fn finds_this_processs_listeners_by_port() {
        let l4 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let l6 = std::net::TcpListener::bind("[::1]:0").ok();
        let c = std::net::TcpStream::connect(l4.local_addr().unwrap()).unwrap();
        let got = tcp_listeners().unwrap();
        assert_eq!(
            got.get(&l4.local_addr().unwrap().port()),
            Some(&inode_of(l4.as_raw_fd()))
        );
        if let Some(l6) = &l6 {
            assert_eq!(
                got.get(&l6.local_addr().unwrap().port()),
                Some(&inode_of(l6.as_raw_fd()))
            );
        }
        assert_eq!(got.get(&c.local_addr().unwrap().port()), None);
    }

    /// The namespace path variant answers for the namespace it names (here: our own).
    #[test]
    fn answers_for_a_named_namespace() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let got = tcp_listeners_in(Path::new("/proc/self/ns/net"));
        // Entering a namespace needs CAP_SYS_ADMIN: without it the error says so.
        match got {
            Ok(got) => assert_eq!(
                got.get(&l.local_addr().unwrap().port()),
                Some(&inode_of(l.as_raw_fd()))
            ),
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}"),
        }
    }

    #[test]
    fn truncated_messages_are_an_error() {
        let mut out = Listeners::new();
        let mut b = vec![0u8; 20];
        b[0..4].copy_from_slice(&40u32.to_ne_bytes());
        assert!(parse(&b, 1, &mut out).is_err());
        b[0..4].copy_from_slice(&16u32.to_ne_bytes());
        b[4..6].copy_from_slice(&NLMSG_DONE.to_ne_bytes());
        b[8..12].copy_from_slice(&1u32.to_ne_bytes());
        assert!(parse(&b, 1, &mut out).unwrap());
    }
}
