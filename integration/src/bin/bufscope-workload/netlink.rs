//! `netlink-listen`: a netlink socket bound to multicast groups, as the route and XFRM event
//! listeners of IKE daemons, routing daemons and CNI agents are.

use anyhow::bail;

use crate::args::*;
use crate::sys::*;

/// A netlink listener (`netlink-listen`): bound to multicast groups, reading only with
/// `--read` (then it drains everything, as a daemon that keeps up would).
pub(crate) fn netlink_listen(a: &Args) -> anyhow::Result<()> {
    let protocol: i32 = a.num("--protocol", 0)?;
    let groups = match a.value("--groups") {
        Some(g) => match g.strip_prefix("0x") {
            Some(h) => u32::from_str_radix(h, 16)?,
            None => g.parse()?,
        },
        None => 0x41,
    };
    // SAFETY: plain socket(2).
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            protocol,
        )
    };
    if fd < 0 {
        bail!("socket(AF_NETLINK): {}", std::io::Error::last_os_error());
    }
    if let Some(n) = a.value("--rcvbuf") {
        setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, n.parse()?)?;
    }
    // SAFETY: a zeroed sockaddr_nl with family and groups set, of its own size.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as u16;
    addr.nl_groups = groups;
    // SAFETY: addr is a valid sockaddr_nl.
    let rc = unsafe {
        libc::bind(
            fd,
            (&raw const addr).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        bail!("bind(AF_NETLINK): {}", std::io::Error::last_os_error());
    }
    let rcvbuf = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF)?;
    if a.flag("--read") {
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 16];
            loop {
                // SAFETY: valid fd and buffer; errors (ENOBUFS) are read past.
                let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
                if n == 0 {
                    return;
                }
            }
        });
    }
    ready(&[
        ("pid", std::process::id().to_string()),
        ("inode", inode_of(fd)?.to_string()),
        ("rcvbuf", rcvbuf.to_string()),
    ]);
    hold();
    Ok(())
}
