//! Stream mode's framing: WireGuard packets in chunks of at most [`MAX_CHUNK`], each chunk on
//! a unidirectional QUIC stream of its own, in order, with a priority that falls with the
//! chunk's number.
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
//! **A stream per chunk.** A chunk is at most [`MAX_CHUNK`] and one frame (256 KiB ≈ 190
//! full-size packets, at most ~95 runs whatever is lost, well below 1,024), and the
//! connection's receive window ([`tunnel_window`]) bounds what all streams hold past a hole.
//! The writer appends what it frames to the newest chunk's stream and, when a write would make
//! that chunk longer than the limit, finishes it and opens the next stream. Chunk `k`'s stream
//! has priority `-k`, so quinn sends (and retransmits) the oldest chunk first, and data appended
//! to the newest stream waits behind every older one: the chunks leave in the order they were
//! written, as from one stream. The reader reads the streams in the order they were opened
//! (quinn accepts them in that order), each to its end.
//!
//! **Why not a fixed set of streams.** Until 2026-12-07 the chunks went round robin over 32
//! fixed streams, and each write set its stream's priority to its chunk's. quinn's priority
//! belongs to the stream, not to its data: whenever quinn's send buffer held more than 32
//! chunks not yet sent (one inner CUBIC flow at 190 ms kept 3–11 MB there behind the 7 MiB
//! congestion window, in chunks of ~10.7 KB), a stream's older chunk took the priority of its
//! newest and waited behind the newer chunks of the other streams. The reader, which must read
//! in order, waited for it while the others filled their windows, and then got them all at
//! once: the inner flow's ACK clock oscillated (0.3 s lulls at the receiver, single ACKs of
//! 0.9 MB), and one transfer in six fell below 90% of the link (docs/tunnel.md, "Stream mode
//! under loss").

use anyhow::{Context as _, Result};
use bytes::Bytes;
use quinn::{Connection, RecvStream, SendStream};

/// Streams the peer may have open at once, so chunks sent and not yet read by the peer:
/// 4,096, so that the connection window, not this count, bounds them. A chunk is finished
/// once the next write would overfill it, so finished chunks average at least half the
/// limit: the policy's 32 MiB holds at most ~257 of 256 KiB chunks, and 4,096 leaves room for
/// the larger windows of larger targets. quinn keeps an empty slot per stream the peer may
/// open (about a hundred kilobytes here).
pub const MAX_OPEN_STREAMS: u32 = 4096;

/// The receive window of one stream: 1 MiB. A stream holds one chunk (at most
/// [`MAX_CHUNK`] and one frame), so this never binds; 1 MiB ≈ 740 full-size QUIC packets
/// keeps a stream below quinn's 1,024 gaps even so.
pub const MAX_STREAM_WINDOW: u64 = 1 << 20;

// Full-size packets carry ~1,400 bytes of stream data; a run of received data needs at least
// one, and so does the loss that ends it: a stream's window leaves at most 3/8 of quinn's
// 1,024 pieces.
const _: () = assert!(MAX_STREAM_WINDOW / (2 * 1400) < 1024 * 3 / 8);
// A chunk (and the frame that may overrun it) fits a stream's window.
const _: () = assert!((MAX_CHUNK + (64 << 10)) as u64 <= MAX_STREAM_WINDOW);

/// The connection's receive window for the policy's stream window `policy` (16 MiB): twice
/// that. Past a hole, the streams hold what arrives until the retransmission does, about one
/// round trip of data on top of the round trip in flight; with the policy's 16 MiB in all,
/// one inner CUBIC flow at 190 ms / 200 Mbit/s (a round trip of 380 ms with the bottleneck
/// queue full: 9.5 MB) stalled on flow control during recovery (176–184 Mbit/s).
pub fn tunnel_window(policy: u64) -> u64 {
    policy.saturating_mul(2)
}

/// Bytes of frames per chunk at most: the seed's 256 KiB copy buffers instead of tokio's
/// 8 KiB. The writer frames up to this much from the TUN at a time.
pub const MAX_CHUNK: usize = 256 << 10;

