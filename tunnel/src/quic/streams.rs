//! Stream mode's framing: WireGuard packets in chunks spread over [`STREAMS`] unidirectional
//! QUIC streams per direction, round robin, each chunk behind its length.
//!
//! **Why not one stream.** quinn-proto 0.11 keeps a stream's out-of-order data in an assembler
//! of separate pieces and closes the connection ("too many gaps in stream buffer") when, after
//! compacting, more than 1,024 pieces remain (`MAX_CHUNKS` in `connection/assembler.rs`, a
//! private constant: no `TransportConfig` setting or other public API changes it). Compacting
//! merges contiguous pieces, so what remains is about one piece per run of received data
//! between losses, and the data a stream can hold out of order is bounded by its receive
//! window. One stream with the policy's 16 MiB window holds ~11,800 full-size packets:
//! 10% of them lost, or a loss burst whose retransmission is lost again, leaves more than
//! 1,024 runs, and quinn closed the connection (measured: `tunnel/tests/quic_loss.rs`, and
//! 5 closes in 4 bench runs at 50 ms). Reading out of order (`read_chunk(_, false)`) does not
//! help: quinn then returns flow-control credit for bytes read past a hole, so the data held
//! for reordering is no longer bounded by any window.
//!
//! **What instead.** [`STREAMS`] streams of at most [`MAX_STREAM_WINDOW`] each: a stream's
//! window holds at most 1 MiB ≈ 740 full-size packets, so at most ~370 runs whatever is lost,
//! well below 1,024. Together they hold twice the policy's stream window, 32 MiB, past a hole
//! (see [`tunnel_window`]). The writer sends chunk `k` (a 4-byte big-endian
//! length, then length-prefixed WireGuard packets, as over TCP) on stream `k mod STREAMS`; the
//! reader reads chunk `k` from the same stream, so packets come out in the order they went
//! in, reliably, as from one stream. A chunk is written with a stream priority that falls with
//! `k`, so quinn sends (and retransmits) the oldest chunks first, as it retransmits first
//! within one stream.

use anyhow::{Context as _, Result, bail};
use bytes::{BufMut as _, Bytes, BytesMut};
use quinn::{Connection, RecvStream, SendStream};

/// Unidirectional streams per direction.
pub const STREAMS: usize = 32;

/// The largest receive window of one stream: 1 MiB ≈ 740 full-size QUIC packets, at most
/// ~370 separate runs in quinn's assembler (its limit is 1,024).
pub const MAX_STREAM_WINDOW: u64 = 1 << 20;

// Full-size packets carry ~1,400 bytes of stream data; a run of received data needs at least
// one, and so does the loss that ends it: a stream's window leaves at most 3/8 of quinn's
// 1,024 pieces.
const _: () = assert!(MAX_STREAM_WINDOW / (2 * 1400) < 1024 * 3 / 8);

/// Bytes of a chunk's length prefix.
pub const CHUNK_HEADER: usize = 4;

/// The window of all streams together for the policy's stream window `policy` (16 MiB):
/// twice that. Past a hole, the streams hold what arrives until the retransmission does, about
/// one round trip of data on top of the round trip in flight; with the policy's 16 MiB in all,
/// one inner CUBIC flow at 190 ms / 200 Mbit/s (a round trip of 380 ms with the bottleneck
/// queue full: 9.5 MB) stalled on flow control during recovery (176–184 Mbit/s).
pub fn tunnel_window(policy: u64) -> u64 {
    policy.saturating_mul(2)
}

/// quinn's receive window of each stream for a window of `total` bytes over all streams.
pub fn stream_window(total: u64) -> u64 {
    (total / STREAMS as u64).clamp(1, MAX_STREAM_WINDOW)
}

/// Bytes of frames per chunk at most: the seed's 256 KiB copy buffers instead of tokio's
/// 8 KiB. The writer frames up to this much from the TUN at a time.
pub const MAX_CHUNK: usize = 256 << 10;

