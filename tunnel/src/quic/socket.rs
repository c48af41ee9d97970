//! The outer UDP socket under quinn: sized by `--buffer-policy` before bind (as the UDP
//! transport's), then handed to quinn through a wrapper that counts what quinn-udp's
//! segmentation offloads actually do: datagrams per send call (GSO) and per received buffer
//! (GRO).

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use anyhow::{Context as _, Result};
use bufscope_policy::{Target, Transport};
use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};
use socket2::{Domain, Protocol, Socket, Type};

use crate::config::BufferPolicy;

/// Creates the outer UDP socket for `peer`'s address family (any family when listening),
/// applies the buffer policy before bind and binds it to `port`.
pub fn bind(
    port: u16,
    v6: bool,
    policy: BufferPolicy,
    target: Option<Target>,
) -> Result<UdpSocket> {
    let domain = if v6 { Domain::IPV6 } else { Domain::IPV4 };
    let sock = Socket::new(domain, Type::DGRAM.cloexec(), Some(Protocol::UDP))
        .context("cannot create the outer UDP socket")?;
    if v6 {
        sock.set_only_v6(false).context("IPV6_V6ONLY")?;
    }
    crate::buffers::apply(
        &sock,
        policy,
        Transport::Quic,
        target,
        "outer QUIC (UDP) socket",
    )?;
    let addr: SocketAddr = if v6 {
        ([0u16; 8], port).into()
    } else {
        ([0, 0, 0, 0], port).into()
    };
    sock.bind(&addr.into())
        .with_context(|| format!("cannot bind the outer UDP socket to {addr}"))?;
    Ok(sock.into())
}

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
}

impl Metered {
    /// Wraps quinn's socket.
    pub fn new(inner: Arc<dyn AsyncUdpSocket>) -> Self {
        Self {
            inner,
            counters: Arc::new(Counters::default()),
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
