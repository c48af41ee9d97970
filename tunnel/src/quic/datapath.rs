//! The QUIC data path: TUN → encrypt → QUIC on a plain thread, QUIC → decrypt → TUN in a
//! tokio task per connection.

use std::future::Future;
use std::net::IpAddr;
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::task::{Context as TaskContext, Poll, Waker};

use anyhow::{Context as _, Result, bail};
use boringtun::noise::{Tunn, TunnResult};
use bytes::Bytes;
use quinn::SendDatagramError;

use super::{Ctx, Current, Link, streams};
use crate::framing;
use crate::offload::Coalescer;
use crate::sys::{Wake, wait_readable};
use crate::tun::{Tun, TunReader};
use crate::wg::{self, Peer, SLOT, Stats};

/// Packets decrypted per lock of the noise state (and per TUN flush).
const BATCH: usize = 64;
/// Encrypted datagrams handed to quinn per round.
const TX_BATCH: usize = 256;
/// Stream mode: a chunk write that took this long waited for quinn (flow-control credit or
/// room in its send buffer), and is counted as a wait.
const STREAM_WAIT: std::time::Duration = std::time::Duration::from_millis(1);
/// Stream mode: receive buffer (many frames per read).
const READ_BUF: usize = 1 << 20;

/// Polls `f` once; `None` if it is not ready (its registration is dropped with it).
fn now_or_never<F: Future>(f: F) -> Option<F::Output> {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut TaskContext::from_waker(Waker::noop())) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

/// Decrypted packets waiting for one coalesced write to the TUN.
struct Inbound {
    out: Vec<u8>,
    ready: Vec<(usize, usize)>,
    co: Coalescer,
    scratch: Vec<u8>,
    src: Option<IpAddr>,
}

impl Inbound {
    fn new(src: IpAddr) -> Self {
        Self {
            out: vec![0u8; BATCH * SLOT],
            ready: Vec::with_capacity(BATCH),
            co: Coalescer::new(),
            scratch: vec![0u8; SLOT],
            src: Some(src),
        }
    }

    fn is_full(&self) -> bool {
        self.ready.len() >= BATCH
    }

    /// Decrypts one WireGuard packet; replies (handshake responses, keepalives, packets
    /// boringtun queued before the session) go back through `link`.
    fn decrypt(&mut self, tunn: &mut Tunn, peer: &Peer, link: &Link, packet: &[u8]) {
        Stats::add(&peer.stats.net_in, 1);
        let i = self.ready.len();
        let slot = &mut self.out[i * SLOT..(i + 1) * SLOT];
        let base = slot.as_ptr() as usize;
        match tunn.decapsulate(self.src, packet, slot) {
            TunnResult::WriteToTunnelV4(p, src) if peer.allowed.contains(src.into()) => {
                self.ready
                    .push((i * SLOT + p.as_ptr() as usize - base, p.len()));
            }
            TunnResult::WriteToTunnelV6(p, src) if peer.allowed.contains(src.into()) => {
                self.ready
                    .push((i * SLOT + p.as_ptr() as usize - base, p.len()));
            }
            TunnResult::WriteToTunnelV4(..) | TunnResult::WriteToTunnelV6(..) => {
                Stats::add(&peer.stats.not_allowed, 1)
            }
            TunnResult::WriteToNetwork(p) => {
                link.send_control(p, peer);
                while let TunnResult::WriteToNetwork(q) =
                    tunn.decapsulate(None, &[], &mut self.scratch)
                {
                    link.send_control(q, peer);
                }
            }
            TunnResult::Err(e) => {
                Stats::add(&peer.stats.decap_errors, 1);
                wg::log_decap_error(&e, None);
            }
            TunnResult::Done => {}
        }
    }

    /// Writes the decrypted packets to the TUN, coalesced.
    fn flush(&mut self, tun: &Tun, peer: &Peer) -> Result<()> {
        if self.ready.is_empty() {
            return Ok(());
        }
        let r = tun.write_batch(&mut self.co, &self.out, &self.ready);
        self.ready.clear();
        let st = r.context("writing to the TUN device")?;
        Stats::add(&peer.stats.tun_out, st.packets);
        Stats::add(&peer.stats.send_dropped, st.dropped);
        Ok(())
    }
}

