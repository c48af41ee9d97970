//! The Linux TUN device: created with `TUNSETIFF`, configured with `ip` (as wg-quick does).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::net::Cidr;
use crate::offload::{Coalescer, OffloadError, VNET_HDR_LEN, VnetHdr, WriteStats, segment};

const TUN_PATH: &str = "/dev/net/tun";
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUN_F_CSUM: libc::c_uint = 0x01;
const TUN_F_TSO4: libc::c_uint = 0x02;
const TUN_F_TSO6: libc::c_uint = 0x04;

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// An open TUN device (layer 3, no packet information header), non-blocking. The device
/// disappears when this is dropped (it is not persistent).
pub struct Tun {
    file: File,
    name: String,
    vnet: bool,
}

impl Tun {
    /// Creates TUN device `name`. With `offload`, asks for `IFF_VNET_HDR` and TCP segmentation
    /// offload (see [`crate::offload`]); falls back to plain packets if the kernel refuses.
    pub fn create(name: &str, offload: bool) -> Result<Tun> {
        if !Path::new(TUN_PATH).exists() {
            bail!(
                "TUN device {TUN_PATH} is missing (load the module with `modprobe tun`, or give the container /dev/net/tun)"
            );
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(TUN_PATH)
            .map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => anyhow::anyhow!(
                    "TUN device {TUN_PATH} is missing (load the module with `modprobe tun`)"
                ),
                io::ErrorKind::PermissionDenied => anyhow::anyhow!(
                    "cannot open {TUN_PATH}: permission denied (run as root or grant CAP_NET_ADMIN)"
                ),
                _ => anyhow::Error::new(e).context(format!("cannot open {TUN_PATH}")),
            })?;
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            flags: IFF_TUN | IFF_NO_PI | if offload { IFF_VNET_HDR } else { 0 },
            _pad: [0; 22],
        };
        let bytes = name.as_bytes();
        if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ {
            bail!("invalid interface name {name:?}");
        }
        req.name[..bytes.len()].copy_from_slice(bytes);
        // SAFETY: TUNSETIFF reads/writes an ifreq; IfReq has the kernel's layout and size (40).
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF as _, &mut req as *mut IfReq) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EPERM) => anyhow::anyhow!(
                    "cannot create TUN device {name}: missing CAP_NET_ADMIN (run as root or `setcap cap_net_admin+ep`)"
                ),
                Some(libc::EBUSY) => anyhow::anyhow!(
                    "cannot create TUN device {name}: an interface with that name already exists"
                ),
                _ => anyhow::Error::new(e).context(format!("cannot create TUN device {name}")),
            });
        }
        let len = req
            .name
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(req.name.len());
        let name = String::from_utf8_lossy(&req.name[..len]).into_owned();
        if offload {
            let features = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6;
            // SAFETY: TUNSETOFFLOAD takes an unsigned int by value.
            let rc = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETOFFLOAD as _, features) };
            if rc < 0 {
                // The device keeps its vnet header; the kernel just never sends bursts.
                tracing::warn!(
                    "TUN offloads unavailable ({}); using plain packets",
                    io::Error::last_os_error()
                );
            }
        }
        Ok(Tun {
            file,
            name,
            vnet: offload,
        })
    }

    /// Whether reads and writes carry a virtio-net header (offloads on).
    pub fn vnet(&self) -> bool {
        self.vnet
    }

    /// Writes the packets `buf[off..off + len]` of `ranges` (coalescing TCP segments when
    /// offloads are on); see [`Coalescer::write`].
    pub fn write_batch(
        &self,
        co: &mut Coalescer,
        buf: &[u8],
        ranges: &[(usize, usize)],
    ) -> io::Result<WriteStats> {
        co.write(self.file.as_raw_fd(), buf, ranges, self.vnet)
    }

    /// The device name the kernel assigned.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The raw descriptor (for poll).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self.file.as_raw_fd()
    }

    /// Reads one packet; `WouldBlock` when none is queued.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: reads at most buf.len() bytes into buf.
        let n = unsafe { libc::read(self.file.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    /// Sets MTU and addresses, brings the device up and routes `routes` through it (except
    /// prefixes already covered by an address's connected route, and default routes, which
    /// would capture the tunnel's own outer traffic).
    pub fn configure(&self, mtu: u16, addresses: &[Cidr], routes: &[Cidr]) -> Result<()> {
        let dev = self.name.as_str();
        ip(&["link", "set", "dev", dev, "mtu", &mtu.to_string()])?;
        for a in addresses {
            ip(&["addr", "add", &a.to_string(), "dev", dev])?;
        }
        ip(&["link", "set", "dev", dev, "up"])?;
        for r in routes {
            let net = r.network();
            if net.prefix == 0 {
                tracing::warn!(
                    "not routing {net} through {dev}: a default route would also capture the tunnel's outer packets; add it with policy routing yourself"
                );
                continue;
            }
            if addresses.iter().any(|a| a.network().covers(&net)) {
                continue;
            }
            ip(&["route", "replace", &net.to_string(), "dev", dev])?;
        }
        Ok(())
    }
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("cannot run `ip` (install iproute2)")?;
    if !out.status.success() {
        bail!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Reads packets from a [`Tun`] and turns each into wire-ready IP packets (cutting TSO bursts
/// into segments), with buffers allocated once.
pub struct TunReader {
    buf: Vec<u8>,
    len: usize,
    pending: bool,
}

impl Default for TunReader {
    fn default() -> Self {
        Self::new()
    }
}

impl TunReader {
    /// A reader able to take the largest burst (64 KiB + header).
    pub fn new() -> Self {
        Self {
            buf: vec![0u8; VNET_HDR_LEN + 65536],
            len: 0,
            pending: false,
        }
    }

    /// Reads one packet without blocking; `Ok(false)` when none is queued.
    pub fn recv(&mut self, tun: &Tun) -> io::Result<bool> {
        if self.pending {
            return Ok(true);
        }
        match tun.recv(&mut self.buf) {
            Ok(n) => {
                self.len = n;
                self.pending = n > if tun.vnet { VNET_HDR_LEN } else { 0 };
                Ok(self.pending)
            }
            Err(e) if crate::sys::would_block(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn split(&mut self, vnet: bool) -> (VnetHdr, &mut [u8]) {
        if vnet {
            let hdr = VnetHdr::parse(&self.buf).unwrap_or_default();
            (hdr, &mut self.buf[VNET_HDR_LEN..self.len])
        } else {
            (VnetHdr::default(), &mut self.buf[..self.len])
        }
    }

    /// How many wire packets the pending packet will give (1 unless it is a TSO burst).
    pub fn segments(&self, tun: &Tun) -> usize {
        if !self.pending || !tun.vnet {
            return 1;
        }
        let Some(hdr) = VnetHdr::parse(&self.buf) else {
            return 1;
        };
        let body = &self.buf[VNET_HDR_LEN..self.len];
        crate::offload::segment_count(&hdr, body)
    }

    /// Emits the pending packet's wire packets to `emit` and clears it.
    pub fn emit(&mut self, tun: &Tun, emit: impl FnMut(&[u8])) -> Result<(), OffloadError> {
        if !self.pending {
            return Ok(());
        }
        self.pending = false;
        let (hdr, body) = self.split(tun.vnet);
        segment(&hdr, body, emit)
    }
}
