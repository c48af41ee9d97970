//! WireGuard over UDP: one thread per direction, buffers allocated once per thread.
//!
//! Sending: one TUN read (a whole TSO burst with offloads) is cut into segments, encrypted
//! into packet slots, and the slots go out with one `sendmmsg` in which runs of equal-sized
//! packets travel as one UDP GSO message (`UDP_SEGMENT`). Receiving: `recvmmsg` with
//! `UDP_GRO`, so a GSO burst from the peer arrives as one buffer; its packets are decrypted
//! and written to the TUN coalesced back into bursts ([`crate::offload::Coalescer`]).

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use boringtun::noise::TunnResult;
use bufscope_policy::{Target, Transport};
use socket2::{Domain, Protocol, Socket, Type};

use crate::config::{BufferPolicy, Settings};
use crate::offload::Coalescer;
use crate::sys::{RawAddr, Shutdown, Wake, wait_readable, would_block};
use crate::tun::{Tun, TunReader};
use crate::wg::{self, Peer, SLOT, Stats};
use crate::{Workers, spawn};

/// Datagrams per `recvmmsg`.
const RX_MSGS: usize = 64;
/// Encrypted packets per `sendmmsg` (enough for a 64 KiB burst of 256-byte segments).
const TX_PACKETS: usize = 256;
/// Decrypted packets per TUN flush.
const RX_PACKETS: usize = 128;
/// Smallest room given to `decapsulate` (a handshake reply it may write instead of a packet).
const MIN_ROOM: usize = 256;
/// `SOL_UDP` options (linux/udp.h).
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;
/// Most segments the kernel takes in one UDP GSO send (`UDP_MAX_SEGMENTS`).
const GSO_MAX_SEGMENTS: usize = 64;
/// Most bytes in one UDP GSO send (IP total length limit, with headers).
const GSO_MAX_BYTES: usize = 65000;

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

/// Creates an outer UDP socket (IPv6 with IPv4-mapped addresses if `v6`, else IPv4), applies
/// the buffer policy before bind, so that `fixed` is the anti-pattern as the Lightway seed describes it,
/// and binds it to `port` on every address. The UDP and QUIC transports' socket.
pub fn bind_outer(
    port: u16,
    v6: bool,
    policy: BufferPolicy,
    transport: Transport,
    target: Option<Target>,
    what: &str,
) -> Result<UdpSocket> {
    let domain = if v6 { Domain::IPV6 } else { Domain::IPV4 };
    let sock = Socket::new(domain, Type::DGRAM.cloexec(), Some(Protocol::UDP))
        .with_context(|| format!("cannot create the {what}"))?;
    if v6 {
        sock.set_only_v6(false).context("IPV6_V6ONLY")?;
    }
    crate::buffers::apply(&sock, policy, transport, target, what)?;
    let addr: SocketAddr = if v6 {
        ([0u16; 8], port).into()
    } else {
        ([0, 0, 0, 0], port).into()
    };
    sock.bind(&addr.into())
        .with_context(|| format!("cannot bind the {what} to {addr}"))?;
    Ok(sock.into())
}

