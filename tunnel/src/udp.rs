//! WireGuard over UDP: one thread per direction, batched with `recvmmsg`/`sendmmsg`, buffers
//! allocated once per thread.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{Context, Result, bail};
use boringtun::noise::TunnResult;
use bufscope_policy::Transport;
use socket2::{Domain, Protocol, Socket, Type};

use crate::config::Settings;
use crate::net::packet_dst;
use crate::sys::{RawAddr, Shutdown, Wake, wait_readable, would_block};
use crate::tun::Tun;
use crate::wg::{self, Peer, SLOT, Stats};

/// Packets per `recvmmsg`/`sendmmsg` call.
const BATCH: usize = 64;

/// Fails with a clear message when the endpoint has no route (connecting a UDP socket only
/// consults the routing table).
pub fn check_reachable(endpoint: SocketAddr) -> Result<()> {
    let bind: SocketAddr = if endpoint.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        ([0u16; 8], 0).into()
    };
    let probe = UdpSocket::bind(bind).context("cannot create a UDP socket")?;
    probe
        .connect(endpoint)
        .with_context(|| format!("endpoint {endpoint} is unreachable"))?;
    Ok(())
}

/// Creates the outer UDP socket, applies the buffer policy and starts the two data-path
/// threads and the timer thread.
pub fn start(
    s: &Settings,
    tun: Arc<Tun>,
    peer: Arc<Peer>,
    shutdown: &Shutdown,
) -> Result<Vec<JoinHandle<Result<()>>>> {
    let v6 = s.endpoint.is_some_and(|e| e.is_ipv6());
    let domain = if v6 { Domain::IPV6 } else { Domain::IPV4 };
    let sock = Socket::new(domain, Type::DGRAM.cloexec(), Some(Protocol::UDP))
        .context("cannot create the outer UDP socket")?;
    if v6 {
        sock.set_only_v6(false).context("IPV6_V6ONLY")?;
    }
    // Before bind, so that `fixed` is the anti-pattern as issue 5 describes it.
    crate::buffers::apply(
        &sock,
        s.buffer_policy,
        Transport::Udp,
        s.target,
        "outer UDP socket",
    )?;
    let port = s.listen_port.unwrap_or(0);
    let bind: SocketAddr = if v6 {
        ([0u16; 8], port).into()
    } else {
        ([0, 0, 0, 0], port).into()
    };
    sock.bind(&bind.into())
        .with_context(|| format!("cannot bind the outer UDP socket to {bind}"))?;
    let sock: UdpSocket = sock.into();
    tracing::info!(
        "listening on udp {}",
        sock.local_addr()
            .map_or_else(|e| e.to_string(), |a| a.to_string())
    );
    let sock = Arc::new(sock);

    let mut threads = Vec::new();
    {
        let (tun, peer, sock, sd) = (tun.clone(), peer.clone(), sock.clone(), shutdown.clone());
        threads.push(spawn("tun-to-udp", move || {
            tun_to_udp(&tun, &peer, &sock, &sd)
        })?);
    }
    {
        let (tun, peer, sock, sd) = (tun.clone(), peer.clone(), sock.clone(), shutdown.clone());
        threads.push(spawn("udp-to-tun", move || {
            udp_to_tun(&tun, &peer, &sock, &sd)
        })?);
    }
    {
        let (peer, sock, sd) = (peer.clone(), sock.clone(), shutdown.clone());
        threads.push(spawn("timers", move || {
            let send = |p: &[u8]| send_control(&peer, &sock, p);
            wg::initiate(&peer, false, send);
            wg::run_timers(&peer, &sd, send);
            Ok(())
        })?);
    }
    Ok(threads)
}

fn spawn(
    name: &str,
    f: impl FnOnce() -> Result<()> + Send + 'static,
) -> Result<JoinHandle<Result<()>>> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .with_context(|| format!("cannot start thread {name}"))
}

/// Sends a handshake/keepalive packet to the current endpoint, if any.
fn send_control(peer: &Peer, sock: &UdpSocket, p: &[u8]) {
    if let Some(ep) = peer.endpoint() {
        match sock.send_to(p, ep) {
            Ok(_) => Stats::add(&peer.stats.net_out, 1),
            Err(e) => tracing::debug!("sending to {ep}: {e}"),
        }
    }
}

/// A batch of `BATCH` packet slots plus the kernel structures describing them.
struct Slots {
    buf: Vec<u8>,
    off: [usize; BATCH],
    len: [usize; BATCH],
    addr: [RawAddr; BATCH],
    iov: [libc::iovec; BATCH],
    hdr: [libc::mmsghdr; BATCH],
}

