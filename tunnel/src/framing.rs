//! The byte-stream framing the TCP transport and QUIC stream mode share: each WireGuard packet
//! behind a 2-byte big-endian length, the writer's control queue, and the reader's buffer
//! management.

use std::collections::VecDeque;
use std::io;
use std::sync::Mutex;

use anyhow::{Context as _, Result};

use crate::sys::EventFd;
use crate::tun::TunReader;
use crate::wg::{self, Ends, Stats};

/// Largest frame: the 2-byte length field.
pub const MAX_FRAME: usize = u16::MAX as usize;

/// Room one encrypted segment needs in a write buffer: length prefix and MTU + 32, or a
/// handshake (148 bytes).
pub fn frame_room(mtu: u16) -> usize {
    2 + (usize::from(mtu) + 32).max(148)
}

/// Handshake/keepalive packets waiting for the stream writer, at most.
const MAX_CONTROL: usize = 64;

/// The stream writer's control queue: WireGuard handshakes and keepalives from the timers and
/// the reader, framed ahead of the TUN's packets, and the eventfd that wakes the writer.
pub struct Control {
    queue: Mutex<VecDeque<Vec<u8>>>,
    /// Wakes the writer: a packet was queued, or there is a new connection to write to.
    pub ready: EventFd,
}

impl Control {
    /// An empty queue.
    pub fn new() -> io::Result<Self> {
        Ok(Self {
            queue: Mutex::new(VecDeque::new()),
            ready: EventFd::new()?,
        })
    }

    /// Queues a packet (dropped when [`MAX_CONTROL`] are waiting) and wakes the writer.
    pub fn push(&self, p: &[u8]) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() < MAX_CONTROL {
            q.push_back(p.to_vec());
        }
        drop(q);
        self.ready.notify();
    }
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

/// A stream writer's framing state: the TUN reader (a packet that did not fit stays pending
/// there) and the buffer frames are built in.
pub struct Writer {
    reader: TunReader,
    buf: Vec<u8>,
    frame_room: usize,
    limit: usize,
}

impl Writer {
    /// For inner packets up to `mtu`, in a buffer of `buf_len` bytes; a [`Writer::fill`]
    /// stops taking packets from the TUN once `limit` bytes are framed.
    pub fn new(mtu: u16, buf_len: usize, limit: usize) -> Self {
        Self {
            reader: TunReader::new(),
            buf: vec![0u8; buf_len],
            frame_room: frame_room(mtu),
            limit,
        }
    }

    /// Clears `control`'s wake-up and frames the packets queued there (all taken, those that
    /// do not fit dropped), then encrypts and frames what the TUN has, while fewer than the
    /// limit's bytes are framed and the next packet's segments fit the buffer (a frame room
    /// each). A packet that does not fit stays pending for the next call, unless the buffer is
    /// empty: then it is dropped. The frames are [`Writer::framed`].
    pub fn fill(&mut self, ends: &Ends, control: &Control) -> Result<Filled> {
        let (tun, peer) = (&*ends.tun, &*ends.peer);
        let (reader, wbuf, frame_room) = (&mut self.reader, &mut self.buf[..], self.frame_room);
        let mut pos = 0;
        let mut frames = 0u64;
        control.ready.drain();
        {
            let mut q = control.queue.lock().unwrap_or_else(|e| e.into_inner());
            for p in q.drain(..) {
                if p.len() <= MAX_FRAME && pos + 2 + p.len() <= wbuf.len() {
                    wbuf[pos..pos + 2].copy_from_slice(&(p.len() as u16).to_be_bytes());
                    wbuf[pos + 2..pos + 2 + p.len()].copy_from_slice(&p);
                    pos += 2 + p.len();
                    frames += 1;
                }
            }
        }
        let mut read_any = false;
        while pos < self.limit && reader.recv(tun).context("reading from the TUN device")? {
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

    /// The frames the last [`Writer::fill`] built.
    pub fn framed(&self, f: &Filled) -> &[u8] {
        &self.buf[..f.len]
    }
}

/// The next whole frame in `rbuf[*start..filled]`, advancing `start` past it; `None` until
/// it has arrived completely. A zero length is a protocol error.
pub fn next_frame<'a>(
    rbuf: &'a [u8],
    start: &mut usize,
    filled: usize,
) -> Result<Option<&'a [u8]>> {
    if filled - *start < 2 {
        return Ok(None);
    }
    let len = usize::from(u16::from_be_bytes([rbuf[*start], rbuf[*start + 1]]));
    if len == 0 {
        anyhow::bail!("protocol error: empty frame");
    }
    if filled - *start < 2 + len {
        return Ok(None);
    }
    let frame = &rbuf[*start + 2..*start + 2 + len];
    *start += 2 + len;
    Ok(Some(frame))
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn next_frame_takes_whole_frames_only() {
        let mut buf = vec![0, 3, b'a', b'b', b'c', 0, 5, b'x'];
        let filled = buf.len();
        let mut start = 0;
        assert_eq!(
            next_frame(&buf, &mut start, filled).unwrap(),
            Some(&b"abc"[..])
        );
        assert_eq!(start, 5);
        // 3 of the second frame's 7 bytes: not yet.
        assert_eq!(next_frame(&buf, &mut start, filled).unwrap(), None);
        assert_eq!(start, 5);
        buf[5..7].copy_from_slice(&[0, 0]);
        assert!(next_frame(&buf, &mut start, filled).is_err());
    }

    #[test]
    fn compact_rewinds_or_moves_the_partial_frame() {
        let mut rbuf = vec![0u8; 2 * (2 + MAX_FRAME)];
        let (mut start, mut filled) = (10, 10);
        compact(&mut rbuf, &mut start, &mut filled);
        assert_eq!((start, filled), (0, 0));
        // Room behind the partial frame for a whole one: left in place.
        let (mut start, mut filled) = (10, 12);
        compact(&mut rbuf, &mut start, &mut filled);
        assert_eq!((start, filled), (10, 12));
        // No room: moved to the front.
        let end = rbuf.len() - 3;
        rbuf[end - 2..end].copy_from_slice(&[7, 9]);
        let (mut start, mut filled) = (end - 2, end);
        compact(&mut rbuf, &mut start, &mut filled);
        assert_eq!((start, filled), (0, 2));
        assert_eq!(&rbuf[..2], &[7, 9]);
    }
}
