//! Segmentation and coalescing offloads across the TUN device (`IFF_VNET_HDR`).
//!
//! With `TUN_F_TSO4|TUN_F_TSO6|TUN_F_CSUM`, the kernel hands the tunnel whole TCP send bursts
//! (up to 64 KiB, one `read`) instead of MTU-sized packets, and accepts coalesced ones back
//! (one `writev`). The per-packet costs that dominate a userspace tunnel (a syscall and a trip
//! through the inner TCP stack per 1.4 KB) then happen once per burst. What goes over the
//! wire is unchanged: [`segment`] cuts bursts into ordinary MTU-sized IP packets (with their
//! checksums) before encryption, and [`Coalescer`] glues decrypted segments of one TCP flow
//! back together for the receiving kernel, as Linux's own GRO would.

use std::io;

/// Size of `struct virtio_net_hdr` (no `num_buffers`), the TUN default.
pub const VNET_HDR_LEN: usize = 10;

// Inner TCP/IP packets: the protocol number and the TCP flags the offloads look at.
const PROTO_TCP: u8 = 6;
const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_ACK: u8 = 0x10;
const TCP_CWR: u8 = 0x80;
/// Largest IP packet (IPv4 total length / IPv6 payload length field).
const MAX_IP: usize = 65535;
/// Longest IP + TCP headers (IPv4 with options 60 + TCP with options 60).
const MAX_HEADERS: usize = 120;
/// Most segments glued into one write.
const MAX_COALESCE: usize = 64;

/// `struct virtio_net_hdr` (legacy layout, native endian as TUN uses by default).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct VnetHdr {
    /// `VIRTIO_NET_HDR_F_*`.
    pub flags: u8,
    /// `VIRTIO_NET_HDR_GSO_*`.
    pub gso_type: u8,
    /// Header length as the kernel reports it (not trusted; recomputed).
    pub hdr_len: u16,
    /// Payload bytes per segment.
    pub gso_size: u16,
    /// Where checksumming starts.
    pub csum_start: u16,
    /// Offset of the checksum field from `csum_start`.
    pub csum_offset: u16,
}

