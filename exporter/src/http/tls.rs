//! The TLS listener (`tls_server_config` of `--web.config.file`).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;

use super::clients::{Admitted, Connections, MAX_CONNECTIONS};
use super::serve::Admission;

/// A TLS listener for [`super::serve::serve`]: TCP accepts run in one task, handshakes in
/// their own tasks with a timeout, so a slow or silent client cannot stall other connections.
/// A connection takes its place under the connection cap before its handshake.
pub struct TlsListener {
    rx: tokio::sync::mpsc::Receiver<(TlsConn, std::net::SocketAddr)>,
    local: std::net::SocketAddr,
}

/// A TLS connection with the place under the connection caps it took before its handshake.
pub struct TlsConn {
    tls: tokio_rustls::server::TlsStream<TcpStream>,
    admitted: Option<Admitted>,
}

impl Admission for TlsConn {
    fn take_admission(&mut self) -> Option<Admitted> {
        self.admitted.take()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tls).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tls).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tls).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tls).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tls).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tls.is_write_vectored()
    }
}

/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

impl TlsListener {
    /// Wraps `tcp` with `cfg`; each connection takes its place under `conns` (the connection
    /// caps, a share per client) before its handshake, and is closed at once when it has none.
    pub fn new(
        tcp: TcpListener,
        cfg: Arc<rustls::ServerConfig>,
        conns: Arc<Connections>,
    ) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let acceptor = TlsAcceptor::from(cfg);
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            let mut refused: u64 = 0;
            loop {
                let (stream, addr) = match tcp.accept().await {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::debug!("accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Some(admitted) = conns.admit(addr.ip()) else {
                    refused += 1;
                    if refused.is_power_of_two() {
                        tracing::warn!(
                            peer = %addr,
                            refused,
                            "connection caps reached (at most {MAX_CONNECTIONS}, handshakes \
                             included, a share per client): closing new ones"
                        );
                    }
                    drop(stream);
                    continue;
                };
                let acceptor = acceptor.clone();
                let conn_tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let conn = TlsConn {
                                tls,
                                admitted: Some(admitted),
                            };
                            let _ = conn_tx.send((conn, addr)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(peer = %addr, "TLS handshake failed: {e}"),
                        Err(_) => tracing::debug!(peer = %addr, "TLS handshake timed out"),
                    }
                });
                if tx.is_closed() {
                    break;
                }
            }
        });
        Ok(Self { rx, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsConn;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            if let Some(x) = self.rx.recv().await {
                return x;
            }
            // The accept task ended (cannot happen while we hold the receiver); avoid a spin.
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