/// Creates the outer UDP socket, applies the buffer policy and starts the two data-path
/// threads and the timer thread.
pub fn start(s: &Settings, tun: Arc<Tun>, peer: Arc<Peer>, shutdown: &Shutdown) -> Result<Workers> {
    let v6 = s.endpoint.is_some_and(|e| e.is_ipv6());
    let port = s.listen_port.unwrap_or(0);
    let sock = bind_outer(
        port,
        v6,
        s.buffer_policy,
        Transport::Udp,
        s.target,
        "outer UDP socket",
    )?;
    let gro = s.offload && set_udp_gro(&sock);
    tracing::info!(
        gso = s.offload,
        gro,
        "listening on udp {}",
        sock.local_addr()
            .map_or_else(|e| e.to_string(), |a| a.to_string())
    );
    let sock = Arc::new(sock);
    let gso = Arc::new(AtomicBool::new(s.offload));

    let mut threads = Vec::new();
    {
        let (tun, peer, sock, sd, gso) = (
            tun.clone(),
            peer.clone(),
            sock.clone(),
            shutdown.clone(),
            gso.clone(),
        );
        let mtu = s.mtu;
        threads.push(spawn("tun-to-udp", move || {
            tun_to_udp(&tun, &peer, &sock, &sd, &gso, mtu)
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

fn set_udp_gro(sock: &UdpSocket) -> bool {
    let one: libc::c_int = 1;
    // SAFETY: passes a valid c_int and its size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_UDP,
            UDP_GRO,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::info!("UDP_GRO unavailable: {}", io::Error::last_os_error());
    }
    rc == 0
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

/// Fixed-size packet slots in one allocation.
struct Packets {
    buf: Vec<u8>,
    slot: usize,
    off: Vec<usize>,
    len: Vec<usize>,
    count: usize,
}

impl Packets {
    fn new(n: usize, slot: usize) -> Self {
        Self {
            buf: vec![0u8; n * slot],
            slot,
            off: vec![0; n],
            len: vec![0; n],
            count: 0,
        }
    }

    fn capacity(&self) -> usize {
        self.off.len()
    }

    fn is_full(&self) -> bool {
        self.count == self.capacity()
    }

    /// The next free slot.
    fn next_slot(&mut self) -> &mut [u8] {
        let i = self.count;
        &mut self.buf[i * self.slot..(i + 1) * self.slot]
    }

    /// Records that the next slot now holds a packet at `off..off + len` within it.
    fn push(&mut self, off: usize, len: usize) {
        self.off[self.count] = off;
        self.len[self.count] = len;
        self.count += 1;
    }

    fn range(&self, i: usize) -> (usize, usize) {
        (i * self.slot + self.off[i], self.len[i])
    }
}

/// `sendmmsg` with UDP GSO: the kernel structures for up to [`TX_PACKETS`] packets.
struct Sender {
    iov: Vec<libc::iovec>,
    hdr: Vec<libc::mmsghdr>,
    ctrl: Vec<[u64; 4]>,
}

impl Sender {
    fn new() -> Self {
        Self {
            iov: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0
                };
                TX_PACKETS
            ],
            // SAFETY: mmsghdr is plain data; zero is an empty message.
            hdr: vec![unsafe { std::mem::zeroed() }; TX_PACKETS],
            ctrl: vec![[0u64; 4]; TX_PACKETS],
        }
    }

    /// Sends every packet of `pkts` to `dest`; with `gso`, runs of equal-sized packets go as
    /// one GSO message each. Returns (sent, dropped). Turns `gso` off if the kernel rejects it.
    fn send(
        &mut self,
        fd: i32,
        pkts: &Packets,
        dest: &RawAddr,
        gso: &AtomicBool,
    ) -> (usize, usize) {
        let use_gso = gso.load(Ordering::Relaxed);
        let base = pkts.buf.as_ptr();
        for i in 0..pkts.count {
            let (o, l) = pkts.range(i);
            self.iov[i] = libc::iovec {
                // SAFETY: o + l is within pkts.buf.
                iov_base: unsafe { base.add(o) }.cast_mut().cast(),
                iov_len: l,
            };
        }
        // Group packets into messages.
        let mut msgs = 0;
        let mut i = 0;
        while i < pkts.count {
            let size = pkts.len[i];
            let mut end = i + 1;
            if use_gso {
                let mut bytes = size;
                while end < pkts.count
                    && end - i < GSO_MAX_SEGMENTS
                    && bytes + pkts.len[end] <= GSO_MAX_BYTES
                    && pkts.len[end] <= size
                {
                    bytes += pkts.len[end];
                    end += 1;
                    // Only the last segment may be shorter.
                    if pkts.len[end - 1] < size {
                        break;
                    }
                }
            }
            let h = &mut self.hdr[msgs];
            h.msg_len = 0;
            h.msg_hdr.msg_name = (&dest.storage as *const libc::sockaddr_storage)
                .cast_mut()
                .cast();
            h.msg_hdr.msg_namelen = dest.len;
            h.msg_hdr.msg_iov = &mut self.iov[i];
            // `as _`: size_t in glibc's msghdr, int in musl's (the static build).
            h.msg_hdr.msg_iovlen = (end - i) as _;
            h.msg_hdr.msg_flags = 0;
            if end - i > 1 {
                let c = &mut self.ctrl[msgs];
                let cmsg_len = cmsg_space(std::mem::size_of::<u16>());
                // SAFETY: c is 32 bytes, 8-aligned: room for one cmsghdr + u16.
                unsafe {
                    let cm = c.as_mut_ptr().cast::<libc::cmsghdr>();
                    (*cm).cmsg_level = libc::SOL_UDP;
                    (*cm).cmsg_type = UDP_SEGMENT;
                    (*cm).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(cm).cast::<u16>(), size as u16);
                }
                h.msg_hdr.msg_control = c.as_mut_ptr().cast();
                h.msg_hdr.msg_controllen = cmsg_len as _;
            } else {
                h.msg_hdr.msg_control = std::ptr::null_mut();
                h.msg_hdr.msg_controllen = 0;
            }
            msgs += 1;
            i = end;
        }
        let (mut sent, mut dropped) = (0, 0);
        let mut next = 0;
        while next < msgs {
            // SAFETY: hdr[next..msgs] describe live buffers; dest outlives the call.
            let rc = unsafe {
                libc::sendmmsg(
                    fd,
                    self.hdr.as_mut_ptr().add(next),
                    (msgs - next) as libc::c_uint,
                    0,
                )
            };
            if rc > 0 {
                for m in &self.hdr[next..next + rc as usize] {
                    let segs: usize = m.msg_hdr.msg_iovlen as _;
                    sent += segs;
                }
                next += rc as usize;
                continue;
            }
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            let segs: usize = self.hdr[next].msg_hdr.msg_iovlen as _;
            if segs > 1
                && matches!(
                    e.raw_os_error(),
                    Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT)
                )
            {
                // The path cannot do UDP GSO: send this message's packets one by one from now on.
                tracing::info!("UDP GSO refused ({e}); sending packets one by one");
                gso.store(false, Ordering::Relaxed);
                let h = &mut self.hdr[next];
                let first = h.msg_hdr.msg_iov;
                for k in 0..segs {
                    // SAFETY: single-packet messages over the same iovecs.
                    let rc = unsafe {
                        let mut one: libc::msghdr = std::mem::zeroed();
                        one.msg_name = h.msg_hdr.msg_name;
                        one.msg_namelen = h.msg_hdr.msg_namelen;
                        one.msg_iov = first.add(k);
                        one.msg_iovlen = 1;
                        libc::sendmsg(fd, &one, 0)
                    };
                    if rc >= 0 {
                        sent += 1;
                    } else {
                        dropped += 1;
                    }
                }
            } else {
                tracing::debug!("sendmmsg: {e}");
                dropped += segs;
            }
            next += 1;
        }
        (sent, dropped)
    }
}

fn cmsg_space(len: usize) -> usize {
    // SAFETY: pure arithmetic macro.
    unsafe { libc::CMSG_SPACE(len as u32) as usize }
}

/// TUN → (segment) → encrypt → UDP (GSO).
fn tun_to_udp(
    tun: &Tun,
    peer: &Peer,
    sock: &UdpSocket,
    shutdown: &Shutdown,
    gso: &AtomicBool,
    mtu: u16,
) -> Result<()> {
    let mut reader = TunReader::new();
    // Segments are at most the MTU, plus WireGuard's 32 bytes (and at least a handshake).
    let mut out = Packets::new(TX_PACKETS, (usize::from(mtu) + 64).max(256));
    let max_packet = out.slot - 32;
    let mut sender = Sender::new();
    let fd = sock.as_raw_fd();
    loop {
        // Read and encrypt until the TUN is empty or the slots are full.
        loop {
            if !reader.recv(tun).context("reading from the TUN device")? {
                break;
            }
            let segs = reader.segments(tun);
            if out.count + segs > out.capacity() {
                if out.count > 0 {
                    break; // flush first; the packet stays pending
                }
                tracing::debug!("dropping a burst of {segs} segments (more than {TX_PACKETS})");
                reader.emit(tun, |_| {}).ok();
                Stats::add(&peer.stats.send_dropped, segs as u64);
                continue;
            }
            Stats::add(&peer.stats.tun_in, 1);
            wg::encrypt_read(peer, tun, &mut reader, |tunn, packet| {
                if packet.len() > max_packet {
                    // The device MTU was raised behind our back.
                    Stats::add(&peer.stats.send_dropped, 1);
                    return;
                }
                let slot = out.next_slot();
                let base = slot.as_ptr() as usize;
                if let Some(p) = wg::encapsulate(peer, tunn, packet, slot) {
                    let (off, len) = (p.as_ptr() as usize - base, p.len());
                    out.push(off, len);
                }
            });
            if out.is_full() {
                break;
            }
        }
        if out.count > 0 {
            match peer.endpoint() {
                Some(ep) => {
                    let (sent, dropped) = sender.send(fd, &out, &RawAddr::from_std(ep), gso);
                    Stats::add(&peer.stats.net_out, sent as u64);
                    Stats::add(&peer.stats.send_dropped, dropped as u64);
                }
                None => Stats::add(&peer.stats.send_dropped, out.count as u64),
            }
            out.count = 0;
            continue;
        }
        if wait_readable(tun.raw_fd(), None, shutdown, None)? == Wake::Shutdown {
            return Ok(());
        }
    }
}

/// `recvmmsg` with `UDP_GRO` control messages.
struct Receiver {
    buf: Vec<u8>,
    len: [usize; RX_MSGS],
    seg: [usize; RX_MSGS],
    addr: [RawAddr; RX_MSGS],
    iov: [libc::iovec; RX_MSGS],
    hdr: [libc::mmsghdr; RX_MSGS],
    ctrl: [[u64; 8]; RX_MSGS],
}

impl Receiver {
    fn new() -> Box<Self> {
        Box::new(Self {
            buf: vec![0u8; RX_MSGS * SLOT],
            len: [0; RX_MSGS],
            seg: [0; RX_MSGS],
            addr: [RawAddr::empty(); RX_MSGS],
            iov: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; RX_MSGS],
            // SAFETY: plain data; zero is an empty message.
            hdr: unsafe { std::mem::zeroed() },
            ctrl: [[0u64; 8]; RX_MSGS],
        })
    }

    /// `recvmmsg(MSG_DONTWAIT)`; returns how many messages (datagrams or GRO bundles) arrived.
    fn recv(&mut self, fd: i32) -> io::Result<usize> {
        let base = self.buf.as_mut_ptr();
        for i in 0..RX_MSGS {
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
            h.msg_hdr.msg_control = self.ctrl[i].as_mut_ptr().cast();
            h.msg_hdr.msg_controllen = std::mem::size_of::<[u64; 8]>() as _;
            h.msg_hdr.msg_flags = 0;
        }
        // SAFETY: hdr describes RX_MSGS valid buffers owned by self.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                self.hdr.as_mut_ptr(),
                RX_MSGS as libc::c_uint,
                // `as _`: int flags in glibc's recvmmsg, unsigned in musl's.
                libc::MSG_DONTWAIT as _,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        for i in 0..n {
            self.len[i] = self.hdr[i].msg_len as usize;
            self.addr[i].len = self.hdr[i].msg_hdr.msg_namelen;
            self.seg[i] = self.len[i];
            // SAFETY: walks the control buffer the kernel filled, within msg_controllen.
            unsafe {
                let mh = &self.hdr[i].msg_hdr;
                let mut cm = libc::CMSG_FIRSTHDR(mh);
                while !cm.is_null() {
                    if (*cm).cmsg_level == libc::SOL_UDP && (*cm).cmsg_type == UDP_GRO {
                        let size =
                            std::ptr::read_unaligned(libc::CMSG_DATA(cm).cast::<libc::c_int>());
                        if size > 0 {
                            self.seg[i] = size as usize;
                        }
                    }
                    cm = libc::CMSG_NXTHDR(mh, cm);
                }
            }
        }
        Ok(n)
    }

    /// Message `i`'s WireGuard packets (one, or a GRO bundle's segments).
    fn packets(&self, i: usize) -> std::slice::Chunks<'_, u8> {
        self.buf[i * SLOT..i * SLOT + self.len[i]].chunks(self.seg[i].max(1))
    }
}