/// Bytes of frames per chunk for streams whose receive window is `window` bytes: [`MAX_CHUNK`],
/// or a quarter of the window when that is less. The writer hands quinn one chunk at a time,
/// and quinn takes a chunk only as far as its stream's flow-control credit goes, so a chunk
/// larger than the window waits several round trips for that one stream's credit while the
/// other streams sit idle. With quinn's default windows (1.25 MB over the 32 streams, 39 KB
/// each), one inner CUBIC flow over 200 Mbit/s got, down/up in Mbit/s (`cargo xtask bench
/// tunnel`, 2026-12-06 21:3x UTC; the window caps it at 200 at 50 ms, 52.6 at 190 ms):
///
/// | chunk | 50 ms | 190 ms |
/// |---|---|---|
/// | 256 KiB | 6.0 / 6.0 | 1.6 / 1.6 |
/// | window / 2 | 96.9 / 96.6 | 25.8 / 27.3 |
/// | window / 4 | 135.5 / 135.8 | 36.2 / 36.4 |
/// | window / 8 | 135.2 / 135.7 | 36.4 / 36.4 |
///
/// The policy's windows (1 MiB per stream) keep [`MAX_CHUNK`].
pub fn chunk_limit(window: u64) -> usize {
    usize::try_from(window / 4).map_or(MAX_CHUNK, |q| q.clamp(1, MAX_CHUNK))
}

/// `framed` (length-prefixed packets, as the writer builds them) cut at frame boundaries into
/// pieces of at most `limit` bytes, with the number of frames in each. A frame longer than
/// `limit` is a piece of its own: a chunk never ends inside a frame.
pub fn pieces(framed: &[u8], limit: usize) -> impl Iterator<Item = (&[u8], u64)> {
    let mut rest = framed;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let (mut len, mut frames) = (0usize, 0u64);
        while len + 2 <= rest.len() {
            let f = 2 + usize::from(u16::from_be_bytes([rest[len], rest[len + 1]]));
            if frames > 0 && len + f > limit {
                break;
            }
            len = (len + f).min(rest.len());
            frames += 1;
        }
        if frames == 0 {
            len = rest.len();
        }
        let (piece, tail) = rest.split_at(len);
        rest = tail;
        Some((piece, frames))
    })
}

/// Priority of chunk `k`: falls with `k`, so quinn sends older chunks first. It wraps after
/// 2^30 chunks, where one chunk is sent out of turn.
fn priority(k: u64) -> i32 {
    -((k % (1 << 30)) as i32)
}

/// `framed` (length-prefixed packets) behind its chunk header.
pub fn chunk(framed: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(CHUNK_HEADER + framed.len());
    b.put_u32(framed.len() as u32);
    b.put_slice(framed);
    b.freeze()
}

/// Opens this end's [`STREAMS`] streams (the peer allows exactly that many).
pub async fn open(conn: &Connection) -> Result<Sender> {
    let mut streams = Vec::with_capacity(STREAMS);
    for _ in 0..STREAMS {
        streams.push(conn.open_uni().await.context("opening a QUIC stream")?);
    }
    Ok(Sender { streams, next: 0 })
}

/// The sending half: this end's streams and the next chunk's number.
pub struct Sender {
    streams: Vec<SendStream>,
    next: u64,
}

impl Sender {
    /// Writes one [`chunk`] on its stream; waits for flow-control credit and room in quinn's
    /// send buffer.
    pub async fn write(&mut self, chunk: Bytes) -> Result<(), quinn::WriteError> {
        let k = self.next;
        let s = &mut self.streams[(k % STREAMS as u64) as usize];
        // A stream that is gone fails the write below.
        let _ = s.set_priority(priority(k));
        s.write_chunk(chunk).await?;
        self.next += 1;
        Ok(())
    }
}

/// The receiving half: the peer's streams, accepted as they are first needed (quinn hands
/// them out in the order the peer opened them), and where the current chunk is.
pub struct Receiver {
    conn: Connection,
    streams: Vec<RecvStream>,
    next: u64,
    /// Bytes of the current chunk not yet read.
    left: usize,
}

impl Receiver {
    /// The peer's streams on `conn`, with the first one if it was accepted already.
    pub fn new(conn: Connection, first: Option<RecvStream>) -> Self {
        let mut streams = Vec::with_capacity(STREAMS);
        streams.extend(first);
        Self {
            conn,
            streams,
            next: 0,
            left: 0,
        }
    }

    /// Bytes of the current chunk not yet read.
    pub fn left(&self) -> usize {
        self.left
    }

