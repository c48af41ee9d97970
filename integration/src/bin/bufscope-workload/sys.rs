//! Small system calls the workloads share: socket options, the socket inode, the comm, network
//! namespaces, loopback.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd as _;

use anyhow::{Context as _, bail};

pub(crate) fn inode_of(fd: i32) -> anyhow::Result<u64> {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}"))?;
    let s = link.to_string_lossy();
    s.strip_prefix("socket:[")
        .and_then(|x| x.strip_suffix(']'))
        .and_then(|x| x.parse().ok())
        .with_context(|| format!("fd {fd} is not a socket: {s}"))
}

pub(crate) fn setsockopt_int(fd: i32, level: i32, name: i32, v: i32) -> std::io::Result<()> {
    // SAFETY: fd is a valid socket; optval points to a live c_int of the stated size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &v as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

pub(crate) fn getsockopt_int(fd: i32, level: i32, name: i32) -> std::io::Result<i32> {
    let mut v: i32 = 0;
    let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
    // SAFETY: fd is a valid socket; v/len are live and sized.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            &mut v as *mut i32 as *mut libc::c_void,
            &mut len,
        )
    };
    if rc == 0 {
        Ok(v)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

pub(crate) const SO_BUF_LOCK: i32 = 72;

pub(crate) fn set_comm(bytes: &[u8]) -> anyhow::Result<()> {
    let mut name = [0u8; 16];
    let n = bytes.len().min(15);
    name[..n].copy_from_slice(&bytes[..n]);
    // SAFETY: PR_SET_NAME reads up to 16 bytes from a valid NUL-terminated buffer.
    let rc = unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        bail!("prctl(PR_SET_NAME): {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Decodes `\xNN`, `\n`, `\\` escapes into raw bytes.
pub(crate) fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 1 < b.len() {
            match b[i + 1] {
                b'n' => {
                    out.push(b'\n');
                    i += 2;
                    continue;
                }
                b'\\' => {
                    out.push(b'\\');
                    i += 2;
                    continue;
                }
                b'x' if i + 3 < b.len() => {
                    if let (Some(h), Some(l)) = (hex(b[i + 2]), hex(b[i + 3])) {
                        out.push(h << 4 | l);
                        i += 4;
                        continue;
                    }
                }
                _ => {}
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

pub(crate) fn enter_netns_of(pid: u32) -> anyhow::Result<()> {
    let f = std::fs::File::open(format!("/proc/{pid}/ns/net"))
        .with_context(|| format!("opening /proc/{pid}/ns/net"))?;
    // SAFETY: f is an open netns fd.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("setns: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

pub(crate) fn new_netns() -> anyhow::Result<()> {
    // SAFETY: unshare has no memory-safety preconditions.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        bail!("unshare(CLONE_NEWNET): {}", std::io::Error::last_os_error());
    }
    let st = std::process::Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .status()
        .context("running ip link set lo up")?;
    if !st.success() {
        bail!("ip link set lo up failed");
    }
    Ok(())
}

pub(crate) fn loopback(v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::LOCALHOST)
    } else {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    }
}