/// Datagram mode: QUIC datagrams → decrypt → TUN, until the connection ends.
pub(super) async fn datagrams_to_tun(ctx: &Ctx, cur: &Current) -> Result<()> {
    let mut inb = Inbound::new(cur.conn.remote_address().ip());
    let mut batch: Vec<Bytes> = Vec::with_capacity(BATCH);
    loop {
        let first = tokio::select! {
            d = cur.conn.read_datagram() => d,
            _ = ctx.stopped() => return Ok(()),
        };
        // A closed connection is reported by its manager.
        let Ok(first) = first else { return Ok(()) };
        batch.push(first);
        while batch.len() < BATCH {
            match now_or_never(cur.conn.read_datagram()) {
                Some(Ok(d)) => batch.push(d),
                _ => break,
            }
        }
        cur.counters
            .datagrams_read
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        {
            let mut tunn = ctx.ends.peer.tunn();
            for d in batch.drain(..) {
                inb.decrypt(&mut tunn, &ctx.ends.peer, &ctx.link, &d);
            }
        }
        inb.flush(&ctx.ends.tun, &ctx.ends.peer)?;
    }
}

/// Stream mode: the chunks of the peer's streams, in order, their length-prefixed frames →
/// decrypt → TUN, until the connection ends.
pub(super) async fn stream_to_tun(
    ctx: &Ctx,
    cur: &Current,
    mut rx: streams::Receiver,
) -> Result<()> {
    let mut inb = Inbound::new(cur.conn.remote_address().ip());
    let mut rbuf = vec![0u8; READ_BUF];
    let (mut start, mut filled) = (0usize, 0usize);
    loop {
        let r = tokio::select! {
            r = rx.read(&mut rbuf[filled..]) => r?,
            _ = ctx.stopped() => return Ok(()),
        };
        match r {
            // A closed connection is reported by its manager.
            streams::Read::Gone => return Ok(()),
            streams::Read::End => {
                cur.counters.chunks_read.fetch_add(1, Ordering::Relaxed);
                if start != filled {
                    bail!("protocol error: a chunk of the QUIC stream ended inside a frame");
                }
            }
            streams::Read::Data(n) => {
                filled += n;
                cur.counters
                    .stream_bytes_read
                    .fetch_add(n as u64, Ordering::Relaxed);
                decrypt_frames(ctx, &mut inb, &rbuf, &mut start, filled)?;
                // Keep room for a whole frame at the end of the buffer.
                framing::compact(&mut rbuf, &mut start, &mut filled);
            }
        }
    }
}

/// Decrypts the whole frames in `rbuf[*start..filled]` and writes them to the TUN, in batches.
fn decrypt_frames(
    ctx: &Ctx,
    inb: &mut Inbound,
    rbuf: &[u8],
    start: &mut usize,
    filled: usize,
) -> Result<()> {
    loop {
        {
            let mut tunn = ctx.ends.peer.tunn();
            while !inb.is_full() {
                let Some(frame) = framing::next_frame(rbuf, start, filled)? else {
                    break;
                };
                inb.decrypt(&mut tunn, &ctx.ends.peer, &ctx.link, frame);
            }
        }
        let full = inb.is_full();
        inb.flush(&ctx.ends.tun, &ctx.ends.peer)?;
        if !full {
            return Ok(());
        }
    }
}

/// TUN → encrypt → QUIC (both modes), until shutdown.
pub(super) fn tun_to_quic(ctx: &Ctx) -> Result<()> {
    match ctx.mode {
        crate::config::QuicMode::Datagram => tun_to_datagrams(ctx),
        crate::config::QuicMode::Stream => tun_to_stream(ctx),
    }
}

/// Waits for the TUN or the control queue; `false` on shutdown.
fn wait_input(ctx: &Ctx) -> Result<bool> {
    let w = wait_readable(
        ctx.ends.tun.raw_fd(),
        Some(ctx.link.control.ready.raw()),
        &ctx.ends.shutdown,
        None,
    )?;
    Ok(w != Wake::Shutdown)
}