    /// Starts the next chunk: reads its length from its stream. `None` when the connection is
    /// gone (its manager reports why).
    pub async fn begin(&mut self) -> Result<Option<usize>> {
        let i = (self.next % STREAMS as u64) as usize;
        while self.streams.len() <= i {
            match self.conn.accept_uni().await {
                Ok(s) => self.streams.push(s),
                Err(_) => return Ok(None),
            }
        }
        let mut header = [0u8; CHUNK_HEADER];
        match self.streams[i].read_exact(&mut header).await {
            Ok(()) => {}
            Err(quinn::ReadExactError::ReadError(quinn::ReadError::ConnectionLost(_))) => {
                return Ok(None);
            }
            Err(e) => return Err(e).context("reading a chunk header from the QUIC stream"),
        }
        self.left = u32::from_be_bytes(header) as usize;
        self.next += 1;
        Ok(Some(self.left))
    }

    /// Reads up to `buf.len()` bytes (at most what is left of the current chunk); `None` when
    /// the connection is gone.
    pub async fn read(&mut self, buf: &mut [u8]) -> Result<Option<usize>> {
        let i = ((self.next + STREAMS as u64 - 1) % STREAMS as u64) as usize;
        let want = buf.len().min(self.left);
        if want == 0 {
            return Ok(Some(0));
        }
        match self.streams[i].read(&mut buf[..want]).await {
            Ok(Some(n)) => {
                self.left -= n;
                Ok(Some(n))
            }
            Ok(None) => bail!("the peer finished a QUIC stream"),
            Err(quinn::ReadError::ConnectionLost(_)) => Ok(None),
            Err(e) => Err(e).context("reading the QUIC stream"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_window_is_split_within_the_gap_bound() {
        let policy = bufscope_policy::quic_windows().stream_receive;
        let total = tunnel_window(policy);
        assert_eq!(stream_window(total) * STREAMS as u64, 2 * policy);
        assert_eq!(stream_window(total), MAX_STREAM_WINDOW);
        assert_eq!(stream_window(1 << 40), MAX_STREAM_WINDOW);
        assert_eq!(stream_window(0), 1);
    }

    #[test]
    fn chunks_are_a_quarter_window_up_to_256_kib() {
        // quinn's default 1.25 MB over 32 streams: 39,062 bytes each.
        assert_eq!(chunk_limit(stream_window(1_250_000)), 9_765);
        // The policy's 1 MiB per stream keeps the seed's 256 KiB.
        assert_eq!(chunk_limit(MAX_STREAM_WINDOW), MAX_CHUNK);
        assert_eq!(chunk_limit(1), 1);
    }

    fn framed(lens: &[usize]) -> Vec<u8> {
        let mut v = Vec::new();
        for (i, &l) in lens.iter().enumerate() {
            v.extend_from_slice(&(l as u16).to_be_bytes());
            v.extend(std::iter::repeat_n(i as u8, l));
        }
        v
    }

    #[test]
    fn pieces_end_on_frame_boundaries_within_the_limit() {
        let f = framed(&[1400, 1400, 1400, 100, 1400]);
        let p: Vec<_> = pieces(&f, 2900).collect();
        let lens: Vec<_> = p.iter().map(|(b, n)| (b.len(), *n)).collect();
        assert_eq!(lens, [(2804, 2), (1504, 2), (1402, 1)]);
        // Together they are the input, in order.
        assert_eq!(
            p.iter()
                .flat_map(|(b, _)| b.iter().copied())
                .collect::<Vec<_>>(),
            f
        );
        // A limit above the whole: one piece; a frame above the limit: a piece of its own.
        assert_eq!(pieces(&f, MAX_CHUNK).count(), 1);
        let big: Vec<_> = pieces(&f, 10).map(|(b, n)| (b.len(), n)).collect();
        assert_eq!(big, [(1402, 1), (1402, 1), (1402, 1), (102, 1), (1402, 1)]);
        assert_eq!(pieces(&[], 10).count(), 0);
    }

    #[test]
    fn older_chunks_have_higher_priority() {
        assert!(priority(0) > priority(1));
        assert!(priority(1000) > priority(1001));
        assert_eq!(chunk(b"abc").as_ref(), &[0, 0, 0, 3, b'a', b'b', b'c']);
    }
}
