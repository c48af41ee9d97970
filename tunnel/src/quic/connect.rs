//! The connecting side: the first connection (a wrong peer is a startup error), and
//! reconnecting with a backoff when a connection ends.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use quinn::{Endpoint, VarInt};

use super::{CLOSE_MODE_MISMATCH, Ctx, Current, report, tls};
use crate::wg;

/// Why a connection attempt failed, and whether trying again could help.
struct ConnectError {
    error: anyhow::Error,
    fatal: bool,
}

impl ConnectError {
    fn retry(error: anyhow::Error) -> Self {
        Self {
            error,
            fatal: false,
        }
    }

    fn fatal(error: anyhow::Error) -> Self {
        Self { error, fatal: true }
    }
}

/// Explains a failed QUIC handshake in the operator's terms.
fn explain_handshake_error(e: &quinn::ConnectionError, peer: SocketAddr) -> ConnectError {
    let text = e.to_string();
    if text.contains("invalid peer certificate") || text.contains("certificate") {
        return ConnectError::fatal(anyhow!(
            "QUIC handshake with {peer} failed: its certificate is not the one derived from our keys ({text}); the two ends' PrivateKey/PublicKey (and PresharedKey) do not pair up"
        ));
    }
    if text.contains("no_application_protocol") || text.contains("error 120") {
        return ConnectError::fatal(anyhow!(
            "QUIC handshake with {peer} failed: the peer speaks neither QUIC mode of bufscope-tunnel ({text})"
        ));
    }
    ConnectError::retry(anyhow!("QUIC handshake with {peer} failed: {text}"))
}

/// One connection attempt: handshake within `timeout`, mode check, stream set-up.
async fn connect_once(
    ctx: &Ctx,
    endpoint: &Endpoint,
    peer: SocketAddr,
    timeout: Duration,
) -> Result<Current, ConnectError> {
    let connecting = endpoint
        .connect(peer, tls::SERVER_NAME)
        .map_err(|e| ConnectError::fatal(anyhow!("cannot connect to {peer} over QUIC: {e}")))?;
    let conn = match tokio::time::timeout(timeout, connecting).await {
        Err(_) => {
            return Err(ConnectError::retry(anyhow!(
                "QUIC handshake with {peer} timed out after {timeout:?}: nothing answered (is bufscope-tunnel --transport quic listening on UDP port {}?)",
                peer.port()
            )));
        }
        Ok(Err(e)) => {
            let e = explain_handshake_error(&e, peer);
            if e.fatal {
                flush_close(endpoint).await;
            }
            return Err(e);
        }
        Ok(Ok(c)) => c,
    };
    let negotiated = conn
        .handshake_data()
        .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .and_then(|d| d.protocol)
        .and_then(|p| tls::mode_of(&p));
    if negotiated != Some(ctx.mode) {
        let reason = format!("mode mismatch: the client uses --quic.mode {}", ctx.mode);
        conn.close(VarInt::from_u32(CLOSE_MODE_MISMATCH), reason.as_bytes());
        flush_close(endpoint).await;
        return Err(ConnectError::fatal(anyhow!(
            "QUIC mode mismatch: this end uses --quic.mode {}, the peer at {peer} uses {} (set the same QuicMode on both ends)",
            ctx.mode,
            negotiated.map_or_else(
                || "an unknown one".to_string(),
                |m| format!("--quic.mode {m}")
            )
        )));
    }
    let cur = Current::new(ctx, conn).await.map_err(|e| {
        ConnectError::retry(e.context(format!("setting up the connection to {peer}")))
    })?;
    report::log_connected(ctx, &cur, "connected to");
    super::spawn_receiver(ctx, &cur, None);
    Ok(cur)
}

/// Gives quinn a moment to send a CONNECTION_CLOSE before the process exits on a fatal error,
/// so that the peer logs why instead of waiting for the idle timeout.
pub(super) async fn flush_close(endpoint: &Endpoint) {
    let _ = tokio::time::timeout(Duration::from_millis(300), endpoint.wait_idle()).await;
}

/// Client side: installs a new connection and starts a WireGuard handshake on it (stream mode
/// needs a first write for the peer to see the stream; any mode may have lost the last one).
pub(super) fn install_client(ctx: &Ctx, cur: Current) {
    ctx.ends.peer.set_endpoint(cur.conn.remote_address());
    ctx.link.install(cur);
    wg::initiate(&ctx.ends.peer, false, |p| {
        ctx.link.send_control(p, &ctx.ends.peer)
    });
}

pub(super) async fn connect_first(
    ctx: &Ctx,
    endpoint: &Endpoint,
    peer: SocketAddr,
    timeout: Duration,
) -> Result<Current> {
    tokio::select! {
        r = connect_once(ctx, endpoint, peer, timeout) => r.map_err(|e| e.error),
        _ = ctx.stopped() => bail!("interrupted while connecting to {peer}"),
    }
}

/// Client: waits for the connection to end, then reconnects with a backoff up to 5 s. A mode
/// mismatch or a wrong key is fatal.
pub(super) async fn client_manager(
    ctx: &Ctx,
    endpoint: &Endpoint,
    peer: SocketAddr,
    mut cur: Current,
) -> Result<()> {
    loop {
        tokio::select! {
            e = cur.conn.closed() => {
                report::log_closed(ctx, &cur, &e);
                ctx.link.drop_conn(cur.id);
            }
            _ = ctx.stopped() => return Ok(()),
        }
        let mut backoff = Duration::from_millis(100);
        loop {
            if ctx.is_stopping() {
                return Ok(());
            }
            let attempt = tokio::select! {
                r = connect_once(ctx, endpoint, peer, Duration::from_secs(5)) => r,
                _ = ctx.stopped() => return Ok(()),
            };
            match attempt {
                Ok(next) => {
                    let n = ctx.link.tally.reconnected();
                    tracing::info!(reconnects = n, "QUIC reconnected to {peer} (reconnect {n})");
                    install_client(ctx, next.clone());
                    cur = next;
                    break;
                }
                Err(e) if e.fatal => return Err(e.error),
                Err(e) => {
                    tracing::warn!("reconnecting: {:#}; next try in {backoff:?}", e.error);
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = ctx.stopped() => return Ok(()),
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}
