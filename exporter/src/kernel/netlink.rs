//! Netlink plumbing shared by bufscope's kernel readers (sock_diag, rtnetlink, the
//! WireGuard module's generic netlink family): a socket whose reads cannot hang, a request
//! header, one request-and-answer loop, the attribute walk, and the short-lived thread that
//! makes a socket in another network namespace.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::Path;
use std::time::Duration;

/// `NLMSG_ERROR`, `NLMSG_DONE`.
pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
/// `sizeof(struct nlmsghdr)`.
pub const NLMSG_HDR: usize = 16;
/// `NLA_TYPE_MASK`: an attribute's type without the nested/byte-order flags.
const NLA_TYPE_MASK: u16 = 0x3fff;
/// Receive buffer: the kernel fills a dump's datagrams up to 32 KiB (`netlink_recvmsg` caps
/// the size it learns from readers there).
const RECV_BUF: usize = 32 * 1024;
/// How long a read waits for the kernel's answer before giving up.
const TIMEOUT: Duration = Duration::from_secs(2);

/// A netlink socket of `protocol` in the calling thread's namespace, its reads bounded by
/// [`TIMEOUT`].
pub fn socket(protocol: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the fd is owned by the OwnedFd on success.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            protocol,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let tv = libc::timeval {
        // Not `libc::time_t`, deprecated on musl (the static build): `into()` fits the field.
        tv_sec: i32::try_from(TIMEOUT.as_secs()).unwrap_or(i32::MAX).into(),
        tv_usec: 0,
    };
    // SAFETY: setsockopt(2) with a timeval of the size given.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const tv).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// An `nlmsghdr` for a message whose payload is `payload` bytes (the length is fixed up by
/// the caller when attributes follow).
pub fn header(kind: u16, flags: i32, seq: u32, payload: usize) -> Vec<u8> {
    let mut m = Vec::with_capacity(NLMSG_HDR + payload);
    m.extend_from_slice(&((NLMSG_HDR + payload) as u32).to_ne_bytes());
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(&(flags as u16).to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m
}

/// Sends `req` (sequence `seq`) on `fd` and calls `each` with the type and body (after the
/// `nlmsghdr`) of every message of its answer, until the dump is done or the request
/// acknowledged. The receive buffer is zeroed after each read (a device's answer carries its
/// private key).
pub fn exchange(
    fd: &OwnedFd,
    req: &[u8],
    seq: u32,
    mut each: impl FnMut(u16, &[u8]),
) -> io::Result<()> {
    // SAFETY: send(2) of a buffer we own; an unbound netlink socket sends to the kernel.
    let n = unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; RECV_BUF];
    let r = loop {
        // SAFETY: recv(2) into a buffer we own, at most its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break Err(e);
        }
        let n = n as usize;
        let done = if n == 0 {
            Ok(true)
        } else {
            messages(&buf[..n], seq, &mut each)
        };
        buf[..n].fill(0);
        match done {
            Ok(false) => {}
            r => break r.map(|_| ()),
        }
    };
    // The compiler may not drop a write to memory that is read afterwards.
    std::hint::black_box(&buf);
    r
}

/// Walks the netlink messages of one datagram answering request `seq` (messages of another
/// sequence are skipped); true once the dump is done (`NLMSG_DONE`) or the request
/// acknowledged (`NLMSG_ERROR` with 0); a kernel error is returned with its errno.
pub fn messages(mut b: &[u8], seq: u32, each: &mut impl FnMut(u16, &[u8])) -> io::Result<bool> {
    while b.len() >= NLMSG_HDR {
        let len = u32_at(b, 0) as usize;
        let kind = u16::from_ne_bytes([b[4], b[5]]);
        if len < NLMSG_HDR || len > b.len() {
            return Err(io::Error::other("truncated netlink message"));
        }
        let msg = &b[NLMSG_HDR..len];
        if u32_at(b, 8) == seq {
            match kind {
                NLMSG_DONE => return Ok(true),
                NLMSG_ERROR => {
                    let errno = u32_at(msg, 0) as i32;
                    return if errno == 0 {
                        Ok(true)
                    } else {
                        Err(io::Error::from_raw_os_error(-errno))
                    };
                }
                _ => each(kind, msg),
            }
        }
        b = b.get(len.next_multiple_of(4)..).unwrap_or(&[]);
    }
    Ok(false)
}

/// The attributes (`struct nlattr`) of `b`: (type without flags, value).
pub fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = usize::from(u16::from_ne_bytes([b[0], b[1]]));
        let kind = u16::from_ne_bytes([b[2], b[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > b.len() {
            return None;
        }
        let value = &b[4..len];
        b = b.get(len.next_multiple_of(4)..).unwrap_or(&[]);
        Some((kind, value))
    })
}

/// Reads a host-order `u32` at `off` of `b`, 0 when `b` is shorter.
pub fn u32_at(b: &[u8], off: usize) -> u32 {
    b.get(off..off + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_ne_bytes)
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn acks_end_and_errors_carry_the_errno() {
        let mut ack = header(NLMSG_ERROR, 0, 3, 4);
        ack.extend_from_slice(&0i32.to_ne_bytes());
        assert!(messages(&ack, 3, &mut |_, _| ()).unwrap());
        let mut e = header(NLMSG_ERROR, 0, 3, 4);
        e.extend_from_slice(&(-libc::ENOENT).to_ne_bytes());
        let err = messages(&e, 3, &mut |_, _| ()).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
        // Another request's error is not this one's.
        assert!(!messages(&e, 4, &mut |_, _| ()).unwrap());
        let mut short = header(16, 0, 3, 40);
        short.extend_from_slice(&[0; 8]);
        assert!(messages(&short, 3, &mut |_, _| ()).is_err());
    }

    /// A message of another request (an earlier dump's leftover) is neither passed on nor
    /// ends this one.
    #[test]
    fn other_sequences_are_skipped() {
        let mut b = header(20, 0, 7, 4);
        b.extend_from_slice(&[1, 2, 3, 4]);
        b.extend_from_slice(&header(NLMSG_DONE, 0, 7, 0));
        let mut seen = 0;
        assert!(!messages(&b, 1, &mut |_, _| seen += 1).unwrap());
        assert_eq!(seen, 0);
        assert!(messages(&header(NLMSG_DONE, 0, 1, 0), 1, &mut |_, _| ()).unwrap());
    }
}
