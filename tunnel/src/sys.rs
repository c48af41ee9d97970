//! Small safe wrappers over the few syscalls the data path needs.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A process-wide stop flag that also wakes every thread blocked in [`wait_readable`]: an
/// eventfd that becomes (and stays) readable once [`Shutdown::trigger`] is called.
#[derive(Clone)]
pub struct Shutdown(Arc<ShutdownInner>);

struct ShutdownInner {
    fd: OwnedFd,
    flag: AtomicBool,
}

impl Shutdown {
    /// A new, untriggered flag.
    pub fn new() -> io::Result<Self> {
        // SAFETY: plain syscall; the returned fd is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh, valid descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self(Arc::new(ShutdownInner {
            fd,
            flag: AtomicBool::new(false),
        })))
    }

    /// Sets the flag and wakes all waiters.
    pub fn trigger(&self) {
        self.0.flag.store(true, Ordering::SeqCst);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our eventfd.
        unsafe { libc::write(self.0.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Whether [`Shutdown::trigger`] was called.
    pub fn is_triggered(&self) -> bool {
        self.0.flag.load(Ordering::SeqCst)
    }

    /// Sleeps for `d` or until shutdown; `true` if shutdown came first.
    pub fn sleep(&self, d: Duration) -> io::Result<bool> {
        Ok(wait_readable(-1, None, self, Some(d))? == Wake::Shutdown)
    }

    fn raw(&self) -> RawFd {
        self.0.fd.as_raw_fd()
    }
}

/// Result of [`wait_readable`].
#[derive(Debug, PartialEq, Eq)]
pub enum Wake {
    /// The first fd is readable.
    Ready,
    /// The second fd (an extra event source) is readable.
    Extra,
    /// Shutdown was triggered.
    Shutdown,
    /// The timeout elapsed.
    Timeout,
}

/// Blocks until `fd` (or `extra`) is readable, shutdown is triggered, or `timeout` passes.
pub fn wait_readable(
    fd: RawFd,
    extra: Option<RawFd>,
    shutdown: &Shutdown,
    timeout: Option<Duration>,
) -> io::Result<Wake> {
    let mut fds = [
        libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: shutdown.raw(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: extra.unwrap_or(-1),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ms = timeout.map_or(-1, |t| i32::try_from(t.as_millis()).unwrap_or(i32::MAX));
    loop {
        // SAFETY: fds is a valid array of 3 pollfd (a negative fd is ignored by poll).
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 3, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if fds[1].revents != 0 || shutdown.is_triggered() {
            return Ok(Wake::Shutdown);
        }
        if fds[0].revents != 0 {
            return Ok(Wake::Ready);
        }
        if fds[2].revents != 0 {
            return Ok(Wake::Extra);
        }
        return Ok(Wake::Timeout);
    }
}

/// An eventfd used as a wake-up signal between threads (counter semantics, non-blocking).
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A new eventfd.
    pub fn new() -> io::Result<Self> {
        // SAFETY: plain syscall; the fd is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh descriptor.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the fd readable.
    pub fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: 8-byte write of a valid u64.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Resets the counter (the fd stops being readable).
    pub fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: 8-byte read into a valid u64.
        unsafe { libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }

    /// The raw fd, for [`wait_readable`].
    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Blocks SIGINT and SIGTERM in the calling thread (and the threads it spawns afterwards), so
/// that [`wait_signal`] can collect them synchronously.
pub fn block_termination_signals() -> io::Result<()> {
    let set = termination_set();
    // SAFETY: valid sigset; old set not requested.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

fn termination_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}

/// Waits up to `timeout` for a blocked SIGINT/SIGTERM; returns its number.
pub fn wait_signal(timeout: Duration) -> Option<i32> {
    let set = termination_set();
    let ts = libc::timespec {
        // Clamped to i32 (68 years) and widened: `libc::time_t` is deprecated on musl, whose
        // time_t changed width; `into()` fits whichever width this target's timespec has.
        tv_sec: i32::try_from(timeout.as_secs()).unwrap_or(i32::MAX).into(),
        tv_nsec: libc::c_long::from(i32::try_from(timeout.subsec_nanos()).unwrap_or(0)),
    };
    // SAFETY: valid set and timespec; siginfo not requested.
    let sig = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &ts) };
    (sig > 0).then_some(sig)
}

/// A socket address in kernel form.
#[derive(Clone, Copy)]
pub struct RawAddr {
    /// Storage large enough for IPv4 and IPv6.
    pub storage: libc::sockaddr_storage,
    /// Used length.
    pub len: libc::socklen_t,
}

impl RawAddr {
    /// An empty address (for receiving into).
    pub fn empty() -> Self {
        // SAFETY: sockaddr_storage is plain data; all-zero is a valid (AF_UNSPEC) value.
        Self {
            storage: unsafe { std::mem::zeroed() },
            len: std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t,
        }
    }

    /// From a std address.
    pub fn from_std(addr: SocketAddr) -> Self {
        let mut r = Self::empty();
        match addr {
            SocketAddr::V4(a) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(a.ip().octets()),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
                unsafe {
                    std::ptr::write((&mut r.storage as *mut libc::sockaddr_storage).cast(), sin)
                };
                r.len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            }
            SocketAddr::V6(a) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: a.flowinfo(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: a.ip().octets(),
                    },
                    sin6_scope_id: a.scope_id(),
                };
                // SAFETY: as above, for sockaddr_in6.
                unsafe {
                    std::ptr::write((&mut r.storage as *mut libc::sockaddr_storage).cast(), sin6)
                };
                r.len = std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t;
            }
        }
        r
    }

    /// To a std address (v4-mapped IPv6 becomes IPv4); `None` for other families.
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        match i32::from(self.storage.ss_family) {
            libc::AF_INET => {
                // SAFETY: family says the storage holds a sockaddr_in.
                let sin: libc::sockaddr_in = unsafe {
                    std::ptr::read((&self.storage as *const libc::sockaddr_storage).cast())
                };
                Some(SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                    u16::from_be(sin.sin_port),
                )))
            }
            libc::AF_INET6 => {
                // SAFETY: family says the storage holds a sockaddr_in6.
                let sin6: libc::sockaddr_in6 = unsafe {
                    std::ptr::read((&self.storage as *const libc::sockaddr_storage).cast())
                };
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                let port = u16::from_be(sin6.sin6_port);
                Some(match ip.to_ipv4_mapped() {
                    Some(v4) => SocketAddr::new(IpAddr::V4(v4), port),
                    None => SocketAddr::V6(SocketAddrV6::new(
                        ip,
                        port,
                        sin6.sin6_flowinfo,
                        sin6.sin6_scope_id,
                    )),
                })
            }
            _ => None,
        }
    }
}

/// Whether an I/O error means "try again later" on a non-blocking call.
pub fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn raw_addr_round_trips() {
        for a in ["192.0.2.7:51820", "[2001:db8::1]:443"] {
            let s: SocketAddr = a.parse().unwrap();
            assert_eq!(RawAddr::from_std(s).socket_addr(), Some(s));
        }
        assert_eq!(RawAddr::empty().socket_addr(), None);
    }

    #[test]
    fn shutdown_wakes_waiters() {
        let sd = Shutdown::new().unwrap();
        let ev = EventFd::new().unwrap();
        let w = wait_readable(ev.raw(), None, &sd, Some(Duration::from_millis(10))).unwrap();
        assert_eq!(w, Wake::Timeout);
        ev.notify();
        assert_eq!(
            wait_readable(ev.raw(), None, &sd, None).unwrap(),
            Wake::Ready
        );
        ev.drain();
        let sd2 = sd.clone();
        let t = std::thread::spawn(move || wait_readable(ev.raw(), None, &sd2, None).unwrap());
        std::thread::sleep(Duration::from_millis(20));
        sd.trigger();
        assert_eq!(t.join().unwrap(), Wake::Shutdown);
        assert!(sd.is_triggered());
    }
}
