//! The byte-stream framing the TCP transport and QUIC stream mode share: each WireGuard packet
//! behind a 2-byte big-endian length.

use anyhow::{Context as _, Result};

use crate::tun::{Tun, TunReader};
use crate::wg::{self, Peer, Stats};

/// Largest frame: the 2-byte length field.
pub const MAX_FRAME: usize = u16::MAX as usize;

/// Room one encrypted segment needs in a write buffer: length prefix and MTU + 32, or a
/// handshake (148 bytes).
pub fn frame_room(mtu: u16) -> usize {
    2 + (usize::from(mtu) + 32).max(148)
}

/// What [`fill`] put into the write buffer.
pub struct Filled {
    /// Bytes of frames, from the start of the buffer.
    pub len: usize,
    /// WireGuard packets in them.
    pub frames: u64,
    /// Whether anything was read from the TUN (even if nothing of it was framed).
    pub read_any: bool,
}

/// Frames the queued `control` packets (handshakes, keepalives; drained), then encrypts and
/// frames what the TUN has, while fewer than `limit` bytes are framed and the next packet's
/// segments fit `wbuf` (`frame_room` each). A packet that does not fit stays pending in
/// `reader` for the next call, unless the buffer is empty: then it is dropped.
pub fn fill(
    tun: &Tun,
    reader: &mut TunReader,
    peer: &Peer,
    control: &mut Vec<Vec<u8>>,
    wbuf: &mut [u8],
    frame_room: usize,
    limit: usize,
) -> Result<Filled> {
    let mut pos = 0;
    let mut frames = 0u64;
    for p in control.drain(..) {
        if p.len() <= MAX_FRAME && pos + 2 + p.len() <= wbuf.len() {
            wbuf[pos..pos + 2].copy_from_slice(&(p.len() as u16).to_be_bytes());
            wbuf[pos + 2..pos + 2 + p.len()].copy_from_slice(&p);
            pos += 2 + p.len();
            frames += 1;
        }
    }
    let mut read_any = false;
    while pos < limit && reader.recv(tun).context("reading from the TUN device")? {
        let segs = reader.segments(tun);
        if pos + segs * frame_room > wbuf.len() {
            if pos > 0 {
                break; // send what we have; the packet stays pending
            }
            reader.emit(tun, |_| {}).ok();
            Stats::add(&peer.stats.send_dropped, segs as u64);
            continue;
        }
        read_any = true;
        Stats::add(&peer.stats.tun_in, 1);
        wg::encrypt_read(peer, tun, reader, |tunn, packet| {
            if packet.len() + 32 + 2 > frame_room {
                Stats::add(&peer.stats.send_dropped, 1);
                return;
            }
            let dst = &mut wbuf[pos + 2..pos + frame_room];
            let base = dst.as_ptr() as usize;
            let Some(p) = wg::encapsulate(peer, tunn, packet, dst) else {
                return;
            };
            let (off, len) = (p.as_ptr() as usize - base, p.len());
            if off != 0 {
                wbuf.copy_within(pos + 2 + off..pos + 2 + off + len, pos + 2);
            }
            wbuf[pos..pos + 2].copy_from_slice(&(len as u16).to_be_bytes());
            pos += 2 + len;
            frames += 1;
        });
    }
    Ok(Filled {
        len: pos,
        frames,
        read_any,
    })
}

/// After parsing frames out of `rbuf[start..filled]`: rewinds when all was consumed, and
/// moves the partial frame to the front when a whole frame no longer fits behind it.
pub fn compact(rbuf: &mut [u8], start: &mut usize, filled: &mut usize) {
    if *start == *filled {
        *start = 0;
        *filled = 0;
    } else if rbuf.len() - *filled < 2 + MAX_FRAME {
        rbuf.copy_within(*start..*filled, 0);
        *filled -= *start;
        *start = 0;
    }
}
