//! TCP listeners by port: one dump of the listening sockets of a network namespace, IPv4 and
//! IPv6, gives each listening port's socket inode — a few records however many connections
//! the namespace has, where `/proc/<pid>/net/tcp{,6}` lists every connection as text.

use std::io;
use std::path::Path;

use foldhash::{HashMap, HashMapExt as _};

use super::{DIAG_INODE, DIAG_MSG, diag_socket, dump, in_netns, request, u32_at};

/// `TCP_LISTEN`.
const TCP_LISTEN: u32 = 10;

/// Listening TCP sockets of one namespace: local port → socket inode (the first found
/// when several listen on the port, e.g. v4 and v6).
pub type Listeners = HashMap<u16, u64>;

/// The TCP listeners of the namespace the calling thread is in.
pub fn tcp_listeners() -> io::Result<Listeners> {
    let fd = diag_socket()?;
    let mut out = Listeners::new();
    for (seq, family) in [(1u32, libc::AF_INET as u8), (2, libc::AF_INET6 as u8)] {
        let req = request(family, libc::IPPROTO_TCP as u8, 1 << TCP_LISTEN, 0, seq);
        dump(&fd, &req, seq, |msg| {
            if msg.len() < DIAG_MSG {
                return;
            }
            // idiag_sport, network byte order.
            let port = u16::from_be_bytes([msg[4], msg[5]]);
            let inode = u32_at(msg, DIAG_INODE);
            if inode != 0 {
                out.entry(port).or_insert(u64::from(inode));
            }
        })?;
    }
    Ok(out)
}

/// The TCP listeners of the namespace `netns` (a `/proc/<pid>/ns/net`), from a thread that
/// enters it (the caller's own threads stay where they are).
pub fn tcp_listeners_in(netns: &Path) -> io::Result<Listeners> {
    in_netns(netns, tcp_listeners)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::fd::AsRawFd as _;

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
}