impl Slots {
    fn new() -> Box<Self> {
        Box::new(Self {
            buf: vec![0u8; BATCH * SLOT],
            off: [0; BATCH],
            len: [0; BATCH],
            addr: [RawAddr::empty(); BATCH],
            iov: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; BATCH],
            // SAFETY: mmsghdr is plain data; null pointers/zero lengths are valid "empty" values.
            hdr: unsafe { std::mem::zeroed() },
        })
    }

    fn slot(&mut self, i: usize) -> &mut [u8] {
        &mut self.buf[i * SLOT..(i + 1) * SLOT]
    }

    fn packet(&self, i: usize) -> &[u8] {
        let start = i * SLOT + self.off[i];
        &self.buf[start..start + self.len[i]]
    }

    /// `recvmmsg(MSG_DONTWAIT)` into every slot; returns how many datagrams arrived.
    fn recv(&mut self, fd: i32) -> io::Result<usize> {
        let base = self.buf.as_mut_ptr();
        for i in 0..BATCH {
            self.addr[i] = RawAddr::empty();
            self.iov[i] = libc::iovec {
                // SAFETY: i * SLOT < buf.len().
                iov_base: unsafe { base.add(i * SLOT) }.cast(),
                iov_len: SLOT,
            };
            let h = &mut self.hdr[i];
            h.msg_len = 0;
            h.msg_hdr.msg_name = (&mut self.addr[i].storage as *mut libc::sockaddr_storage).cast();
            h.msg_hdr.msg_namelen = self.addr[i].len;
            h.msg_hdr.msg_iov = &mut self.iov[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = std::ptr::null_mut();
            h.msg_hdr.msg_controllen = 0;
            h.msg_hdr.msg_flags = 0;
        }
        // SAFETY: hdr describes BATCH valid buffers and address storages owned by self.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                self.hdr.as_mut_ptr(),
                BATCH as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        for i in 0..n {
            self.off[i] = 0;
            self.len[i] = self.hdr[i].msg_len as usize;
            self.addr[i].len = self.hdr[i].msg_hdr.msg_namelen;
        }
        Ok(n)
    }

    /// `sendmmsg` of packets `0..n` (their `off`/`len`) to `dest`; returns how many were sent
    /// (a packet that fails is skipped and counted by the caller).
    fn send(&mut self, fd: i32, n: usize, dest: &RawAddr) -> usize {
        let base = self.buf.as_mut_ptr();
        for i in 0..n {
            self.iov[i] = libc::iovec {
                // SAFETY: off[i] + len[i] <= SLOT, within slot i.
                iov_base: unsafe { base.add(i * SLOT + self.off[i]) }.cast(),
                iov_len: self.len[i],
            };
            let h = &mut self.hdr[i];
            h.msg_len = 0;
            h.msg_hdr.msg_name = (&dest.storage as *const libc::sockaddr_storage)
                .cast_mut()
                .cast();
            h.msg_hdr.msg_namelen = dest.len;
            h.msg_hdr.msg_iov = &mut self.iov[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = std::ptr::null_mut();
            h.msg_hdr.msg_controllen = 0;
            h.msg_hdr.msg_flags = 0;
        }
        let mut sent = 0;
        let mut next = 0;
        while next < n {
            // SAFETY: hdr[next..n] describe valid buffers; dest outlives the call.
            let rc = unsafe {
                libc::sendmmsg(
                    fd,
                    self.hdr.as_mut_ptr().add(next),
                    (n - next) as libc::c_uint,
                    0,
                )
            };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::debug!("sendmmsg: {e}");
                next += 1; // drop the packet that failed
            } else {
                sent += rc as usize;
                next += rc as usize;
            }
        }
        sent
    }
}

/// TUN → encrypt → UDP.
fn tun_to_udp(tun: &Tun, peer: &Peer, sock: &UdpSocket, shutdown: &Shutdown) -> Result<()> {
    let mut input = Slots::new();
    let mut output = Slots::new();
    let fd = sock.as_raw_fd();
    loop {
        // Gather up to BATCH packets without blocking.
        let mut n = 0;
        while n < BATCH {
            match tun.recv(input.slot(n)) {
                Ok(len) => {
                    input.off[n] = 0;
                    input.len[n] = len;
                    n += 1;
                }
                Err(e) if would_block(&e) => break,
                Err(e) => return Err(e).context("reading from the TUN device"),
            }
        }
        if n == 0 {
            if wait_readable(tun.raw_fd(), None, shutdown, None)? == Wake::Shutdown {
                return Ok(());
            }
            continue;
        }
        Stats::add(&peer.stats.tun_in, n as u64);
        let Some(endpoint) = peer.endpoint() else {
            Stats::add(&peer.stats.send_dropped, n as u64);
            continue;
        };
        let mut k = 0;
        {
            let mut tunn = peer.tunn();
            for i in 0..n {
                let packet = input.packet(i);
                if !packet_dst(packet).is_some_and(|d| peer.allowed.contains(d)) {
                    Stats::add(&peer.stats.not_allowed, 1);
                    continue;
                }
                let slot = output.slot(k);
                let base = slot.as_ptr() as usize;
                match tunn.encapsulate(packet, slot) {
                    TunnResult::WriteToNetwork(p) => {
                        let (off, len) = (p.as_ptr() as usize - base, p.len());
                        output.off[k] = off;
                        output.len[k] = len;
                        k += 1;
                    }
                    TunnResult::Err(e) => tracing::debug!("encapsulate: {e:?}"),
                    _ => {}
                }
            }
        }
        if k > 0 {
            let sent = output.send(fd, k, &RawAddr::from_std(endpoint));
            Stats::add(&peer.stats.net_out, sent as u64);
            Stats::add(&peer.stats.send_dropped, (k - sent) as u64);
        }
        if shutdown.is_triggered() {
            return Ok(());
        }
    }
}

