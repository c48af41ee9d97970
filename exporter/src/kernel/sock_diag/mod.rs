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

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

use super::netlink::in_netns;
use super::netlink::{NLMSG_HDR, exchange, u32_at};

pub use info::{Diag, TcpDiag, parse_tcp_info};
pub use listeners::{Listeners, tcp_listeners, tcp_listeners_in};

/// `NETLINK_SOCK_DIAG`.
const NETLINK_SOCK_DIAG: i32 = 4;
/// `SOCK_DIAG_BY_FAMILY`.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `sizeof(struct inet_diag_req_v2)`: family, protocol, ext, pad, states, the 48-byte id.
const REQ_LEN: usize = 56;
/// `sizeof(struct inet_diag_msg)`.
const DIAG_MSG: usize = 72;
/// Offset of `idiag_inode` in `struct inet_diag_msg`.
const DIAG_INODE: usize = 68;

/// Reads a host-order `u64` at `off` of `b`, 0 when `b` is shorter.
fn u64_at(b: &[u8], off: usize) -> u64 {
    b.get(off..off + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_ne_bytes)
}

/// A `NETLINK_SOCK_DIAG` socket of the calling thread's network namespace.
fn diag_socket() -> io::Result<OwnedFd> {
    super::netlink::socket(NETLINK_SOCK_DIAG)
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
/// says the dump is done.
fn dump(fd: &OwnedFd, req: &[u8], seq: u32, mut each: impl FnMut(&[u8])) -> io::Result<()> {
    exchange(fd, req, seq, |kind, body| {
        if kind == SOCK_DIAG_BY_FAMILY {
            each(body);
        }
    })
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
