//! The outer UDP socket under quinn, created as the UDP transport's
//! ([`crate::udp::bind_outer`]: sized by `--buffer-policy` before bind), is handed to quinn
//! through a wrapper that counts what quinn-udp's segmentation offloads actually do:
//! datagrams per send call (GSO) and per received buffer (GRO).

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};

/// What went through the socket, counted in the wrapper around quinn-udp.
#[derive(Default)]
pub struct Counters {
    /// Successful send calls (one `sendmsg` each, with GSO possibly many datagrams).
    pub sends: AtomicU64,
    /// UDP datagrams those sends carried.
    pub sent_datagrams: AtomicU64,
    /// Received buffers (one per `RecvMeta`; with GRO possibly many datagrams).
    pub recv_buffers: AtomicU64,
    /// UDP datagrams those buffers carried.
    pub recv_datagrams: AtomicU64,
}

impl Counters {
    /// One line: datagrams per send and per received buffer.
    pub fn summary(&self, max_gso: usize, max_gro: usize) -> String {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let per = |n: u64, d: u64| if d == 0 { 0.0 } else { n as f64 / d as f64 };
        format!(
            "outer UDP sent {} datagrams in {} sends ({:.2} per send, GSO up to {max_gso}), received {} in {} buffers ({:.2} per buffer, GRO up to {max_gro})",
            g(&self.sent_datagrams),
            g(&self.sends),
            per(g(&self.sent_datagrams), g(&self.sends)),
            g(&self.recv_datagrams),
            g(&self.recv_buffers),
            per(g(&self.recv_datagrams), g(&self.recv_buffers)),
        )
    }
}

/// quinn's own socket (tokio + quinn-udp), counted.
pub struct Metered {
    inner: Arc<dyn AsyncUdpSocket>,
    /// The counts.
    pub counters: Arc<Counters>,
    /// Hide the received packets' ECN codepoints from quinn (see [`Metered::new`]).
    hide_ecn: bool,
}

impl Metered {
    /// Wraps quinn's socket. With `hide_ecn` quinn never sees the ECN bits of what it
    /// receives, so its ACKs are plain ACK frames without the three ECN counters (ACK_ECN,
    /// up to 12 bytes more), and the sender, getting no ECN feedback, stops marking its
    /// packets ECT. Datagram mode wants that: a full-size WireGuard packet leaves 14 bytes
    /// in a QUIC packet towards the listening side, where a plain ACK (9–12 bytes) fits and
    /// an ACK_ECN does not, so every ACK went out in a packet of its own (measured at 50 ms
    /// / 200 Mbit/s: 17% of the data sender's packets). The inner flows lose nothing: outer
    /// ECN marks never reached them (WireGuard does not copy them inward), and quinn's
    /// controller still reacts to loss.
    pub fn new(inner: Arc<dyn AsyncUdpSocket>, hide_ecn: bool) -> Self {
        Self {
            inner,
            counters: Arc::new(Counters::default()),
            hide_ecn,
        }
    }
}

impl fmt::Debug for Metered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metered")
            .field("inner", &self.inner)
            .finish()
    }
}

impl AsyncUdpSocket for Metered {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        self.inner.try_send(transmit)?;
        let n = match transmit.segment_size {
            Some(s) if s > 0 => transmit.contents.len().div_ceil(s),
            _ => 1,
        };
        self.counters.sends.fetch_add(1, Ordering::Relaxed);
        self.counters
            .sent_datagrams
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let r = self.inner.poll_recv(cx, bufs, meta);
        if let Poll::Ready(Ok(n)) = &r {
            if self.hide_ecn {
                for m in &mut meta[..*n] {
                    m.ecn = None;
                }
            }
            let datagrams: usize = meta[..*n]
                .iter()
                .map(|m| m.len.div_ceil(m.stride.max(1)))
                .sum();
            self.counters
                .recv_buffers
                .fetch_add(*n as u64, Ordering::Relaxed);
            self.counters
                .recv_datagrams
                .fetch_add(datagrams as u64, Ordering::Relaxed);
        }
        r
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}