/// UDP → decrypt → TUN.
fn udp_to_tun(tun: &Tun, peer: &Peer, sock: &UdpSocket, shutdown: &Shutdown) -> Result<()> {
    let mut input = Slots::new();
    let mut output = Slots::new();
    let mut scratch = vec![0u8; SLOT];
    let mut ready = [0usize; BATCH];
    let fd = sock.as_raw_fd();
    loop {
        let n = match input.recv(fd) {
            Ok(n) if n > 0 => n,
            Ok(_) => continue,
            Err(e) if would_block(&e) => {
                if wait_readable(fd, None, shutdown, None)? == Wake::Shutdown {
                    return Ok(());
                }
                continue;
            }
            Err(e) => {
                // ICMP errors surface here on some kernels (ECONNREFUSED); not fatal.
                tracing::debug!("recvmmsg: {e}");
                continue;
            }
        };
        Stats::add(&peer.stats.net_in, n as u64);
        let mut k = 0;
        let mut authenticated_from = None;
        {
            let mut tunn = peer.tunn();
            for i in 0..n {
                let from = input.addr[i].socket_addr();
                let datagram = input.packet(i);
                let slot = output.slot(i);
                let base = slot.as_ptr() as usize;
                match tunn.decapsulate(from.map(|a| a.ip()), datagram, slot) {
                    TunnResult::WriteToTunnelV4(p, src) => {
                        if peer.allowed.contains(src.into()) {
                            let (off, len) = (p.as_ptr() as usize - base, p.len());
                            output.off[i] = off;
                            output.len[i] = len;
                            ready[k] = i;
                            k += 1;
                            authenticated_from = from;
                        } else {
                            Stats::add(&peer.stats.not_allowed, 1);
                        }
                    }
                    TunnResult::WriteToTunnelV6(p, src) => {
                        if peer.allowed.contains(src.into()) {
                            let (off, len) = (p.as_ptr() as usize - base, p.len());
                            output.off[i] = off;
                            output.len[i] = len;
                            ready[k] = i;
                            k += 1;
                            authenticated_from = from;
                        } else {
                            Stats::add(&peer.stats.not_allowed, 1);
                        }
                    }
                    TunnResult::WriteToNetwork(p) => {
                        // Handshake response, cookie, or keepalive after a completed handshake;
                        // then flush packets boringtun queued while there was no session.
                        if let Some(to) = from {
                            send_to(sock, p, to, peer);
                            while let TunnResult::WriteToNetwork(q) =
                                tunn.decapsulate(None, &[], &mut scratch)
                            {
                                send_to(sock, q, to, peer);
                            }
                            authenticated_from = Some(to);
                        }
                    }
                    TunnResult::Err(e) => {
                        Stats::add(&peer.stats.decap_errors, 1);
                        wg::log_decap_error(&e, from);
                    }
                    TunnResult::Done => {}
                }
            }
        }
        if let Some(a) = authenticated_from {
            peer.set_endpoint(a);
        }
        for &i in &ready[..k] {
            match tun.send(output.packet(i)) {
                Ok(_) => Stats::add(&peer.stats.tun_out, 1),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    tracing::debug!("TUN rejected a packet: {e}")
                }
                Err(e) if would_block(&e) || e.raw_os_error() == Some(libc::ENOBUFS) => {
                    Stats::add(&peer.stats.send_dropped, 1)
                }
                Err(e) => {
                    if shutdown.is_triggered() {
                        return Ok(());
                    }
                    bail!("writing to the TUN device: {e}");
                }
            }
        }
    }
}

fn send_to(sock: &UdpSocket, p: &[u8], to: SocketAddr, peer: &Peer) {
    match sock.send_to(p, to) {
        Ok(_) => Stats::add(&peer.stats.net_out, 1),
        Err(e) => tracing::debug!("sending to {to}: {e}"),
    }
}