/// One datagram to quinn; waits for room in its send buffer (the congestion window pushes back
/// on the TUN instead of quinn dropping older datagrams). `false` if the connection is gone.
fn send_datagram(ctx: &Ctx, cur: &Current, b: Bytes, warned: &mut bool) -> bool {
    let r = if cur.conn.datagram_send_buffer_space() >= b.len() {
        cur.conn.send_datagram(b)
    } else {
        let t0 = std::time::Instant::now();
        let waited = ctx.handle.block_on(async {
            tokio::select! {
                r = cur.conn.send_datagram_wait(b) => Some(r),
                _ = ctx.stopped() => None,
            }
        });
        cur.counters.send_waits.fetch_add(1, Ordering::Relaxed);
        cur.counters
            .send_wait_us
            .fetch_add(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
        match waited {
            Some(r) => r,
            None => return false,
        }
    };
    let peer = &ctx.ends.peer;
    match r {
        Ok(()) => {
            Stats::add(&peer.stats.net_out, 1);
            true
        }
        Err(SendDatagramError::TooLarge) => {
            Stats::add(&peer.stats.send_dropped, 1);
            if !*warned {
                *warned = true;
                tracing::warn!(
                    "a WireGuard packet does not fit a QUIC datagram (at most {:?} bytes on this path): lower the MTU (now {})",
                    cur.conn.max_datagram_size(),
                    ctx.mtu
                );
            }
            true
        }
        Err(e) => {
            Stats::add(&peer.stats.send_dropped, 1);
            tracing::debug!("sending a datagram: {e}");
            false
        }
    }
}

fn tun_to_datagrams(ctx: &Ctx) -> Result<()> {
    let peer = &ctx.ends.peer;
    let mut reader = TunReader::new();
    let mut slot = vec![0u8; SLOT];
    let mut batch: Vec<Bytes> = Vec::with_capacity(TX_BATCH);
    let mut warned = false;
    loop {
        let mut read_any = false;
        while batch.len() < TX_BATCH
            && reader
                .recv(&ctx.ends.tun)
                .context("reading from the TUN device")?
        {
            let segs = reader.segments(&ctx.ends.tun);
            if batch.len() + segs > TX_BATCH && !batch.is_empty() {
                break; // send first; the packet stays pending
            }
            read_any = true;
            Stats::add(&peer.stats.tun_in, 1);
            wg::encrypt_read(peer, &ctx.ends.tun, &mut reader, |tunn, packet| {
                if let Some(p) = wg::encapsulate(peer, tunn, packet, &mut slot) {
                    batch.push(Bytes::copy_from_slice(p));
                }
            });
        }
        if batch.is_empty() {
            if read_any {
                continue;
            }
            if !wait_input(ctx)? {
                return Ok(());
            }
            ctx.link.control.ready.drain();
            continue;
        }
        let Some(cur) = ctx.link.current() else {
            Stats::add(&peer.stats.send_dropped, batch.len() as u64);
            batch.clear();
            continue;
        };
        let mut alive = true;
        for b in batch.drain(..) {
            if alive {
                alive = send_datagram(ctx, &cur, b, &mut warned);
            } else {
                Stats::add(&peer.stats.send_dropped, 1);
            }
        }
        if ctx.ends.shutdown.is_triggered() {
            return Ok(());
        }
    }
}

fn tun_to_stream(ctx: &Ctx) -> Result<()> {
    let peer = &ctx.ends.peer;
    // The buffer stays 256 KiB (a 64 KiB TSO burst from the TUN must fit it whole); what is
    // framed goes to quinn in chunks of at most `ctx.chunk`, each on the next stream.
    let max = streams::MAX_CHUNK;
    let mut w = framing::Writer::new(ctx.mtu, max + framing::frame_room(ctx.mtu), max);
    loop {
        let f = w.fill(&ctx.ends, &ctx.link.control)?;
        if f.len == 0 {
            if f.read_any {
                continue;
            }
            if !wait_input(ctx)? {
                return Ok(());
            }
            continue;
        }
        let Some((cur, send)) = ctx
            .link
            .current()
            .and_then(|c| c.send.clone().map(|s| (c, s)))
        else {
            Stats::add(&peer.stats.send_dropped, f.frames);
            continue;
        };
        let mut left = f.frames;
        for (piece, frames) in streams::pieces(w.framed(&f), ctx.chunk) {
            let chunk = Bytes::copy_from_slice(piece);
            let t0 = std::time::Instant::now();
            let r = ctx.handle.block_on(async {
                tokio::select! {
                    r = async { send.lock().await.write(chunk).await } => Some(r),
                    _ = ctx.stopped() => None,
                }
            });
            // quinn takes a chunk at once while the peer allows another stream and the
            // connection's flow-control credit and its send buffer have room; a longer write
            // waited for one of them.
            let took = t0.elapsed();
            if took >= STREAM_WAIT {
                cur.counters.send_waits.fetch_add(1, Ordering::Relaxed);
                cur.counters
                    .send_wait_us
                    .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
            }
            match r {
                None => return Ok(()),
                Some(Ok(())) => {
                    Stats::add(&peer.stats.net_out, frames);
                    left -= frames;
                }
                Some(Err(e)) => {
                    Stats::add(&peer.stats.send_dropped, left);
                    if !ctx.ends.shutdown.is_triggered() {
                        tracing::debug!(
                            "QUIC stream to {} lost while sending: {e}",
                            cur.conn.remote_address()
                        );
                    }
                    ctx.link.drop_conn(cur.id);
                    break;
                }
            }
        }
    }
}