/// Bytes of frames per chunk for a connection whose receive window is `window` bytes:
/// [`MAX_CHUNK`], or a quarter of the window when that is less. quinn takes a chunk only as
/// far as the connection's flow-control credit goes, so a chunk as large as the window waits
/// a round trip for credit with nothing else in flight. With quinn's default window (1.25 MB)
/// spread over 32 streams (39 KB each, as until 2026-12), one inner CUBIC flow over 200 Mbit/s
/// got, down/up in Mbit/s (`cargo xtask bench tunnel`, 2026-12-06 21:3x UTC; the window caps
/// it at 200 at 50 ms, 52.6 at 190 ms):
///
/// | chunk | 50 ms | 190 ms |
/// |---|---|---|
/// | 256 KiB | 6.0 / 6.0 | 1.6 / 1.6 |
/// | window / 2 | 96.9 / 96.6 | 25.8 / 27.3 |
/// | window / 4 | 135.5 / 135.8 | 36.2 / 36.4 |
/// | window / 8 | 135.2 / 135.7 | 36.4 / 36.4 |
///
/// The policy's window (32 MiB) keeps [`MAX_CHUNK`].
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
/// 2^30 chunks, where chunks sent until then are sent after newer ones.
fn priority(k: u64) -> i32 {
    -((k % (1 << 30)) as i32)
}

/// The sending half: the stream being filled (the newest chunk) and the next chunk's number.
pub struct Sender {
    conn: Connection,
    /// The newest chunk's stream and the bytes written on it.
    current: Option<(SendStream, usize)>,
    /// Bytes of frames per chunk at most ([`chunk_limit`]).
    limit: usize,
    next: u64,
}

impl Sender {
    /// The sending half on `conn`, with chunks of at most `limit` bytes; streams are opened as
    /// data is written.
    pub fn new(conn: Connection, limit: usize) -> Self {
        Self {
            conn,
            current: None,
            limit,
            next: 0,
        }
    }

    /// Writes `framed` (whole length-prefixed frames) at the end of the newest chunk, or, when
    /// it would make that chunk longer than the limit, finishes it and starts the next chunk
    /// on a new stream. Appending to the newest stream keeps the order: every older stream
    /// has a higher priority. Waits until the peer allows another stream and for room in
    /// quinn's send buffer and the connection's flow-control credit.
    pub async fn write(&mut self, framed: Bytes) -> Result<(), quinn::WriteError> {
        if let Some((s, written)) = &mut self.current
            && *written + framed.len() > self.limit
        {
            // quinn sends the FIN after the data; a stream reset meanwhile fails no write.
            let _ = s.finish();
            self.current = None;
        }
        let (s, written) = match &mut self.current {
            Some(c) => c,
            None => {
                let s = self.conn.open_uni().await?;
                // A stream that is gone fails the write below.
                let _ = s.set_priority(priority(self.next));
                self.next += 1;
                self.current.insert((s, 0))
            }
        };
        *written += framed.len();
        s.write_chunk(framed).await
    }
}

/// What [`Receiver::read`] read.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// Bytes of the current chunk.
    Data(usize),
    /// The current chunk ended (its stream is finished and read to the end).
    End,
    /// The connection is gone (its manager reports why).
    Gone,
}

/// The receiving half: the peer's streams, accepted in the order the peer opened them (the
/// chunks' order), and the one being read.
pub struct Receiver {
    conn: Connection,
    current: Option<RecvStream>,
}

impl Receiver {
    /// The peer's streams on `conn`, with the first one if it was accepted already.
    pub fn new(conn: Connection, first: Option<RecvStream>) -> Self {
        Self {
            conn,
            current: first,
        }
    }

    /// Reads up to `buf.len()` bytes of the current chunk, waiting for the peer's next stream
    /// when there is none.
    pub async fn read(&mut self, buf: &mut [u8]) -> Result<Read> {
        let s = match &mut self.current {
            Some(s) => s,
            None => match self.conn.accept_uni().await {
                Ok(s) => self.current.insert(s),
                Err(_) => return Ok(Read::Gone),
            },
        };
        match s.read(buf).await {
            Ok(Some(n)) => Ok(Read::Data(n)),
            // Read to its end: quinn frees the stream and lets the peer open another.
            Ok(None) => {
                self.current = None;
                Ok(Read::End)
            }
            Err(quinn::ReadError::ConnectionLost(_)) => Ok(Read::Gone),
            Err(e) => Err(e).context("reading a QUIC stream"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_window_is_twice_the_stream_window() {
        let policy = bufscope_policy::quic_windows().stream_receive;
        assert_eq!(tunnel_window(policy), 2 * policy);
        assert_eq!(tunnel_window(u64::MAX), u64::MAX);
    }

    #[test]
    fn chunks_are_a_quarter_window_up_to_256_kib() {
        // quinn's default window, 1.25 MB: a quarter of it is more than 256 KiB.
        assert_eq!(chunk_limit(1_250_000), MAX_CHUNK);
        assert_eq!(chunk_limit(400_000), 100_000);
        // The policy's 32 MiB keeps the seed's 256 KiB.
        assert_eq!(chunk_limit(32 << 20), MAX_CHUNK);
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
    }
}
