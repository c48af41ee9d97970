//! Opening a TUN device directly inside a namespace.

use std::fs::OpenOptions;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use crate::{Error, Netns};

/// `struct ifreq` as TUNSETIFF reads it: name, flags, padding to 40 bytes.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Creates the (non-persistent, `IFF_TUN | IFF_NO_PI`) TUN device `name` inside `ns` and
/// returns its non-blocking fd. The device is created by a thread switched into the
/// namespace, so it never appears in the root namespace; it disappears when the fd is closed.
pub(crate) fn open_tun_in(ns: &Netns, name: &str) -> Result<OwnedFd, Error> {
    crate::netns::check_if_name(name)?;
    if !Path::new("/dev/net/tun").exists() {
        return Err(Error::NoTun);
    }
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: 0,
        _pad: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    req.flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    ns.run_in(move || {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")?;
        // SAFETY: TUNSETIFF reads a `struct ifreq`; IfReq has its layout and outlives the call.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &req as *const IfReq) };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(OwnedFd::from(file))
    })?
    .map_err(|e| {
        Error::io(
            format!("creating TUN device {name} in netns {}", ns.name()),
            e,
        )
    })
}
