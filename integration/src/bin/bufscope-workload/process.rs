//! One setsockopt call with its readbacks, and a process that only holds a comm.

use std::os::fd::AsRawFd as _;

use anyhow::bail;

use crate::args::*;
use crate::sys::*;
use crate::tcp::{locks_of, locks_source, tcp_socket};
use crate::udp::udp_socket;

pub(crate) fn one_setsockopt(a: &Args) -> anyhow::Result<()> {
    let s = match a.value("--proto").unwrap_or("udp") {
        "tcp" => tcp_socket()?,
        _ => udp_socket(false)?,
    };
    let opt = match a.value("--opt").unwrap_or("SO_RCVBUF") {
        "SO_RCVBUF" => libc::SO_RCVBUF,
        "SO_SNDBUF" => libc::SO_SNDBUF,
        "SO_RCVBUFFORCE" => libc::SO_RCVBUFFORCE,
        "SO_SNDBUFFORCE" => libc::SO_SNDBUFFORCE,
        "SO_BUF_LOCK" => SO_BUF_LOCK,
        o => bail!("unknown option {o}"),
    };
    let value: i32 = a.num("--value", 0)?;
    let fd = s.as_raw_fd();
    let res = setsockopt_int(fd, libc::SOL_SOCKET, opt, value);
    let errno = res
        .as_ref()
        .err()
        .and_then(|e| e.raw_os_error())
        .unwrap_or(0);
    let set = match (errno, opt) {
        (0, libc::SO_RCVBUF | libc::SO_RCVBUFFORCE) => 2,
        (0, libc::SO_SNDBUF | libc::SO_SNDBUFFORCE) => 1,
        (0, SO_BUF_LOCK) => value & 3,
        _ => 0,
    };
    ready(&[
        ("pid", std::process::id().to_string()),
        ("inode", inode_of(fd)?.to_string()),
        ("errno", errno.to_string()),
        (
            "rcvbuf",
            getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF)?.to_string(),
        ),
        (
            "sndbuf",
            getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF)?.to_string(),
        ),
        ("locks", locks_of(fd, set)),
        ("locks_source", locks_source(fd).to_string()),
    ]);
    hold();
    Ok(())
}

pub(crate) fn hold_comm(a: &Args) -> anyhow::Result<()> {
    let comm = unescape(a.value("--comm").unwrap_or("bufscope-test"));
    set_comm(&comm)?;
    let s = udp_socket(false)?;
    s.set_recv_buffer_size(65536)?;
    ready(&[("pid", std::process::id().to_string())]);
    hold();
    drop(s);
    Ok(())
}
