//! The receive buffer and `NETLINK_NO_ENOBUFS` of a netlink socket another process holds:
//! `/proc/net/netlink` has neither. The socket is borrowed with `pidfd_getfd(2)` (5.6+; needs
//! `CAP_SYS_PTRACE` over the holder, which bufscope has for `/proc/<pid>/fd`), read with
//! `getsockopt(2)` and closed again: the holder's socket is not changed. Done only for a
//! socket that overran, when it first does and then at most every
//! [`REFRESH`](super::INFO_REFRESH).

use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};

/// `SOL_NETLINK`.
const SOL_NETLINK: libc::c_int = 270;
/// `NETLINK_NO_ENOBUFS`.
const NETLINK_NO_ENOBUFS: libc::c_int = 5;

/// What a netlink socket's options say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// `SO_RCVBUF` as `getsockopt` returns it (the doubled effective size).
    pub rcvbuf: i32,
    /// `NETLINK_NO_ENOBUFS` is set: the reader is not told about overruns.
    pub no_enobufs: bool,
}

fn errno(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

fn int_opt(fd: &OwnedFd, level: libc::c_int, name: libc::c_int) -> Result<i32, String> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a valid fd, and a buffer of the length passed.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&raw mut v).cast(),
            &raw mut len,
        )
    };
    if r != 0 {
        return Err(errno("getsockopt"));
    }
    Ok(v)
}

/// Reads the options of socket `inode`, held by `pid` as fd `fd`. Errors say why (the
/// process is gone, `pidfd_getfd` is not permitted, the fd is another socket now).
pub fn read(pid: u32, fd: u32, inode: u64) -> Result<Options, String> {
    // SAFETY: plain syscalls; every fd returned is owned below.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if pidfd < 0 {
        return Err(errno("pidfd_open"));
    }
    // SAFETY: pidfd_open returned a new fd.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    // SAFETY: as above.
    let sock = unsafe {
        libc::syscall(
            libc::SYS_pidfd_getfd,
            pidfd.as_raw_fd(),
            fd as libc::c_int,
            0,
        )
    };
    if sock < 0 {
        return Err(errno("pidfd_getfd"));
    }
    // SAFETY: pidfd_getfd returned a new fd (a duplicate in this process).
    let sock = unsafe { OwnedFd::from_raw_fd(sock as i32) };
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: a valid fd and a stat buffer.
    if unsafe { libc::fstat(sock.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(errno("fstat"));
    }
    // SAFETY: fstat succeeded and filled it.
    let st = unsafe { st.assume_init() };
    if st.st_ino != inode {
        return Err(format!(
            "fd {fd} of pid {pid} is socket {} now, not {inode}",
            st.st_ino
        ));
    }
    Ok(Options {
        rcvbuf: int_opt(&sock, libc::SOL_SOCKET, libc::SO_RCVBUF)?,
        no_enobufs: int_opt(&sock, SOL_NETLINK, NETLINK_NO_ENOBUFS)? != 0,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Reads a netlink socket of this very process through pidfd_getfd (allowed on oneself
    /// without privilege).
    #[test]
    fn reads_own_netlink_socket() {
        // SAFETY: plain socket(2)/setsockopt(2) on an fd owned here.
        let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW, 0) };
        assert!(fd >= 0);
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        let v: libc::c_int = 16384;
        let one: libc::c_int = 1;
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&raw const v).cast(),
                4,
            );
            libc::setsockopt(
                fd,
                SOL_NETLINK,
                NETLINK_NO_ENOBUFS,
                (&raw const one).cast(),
                4,
            );
        }
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        assert_eq!(unsafe { libc::fstat(fd, st.as_mut_ptr()) }, 0);
        let ino = unsafe { st.assume_init() }.st_ino;
        let got = read(std::process::id(), fd as u32, ino).unwrap();
        assert_eq!(
            got,
            Options {
                rcvbuf: 32768,
                no_enobufs: true
            }
        );
        assert!(read(std::process::id(), fd as u32, ino + 1).is_err());
        drop(owned);
    }
}