/// UDP (GRO) → decrypt → TUN (coalesced).
fn udp_to_tun(tun: &Tun, peer: &Peer, sock: &UdpSocket, shutdown: &Shutdown) -> Result<()> {
    let mut rx = Receiver::new();
    let mut out = Packed::new();
    let mut co = Coalescer::new();
    let mut scratch = vec![0u8; SLOT];
    let fd = sock.as_raw_fd();
    loop {
        let n = match rx.recv(fd) {
            Ok(n) if n > 0 => n,
            Ok(_) => continue,
            Err(e) if would_block(&e) => {
                if wait_readable(fd, None, shutdown, None)? == Wake::Shutdown {
                    return Ok(());
                }
                continue;
            }
            Err(e) => {
                // ICMP errors can surface here (ECONNREFUSED); not fatal.
                tracing::debug!("recvmmsg: {e}");
                continue;
            }
        };
        let mut authenticated_from = None;
        for m in 0..n {
            let from = rx.addr[m].socket_addr();
            for datagram in rx.packets(m) {
                Stats::add(&peer.stats.net_in, 1);
                // Room for what the datagram can decrypt to (or a handshake reply).
                let room = datagram.len().max(MIN_ROOM);
                if !out.has_room(room) {
                    flush(tun, &mut co, &mut out, peer, shutdown)?;
                }
                // The noise state is locked per packet (see `wg::encrypt_read`): the sending
                // thread encrypts the inner flow's ACKs (or data) in between.
                let mut t = peer.tunn();
                let slot = out.room(room);
                let base = slot.as_ptr() as usize;
                match t.decapsulate(from.map(|a| a.ip()), datagram, slot) {
                    TunnResult::WriteToTunnelV4(p, src) if peer.allowed.contains(src.into()) => {
                        let (off, len) = (p.as_ptr() as usize - base, p.len());
                        out.push(off, len);
                        authenticated_from = from;
                    }
                    TunnResult::WriteToTunnelV6(p, src) if peer.allowed.contains(src.into()) => {
                        let (off, len) = (p.as_ptr() as usize - base, p.len());
                        out.push(off, len);
                        authenticated_from = from;
                    }
                    TunnResult::WriteToTunnelV4(..) | TunnResult::WriteToTunnelV6(..) => {
                        Stats::add(&peer.stats.not_allowed, 1)
                    }
                    TunnResult::WriteToNetwork(p) => {
                        // Handshake response, cookie, or keepalive after a completed handshake;
                        // then flush packets boringtun queued while there was no session.
                        if let Some(to) = from {
                            // A response (type 2: we authenticated its initiation) or a
                            // keepalive (4: we authenticated its response) proves the peer is
                            // at `to`; a cookie reply (3, sent under load) does not.
                            if matches!(p.first(), Some(2 | 4)) {
                                authenticated_from = Some(to);
                            }
                            send_to(sock, p, to, peer);
                            while let TunnResult::WriteToNetwork(q) =
                                t.decapsulate(None, &[], &mut scratch)
                            {
                                send_to(sock, q, to, peer);
                            }
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
        flush(tun, &mut co, &mut out, peer, shutdown)?;
    }
}

/// Writes the decrypted packets to the TUN (coalescing) and empties `out`.
fn flush(
    tun: &Tun,
    co: &mut Coalescer,
    out: &mut Packed,
    peer: &Peer,
    shutdown: &Shutdown,
) -> Result<()> {
    if out.ranges.is_empty() {
        return Ok(());
    }
    let r = tun.write_batch(co, &out.buf, &out.ranges);
    out.clear();
    match r {
        Ok(st) => {
            Stats::add(&peer.stats.tun_out, st.packets);
            Stats::add(&peer.stats.send_dropped, st.dropped);
            Ok(())
        }
        Err(_) if shutdown.is_triggered() => Ok(()),
        Err(e) => Err(e).context("writing to the TUN device"),
    }
}

/// Decrypted packets packed one after another (64-byte aligned) in one buffer of a few hundred
/// KiB. One [`SLOT`] per packet, as on the sending side, would put each 1.4 KB packet 64 KiB
/// from the next: a batch then spans 8 MiB, every packet on its own pages and, with a stride
/// of a power of two that large, in the same few cache sets, which evict each other between
/// decryption and the TUN write.
struct Packed {
    buf: Vec<u8>,
    pos: usize,
    ranges: Vec<(usize, usize)>,
}

impl Packed {
    fn new() -> Self {
        Self {
            // Room for a full batch of MTU-sized packets, and always for one of the largest.
            buf: vec![0u8; RX_PACKETS * 1536 + SLOT],
            pos: 0,
            ranges: Vec::with_capacity(RX_PACKETS),
        }
    }

    /// Whether a packet of up to `len` bytes fits (and the batch is not full).
    fn has_room(&self, len: usize) -> bool {
        self.ranges.len() < RX_PACKETS && self.pos + len <= self.buf.len()
    }

    /// `len` bytes at the current position (check [`Packed::has_room`] first; an empty batch
    /// always has room for [`SLOT`] bytes).
    fn room(&mut self, len: usize) -> &mut [u8] {
        let end = (self.pos + len).min(self.buf.len());
        &mut self.buf[self.pos..end]
    }

    /// Records that the room now holds a packet at `off..off + len` within it.
    fn push(&mut self, off: usize, len: usize) {
        let at = self.pos + off;
        self.ranges.push((at, len));
        self.pos = (at + len).next_multiple_of(64);
    }

    fn clear(&mut self) {
        self.pos = 0;
        self.ranges.clear();
    }
}

fn send_to(sock: &UdpSocket, p: &[u8], to: SocketAddr, peer: &Peer) {
    match sock.send_to(p, to) {
        Ok(_) => Stats::add(&peer.stats.net_out, 1),
        Err(e) => tracing::debug!("sending to {to}: {e}"),
    }
}