// Values of `VnetHdr::flags` and `VnetHdr::gso_type`.
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the checksum at `csum_start + csum_offset` is partial.
const F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_GSO_*`.
const GSO_NONE: u8 = 0;
const GSO_TCPV4: u8 = 1;
const GSO_TCPV6: u8 = 4;
const GSO_ECN: u8 = 0x80;

impl VnetHdr {
    /// Parses the first [`VNET_HDR_LEN`] bytes.
    pub fn parse(b: &[u8]) -> Option<VnetHdr> {
        let b = b.get(..VNET_HDR_LEN)?;
        let u = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        Some(VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u(2),
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
        })
    }

    /// Writes the header into `b[..VNET_HDR_LEN]`.
    pub fn write(&self, b: &mut [u8; VNET_HDR_LEN]) {
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_ne_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_ne_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_ne_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_ne_bytes());
    }
}

/// One's complement sum of `data` (as big-endian 16-bit words) added to `acc`, unfolded.
pub fn ones_sum(data: &[u8], mut acc: u64) -> u64 {
    let mut it = data.chunks_exact(4);
    for c in &mut it {
        acc += u64::from(u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
    }
    let r = it.remainder();
    let mut tail = [0u8; 4];
    tail[..r.len()].copy_from_slice(r);
    acc + u64::from(u32::from_be_bytes(tail))
}

/// Folds an unfolded sum to 16 bits (not inverted).
pub fn fold(mut acc: u64) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// Sum of the TCP/UDP pseudo-header for `packet` (IPv4 or IPv6, header already valid) with
/// upper-layer length `len`.
fn pseudo_sum(packet: &[u8], proto: u8, len: usize) -> u64 {
    let acc = u64::from(proto) + len as u64;
    if packet[0] >> 4 == 4 {
        ones_sum(&packet[12..20], acc)
    } else {
        ones_sum(&packet[8..40], acc)
    }
}

/// Why a packet from the TUN could not be turned into wire packets.
#[derive(Debug, PartialEq, Eq)]
pub enum OffloadError {
    /// Headers do not parse or do not fit.
    Malformed,
}

/// IP/TCP layout of a TCP packet: (IP header length, TCP header length).
fn tcp_layout(p: &[u8]) -> Option<(usize, usize)> {
    let ip_hlen = match p.first()? >> 4 {
        4 => {
            let ihl = usize::from(p[0] & 0x0f) * 4;
            if ihl < 20 || *p.get(9)? != PROTO_TCP {
                return None;
            }
            ihl
        }
        6 => {
            if *p.get(6)? != PROTO_TCP {
                return None;
            }
            40
        }
        _ => return None,
    };
    let tcp_hlen = usize::from(p.get(ip_hlen + 12)? >> 4) * 4;
    if tcp_hlen < 20 || p.len() < ip_hlen + tcp_hlen {
        return None;
    }
    Some((ip_hlen, tcp_hlen))
}

fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Recomputes an IPv4 header checksum in place.
fn ipv4_header_checksum(p: &mut [u8], ihl: usize) {
    put_u16(p, 10, 0);
    let c = !fold(ones_sum(&p[..ihl], 0));
    put_u16(p, 10, c);
}

/// Turns one packet read from the TUN (`hdr` + `packet`) into wire-ready IP packets, passed to
/// `emit` one by one: a TSO burst is cut into `gso_size` segments with their own IP/TCP headers
/// and checksums; a packet with a partial checksum gets it completed; others pass unchanged.
///
/// A burst is cut in place, with no copy of its payload: segment `i`'s headers are written
/// over the last header-length bytes of segment `i − 1`'s payload, which `emit` has consumed
/// by then, so each segment is contiguous in `packet` right where its payload already lies.
/// `packet` is therefore clobbered.
pub fn segment(
    hdr: &VnetHdr,
    packet: &mut [u8],
    mut emit: impl FnMut(&[u8]),
) -> Result<(), OffloadError> {
    let gso = hdr.gso_type & !GSO_ECN;
    if gso == GSO_NONE {
        if hdr.flags & F_NEEDS_CSUM != 0 {
            complete_checksum(
                packet,
                usize::from(hdr.csum_start),
                usize::from(hdr.csum_offset),
            )?;
        }
        emit(packet);
        return Ok(());
    }
    if gso != GSO_TCPV4 && gso != GSO_TCPV6 {
        return Err(OffloadError::Malformed);
    }
    let (ip_hlen, tcp_hlen) = tcp_layout(packet).ok_or(OffloadError::Malformed)?;
    let hlen = ip_hlen + tcp_hlen;
    let mss = usize::from(hdr.gso_size);
    if mss == 0 {
        return Err(OffloadError::Malformed);
    }
    let payload_len = packet.len() - hlen;
    if payload_len <= mss {
        // Not really a burst: just complete the checksum.
        complete_tcp_checksum(packet, ip_hlen);
        emit(packet);
        return Ok(());
    }
    // The burst's headers, copied before the first segment's are edited in place.
    let mut headers = [0u8; MAX_HEADERS];
    let headers = headers.get_mut(..hlen).ok_or(OffloadError::Malformed)?;
    headers.copy_from_slice(&packet[..hlen]);
    let v4 = packet[0] >> 4 == 4;
    let seq0 = get_u32(packet, ip_hlen + 4);
    let id0 = get_u16(packet, 4);
    let flags0 = packet[ip_hlen + 13];
    let count = payload_len.div_ceil(mss);
    for i in 0..count {
        // Segment i's payload starts at hlen + i·mss, so its headers start at i·mss.
        let start = i * mss;
        let len = hlen + mss.min(payload_len - i * mss);
        let seg = &mut packet[start..start + len];
        if i > 0 {
            seg[..hlen].copy_from_slice(headers);
        }
        if v4 {
            put_u16(seg, 2, len as u16);
            put_u16(seg, 4, id0.wrapping_add(i as u16));
            ipv4_header_checksum(seg, ip_hlen);
        } else {
            put_u16(seg, 4, (len - 40) as u16);
        }
        let seq = seq0.wrapping_add((i * mss) as u32);
        seg[ip_hlen + 4..ip_hlen + 8].copy_from_slice(&seq.to_be_bytes());
        let mut flags = flags0;
        if i + 1 < count {
            flags &= !(TCP_FIN | TCP_PSH);
        }
        if i > 0 {
            flags &= !TCP_CWR;
        }
        seg[ip_hlen + 13] = flags;
        complete_tcp_checksum(seg, ip_hlen);
        emit(seg);
    }
    Ok(())
}

/// How many wire packets [`segment`] makes of `packet`.
pub fn segment_count(hdr: &VnetHdr, packet: &[u8]) -> usize {
    let gso = hdr.gso_type & !GSO_ECN;
    if gso == GSO_NONE || hdr.gso_size == 0 {
        return 1;
    }
    match tcp_layout(packet) {
        Some((ip, tcp)) => (packet.len() - ip - tcp)
            .div_ceil(usize::from(hdr.gso_size))
            .max(1),
        None => 1,
    }
}

/// Computes the full TCP checksum of `p` (IP header at 0, TCP at `ip_hlen`).
fn complete_tcp_checksum(p: &mut [u8], ip_hlen: usize) {
    let tcp_len = p.len() - ip_hlen;
    put_u16(p, ip_hlen + 16, 0);
    let sum = ones_sum(&p[ip_hlen..], pseudo_sum(p, PROTO_TCP, tcp_len));
    let c = !fold(sum);
    put_u16(p, ip_hlen + 16, c);
}

/// Completes a partial checksum (`CHECKSUM_PARTIAL`): the field at `start + offset` holds the
/// pseudo-header sum; the checksum covers `start..`.
fn complete_checksum(p: &mut [u8], start: usize, offset: usize) -> Result<(), OffloadError> {
    let at = start + offset;
    if at + 2 > p.len() || start > p.len() {
        return Err(OffloadError::Malformed);
    }
    let mut c = !fold(ones_sum(&p[start..], 0));
    // UDP: a computed 0 is sent as 0xffff (0 means "no checksum").
    if offset == 6 && c == 0 {
        c = 0xffff;
    }
    put_u16(p, at, c);
    Ok(())
}

/// Writes decrypted packets to the TUN, gluing consecutive segments of one TCP flow into one
/// GSO packet (one `writev`) the receiving kernel treats like a GRO'd burst.
pub struct Coalescer {
    hdr: [u8; VNET_HDR_LEN + 120],
    iov: Vec<libc::iovec>,
}

/// What [`Coalescer::write`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WriteStats {
    /// Packets handed to the kernel.
    pub packets: u64,
    /// `writev` calls (fewer than packets when coalescing).
    pub writes: u64,
    /// Packets the kernel refused (e.g. `ENOBUFS`, `EINVAL`).
    pub dropped: u64,
}

// SAFETY: `iov` is scratch space: every `write` clears it and fills it with pointers into the
// header and the `buf` it borrows for the duration of the call, and nothing reads it between
// calls. No pointer outlives the call, so moving a Coalescer to another thread (the QUIC
// transport's receive task runs on tokio's workers) cannot let one dangle.
unsafe impl Send for Coalescer {}

impl Default for Coalescer {
    fn default() -> Self {
        Self::new()
    }
}

impl Coalescer {
    /// A coalescer with its buffers allocated.
    pub fn new() -> Self {
        Self {
            hdr: [0; VNET_HDR_LEN + 120],
            iov: Vec::with_capacity(MAX_COALESCE + 1),
        }
    }

    /// Writes the packets `buf[off..off + len]` for each `(off, len)` in `ranges`, in order, to
    /// the TUN `fd`. With `vnet` (the TUN has `IFF_VNET_HDR` and offloads), each write carries
    /// a virtio header and consecutive TCP segments are coalesced; without, one plain `write`
    /// per packet. Fatal errors (other than per-packet refusals) are returned.
    pub fn write(
        &mut self,
        fd: i32,
        buf: &[u8],
        ranges: &[(usize, usize)],
        vnet: bool,
    ) -> io::Result<WriteStats> {
        let mut stats = WriteStats::default();
        if !vnet {
            for &(o, l) in ranges {
                let iov = [libc::iovec {
                    iov_base: buf[o..o + l].as_ptr().cast_mut().cast(),
                    iov_len: l,
                }];
                writev(fd, &iov, 1, &mut stats)?;
            }
            return Ok(stats);
        }
        let pkt = |i: usize| -> &[u8] {
            let (o, l) = ranges[i];
            &buf[o..o + l]
        };
        let mut i = 0;
        while i < ranges.len() {
            let first = pkt(i);
            let mut end = i + 1;
            if let Some((ip_hlen, tcp_hlen)) = start_layout(first) {
                let hlen = ip_hlen + tcp_hlen;
                let mss = first.len() - hlen;
                let mut total = first.len();
                let mut next_seq = get_u32(first, ip_hlen + 4).wrapping_add(mss as u32);
                while end < ranges.len() && end - i < MAX_COALESCE {
                    let q = pkt(end);
                    if q.len() <= hlen || q.len() - hlen > mss || total + q.len() - hlen > MAX_IP {
                        break;
                    }
                    if !same_flow(first, q, ip_hlen, hlen) || get_u32(q, ip_hlen + 4) != next_seq {
                        break;
                    }
                    let qflags = q[ip_hlen + 13];
                    if qflags & !(TCP_ACK | TCP_PSH) != 0 || qflags & TCP_ACK == 0 {
                        break;
                    }
                    total += q.len() - hlen;
                    next_seq = next_seq.wrapping_add((q.len() - hlen) as u32);
                    end += 1;
                    if qflags & TCP_PSH != 0 || q.len() - hlen < mss {
                        break;
                    }
                }
                if end - i > 1 {
                    self.write_coalesced(
                        fd,
                        first,
                        ip_hlen,
                        hlen,
                        mss,
                        total,
                        &ranges[i..end],
                        buf,
                        &mut stats,
                    )?;
                    i = end;
                    continue;
                }
            }
            self.write_one(fd, first, &mut stats)?;
            i += 1;
        }
        Ok(stats)
    }

    fn write_one(&mut self, fd: i32, p: &[u8], stats: &mut WriteStats) -> io::Result<()> {
        let hdr = [0u8; VNET_HDR_LEN];
        let iov = [
            libc::iovec {
                iov_base: hdr.as_ptr().cast_mut().cast(),
                iov_len: VNET_HDR_LEN,
            },
            libc::iovec {
                iov_base: p.as_ptr().cast_mut().cast(),
                iov_len: p.len(),
            },
        ];
        writev(fd, &iov, 1, stats)
    }

    #[allow(clippy::too_many_arguments)]
    fn write_coalesced(
        &mut self,
        fd: i32,
        first: &[u8],
        ip_hlen: usize,
        hlen: usize,
        mss: usize,
        total: usize,
        group: &[(usize, usize)],
        buf: &[u8],
        stats: &mut WriteStats,
    ) -> io::Result<()> {
        let v4 = first[0] >> 4 == 4;
        let (vh, h) = self.hdr.split_at_mut(VNET_HDR_LEN);
        let h = &mut h[..hlen];
        h.copy_from_slice(&first[..hlen]);
        if v4 {
            put_u16(h, 2, total as u16);
            ipv4_header_checksum(h, ip_hlen);
        } else {
            put_u16(h, 4, (total - 40) as u16);
        }
        // PSH of the last segment (the only one that may carry it) goes on the burst.
        let (lo, ll) = group[group.len() - 1];
        if ll > ip_hlen + 13 {
            h[ip_hlen + 13] |= buf[lo + ip_hlen + 13] & TCP_PSH;
        }
        // CHECKSUM_PARTIAL: the field holds the folded pseudo-header sum.
        put_u16(h, ip_hlen + 16, 0);
        let tcp_len = total - ip_hlen;
        let psum = if v4 {
            ones_sum(&h[12..20], u64::from(PROTO_TCP) + tcp_len as u64)
        } else {
            ones_sum(&h[8..40], u64::from(PROTO_TCP) + tcp_len as u64)
        };
        put_u16(h, ip_hlen + 16, fold(psum));
        let vnet = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: if v4 { GSO_TCPV4 } else { GSO_TCPV6 },
            hdr_len: hlen as u16,
            gso_size: mss as u16,
            csum_start: ip_hlen as u16,
            csum_offset: 16,
        };
        let mut vb = [0u8; VNET_HDR_LEN];
        vnet.write(&mut vb);
        vh.copy_from_slice(&vb);
        self.iov.clear();
        self.iov.push(libc::iovec {
            iov_base: self.hdr.as_mut_ptr().cast(),
            iov_len: VNET_HDR_LEN + hlen,
        });
        for &(o, l) in group {
            self.iov.push(libc::iovec {
                iov_base: buf[o + hlen..o + l].as_ptr().cast_mut().cast(),
                iov_len: l - hlen,
            });
        }
        writev(fd, &self.iov, group.len() as u64, stats)
    }
}

/// Whether `p` can start a coalesced burst: a plain TCP data segment with only ACK set.
fn start_layout(p: &[u8]) -> Option<(usize, usize)> {
    let (ip_hlen, tcp_hlen) = tcp_layout(p)?;
    if p.len() <= ip_hlen + tcp_hlen || p[ip_hlen + 13] != TCP_ACK {
        return None;
    }
    if p[0] >> 4 == 4 {
        // No IP options, not a fragment.
        if ip_hlen != 20 || get_u16(p, 6) & 0x3fff != 0 || usize::from(get_u16(p, 2)) != p.len() {
            return None;
        }
    } else if usize::from(get_u16(p, 4)) + 40 != p.len() {
        return None;
    }
    Some((ip_hlen, tcp_hlen))
}

/// Whether `q` belongs to the same burst as `p`: same IP header (apart from length, ID and
/// checksum), same ports, ack, window and TCP options.
fn same_flow(p: &[u8], q: &[u8], ip_hlen: usize, hlen: usize) -> bool {
    if q.len() < hlen || q[0] != p[0] {
        return false;
    }
    let ip_same = if p[0] >> 4 == 4 {
        // tos; flags+fragment; ttl+protocol; addresses.
        p[1] == q[1]
            && p[6..10] == q[6..10]
            && p[12..20] == q[12..20]
            && usize::from(get_u16(q, 2)) == q.len()
    } else {
        p[..4] == q[..4]
            && p[6..8] == q[6..8]
            && p[8..40] == q[8..40]
            && usize::from(get_u16(q, 4)) + 40 == q.len()
    };
    let t = ip_hlen;
    ip_same
        // ports
        && p[t..t + 4] == q[t..t + 4]
        // ack number, data offset
        && p[t + 8..t + 13] == q[t + 8..t + 13]
        // window
        && p[t + 14..t + 16] == q[t + 14..t + 16]
        // options
        && p[t + 20..hlen] == q[t + 20..hlen]
}

fn writev(fd: i32, iov: &[libc::iovec], packets: u64, stats: &mut WriteStats) -> io::Result<()> {
    loop {
        // SAFETY: iov describes valid, live buffers.
        let n = unsafe { libc::writev(fd, iov.as_ptr(), iov.len() as libc::c_int) };
        if n >= 0 {
            stats.packets += packets;
            stats.writes += 1;
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN | libc::ENOBUFS | libc::EINVAL | libc::EIO) => {
                tracing::debug!("TUN refused a write: {e}");
                stats.dropped += packets;
                return Ok(());
            }
            _ => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A valid IPv4/TCP packet with `payload` bytes of data, ACK set, timestamps option.
    fn tcp4(seq: u32, payload: &[u8], flags: u8) -> Vec<u8> {
        let mut p = vec![0u8; 20 + 32 + payload.len()];
        p[0] = 0x45;
        let total = p.len() as u16;
        put_u16(&mut p, 2, total);
        put_u16(&mut p, 4, 0x1234);
        put_u16(&mut p, 6, 0x4000); // DF
        p[8] = 64;
        p[9] = PROTO_TCP;
        p[12..16].copy_from_slice(&[10, 0, 0, 1]);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        ipv4_header_checksum(&mut p, 20);
        put_u16(&mut p, 20, 40000);
        put_u16(&mut p, 22, 5201);
        p[24..28].copy_from_slice(&seq.to_be_bytes());
        p[28..32].copy_from_slice(&7u32.to_be_bytes());
        p[32] = 8 << 4; // 32-byte header
        p[33] = flags;
        put_u16(&mut p, 34, 500);
        p[40..52].copy_from_slice(&[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]);
        p[52..].copy_from_slice(payload);
        complete_tcp_checksum(&mut p, 20);
        p
    }

    /// Independent check: a packet's TCP checksum verifies to 0 (i.e. 0xffff before inversion).
    fn tcp_checksum_ok(p: &[u8], ip_hlen: usize) -> bool {
        let len = p.len() - ip_hlen;
        let mut acc = u64::from(PROTO_TCP) + len as u64;
        if p[0] >> 4 == 4 {
            for w in p[12..20].chunks(2) {
                acc += u64::from(u16::from_be_bytes([w[0], w[1]]));
            }
        } else {
            for w in p[8..40].chunks(2) {
                acc += u64::from(u16::from_be_bytes([w[0], w[1]]));
            }
        }
        for w in p[ip_hlen..].chunks(2) {
            acc += u64::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
        }
        fold(acc) == 0xffff
    }

    fn ip4_checksum_ok(p: &[u8]) -> bool {
        fold(ones_sum(&p[..20], 0)) == 0xffff
    }

    #[test]
    fn checksum_of_known_header() {
        // RFC 1071 style example: a real IPv4 header with checksum 0xb861.
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(fold(ones_sum(&h, 0)), 0xffff);
        let mut z = h;
        ipv4_header_checksum(&mut z, 20);
        assert_eq!(z, h);
    }

    #[test]
    fn tso_burst_is_cut_into_valid_segments() {
        let payload: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut burst = tcp4(1000, &payload, TCP_ACK | TCP_PSH);
        // As the kernel hands it over: partial checksum, GSO type TCPv4, mss 1368.
        let hdr = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV4,
            hdr_len: 52,
            gso_size: 1368,
            csum_start: 20,
            csum_offset: 16,
        };
        let mut segs: Vec<Vec<u8>> = Vec::new();
        segment(&hdr, &mut burst, |s| segs.push(s.to_vec())).unwrap();
        assert_eq!(segs.len(), 4); // 1368 * 3 + 896
        let mut data = Vec::new();
        for (i, s) in segs.iter().enumerate() {
            assert!(ip4_checksum_ok(s), "segment {i} IP checksum");
            assert!(tcp_checksum_ok(s, 20), "segment {i} TCP checksum");
            assert_eq!(usize::from(get_u16(s, 2)), s.len());
            assert_eq!(get_u16(s, 4), 0x1234 + i as u16);
            assert_eq!(get_u32(s, 24), 1000 + (i * 1368) as u32);
            let last = i == segs.len() - 1;
            assert_eq!(s[33] & TCP_PSH != 0, last, "PSH only on the last");
            data.extend_from_slice(&s[52..]);
        }
        assert_eq!(data, payload);
    }

    #[test]
    fn partial_checksum_is_completed() {
        let mut p = tcp4(1, b"hello world", TCP_ACK);
        // Replace the full checksum by the pseudo-header sum, as CHECKSUM_PARTIAL does.
        let psum = fold(pseudo_sum(&p, PROTO_TCP, p.len() - 20));
        put_u16(&mut p, 36, psum);
        assert!(!tcp_checksum_ok(&p, 20));
        let hdr = VnetHdr {
            flags: F_NEEDS_CSUM,
            csum_start: 20,
            csum_offset: 16,
            ..VnetHdr::default()
        };
        let mut out = Vec::new();
        segment(&hdr, &mut p, |s| out.push(s.to_vec())).unwrap();
        assert_eq!(out.len(), 1);
        assert!(tcp_checksum_ok(&out[0], 20));
    }

    #[test]
    fn vnet_header_round_trips() {
        let h = VnetHdr {
            flags: 1,
            gso_type: 4,
            hdr_len: 74,
            gso_size: 1348,
            csum_start: 40,
            csum_offset: 16,
        };
        let mut b = [0u8; VNET_HDR_LEN];
        h.write(&mut b);
        assert_eq!(VnetHdr::parse(&b), Some(h));
        assert_eq!(VnetHdr::parse(&b[..5]), None);
    }

    #[test]
    fn malformed_bursts_are_rejected_not_panicking() {
        let hdr = VnetHdr {
            gso_type: GSO_TCPV4,
            gso_size: 100,
            ..VnetHdr::default()
        };
        for mut junk in [vec![], vec![0x45], vec![0x45; 30], vec![0x60; 50]] {
            assert_eq!(
                segment(&hdr, &mut junk, |_| {}),
                Err(OffloadError::Malformed)
            );
        }
        let hdr = VnetHdr {
            flags: F_NEEDS_CSUM,
            csum_start: 100,
            csum_offset: 16,
            ..VnetHdr::default()
        };
        assert_eq!(
            segment(&hdr, &mut [0x45; 30], |_| {}),
            Err(OffloadError::Malformed)
        );
    }

    /// Coalescing, checked through a pipe standing in for the TUN: what is written is one
    /// vnet header + one burst whose headers describe exactly the segments' payloads.
    #[test]
    fn consecutive_segments_coalesce_into_one_write() {
        let a = tcp4(100, &[1u8; 1000], TCP_ACK);
        let b = tcp4(1100, &[2u8; 1000], TCP_ACK);
        let c = tcp4(2100, &[3u8; 500], TCP_ACK | TCP_PSH);
        let other = tcp4(9999, &[4u8; 1000], TCP_ACK); // not contiguous: written alone
        let mut buf = Vec::new();
        let mut ranges = Vec::new();
        for p in [&a, &b, &c, &other] {
            ranges.push((buf.len(), p.len()));
            buf.extend_from_slice(p);
        }
        let mut fds = [0i32; 2];
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let mut co = Coalescer::new();
        let st = co.write(fds[1], &buf, &ranges, true).unwrap();
        assert_eq!(
            st,
            WriteStats {
                packets: 4,
                writes: 2,
                dropped: 0
            }
        );
        let mut out = vec![0u8; 16384];
        let n = unsafe { libc::read(fds[0], out.as_mut_ptr().cast(), out.len()) } as usize;
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        let burst_len = VNET_HDR_LEN + 52 + 2500;
        assert_eq!(n, burst_len + VNET_HDR_LEN + other.len());
        let h = VnetHdr::parse(&out).unwrap();
        assert_eq!(
            (h.flags, h.gso_type, h.gso_size, h.csum_start, h.csum_offset),
            (1, GSO_TCPV4, 1000, 20, 16)
        );
        let burst = &out[VNET_HDR_LEN..burst_len];
        assert_eq!(usize::from(get_u16(burst, 2)), burst.len());
        assert!(ip4_checksum_ok(burst));
        assert_eq!(get_u32(burst, 24), 100);
        assert_ne!(burst[33] & TCP_PSH, 0, "PSH of the last segment kept");
        assert_eq!(&burst[52..1052], &[1u8; 1000][..]);
        assert_eq!(&burst[2052..], &[3u8; 500][..]);
        // Completing the partial checksum gives a valid packet.
        let mut full = burst.to_vec();
        complete_checksum(&mut full, 20, 16).unwrap();
        assert!(tcp_checksum_ok(&full, 20));
        // The lone packet: a zero vnet header, then the packet unchanged.
        assert_eq!(
            &out[burst_len..burst_len + VNET_HDR_LEN],
            &[0u8; VNET_HDR_LEN]
        );
        assert_eq!(&out[burst_len + VNET_HDR_LEN..n], &other[..]);

        // Without a vnet header: one plain write per packet, bytes unchanged.
        let mut fds = [0i32; 2];
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let st = co.write(fds[1], &buf, &ranges, false).unwrap();
        let n = unsafe { libc::read(fds[0], out.as_mut_ptr().cast(), out.len()) } as usize;
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        assert_eq!(st.writes, 4);
        assert_eq!(&out[..n], &buf[..]);
    }
}
