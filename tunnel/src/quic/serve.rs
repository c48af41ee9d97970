//! The listening side: every authenticated connection (the handshake pins the peer's
//! certificate) replaces the current one.

use anyhow::{Result, bail};
use quinn::Endpoint;

use super::{Ctx, Current, report, spawn_receiver};
use crate::config::QuicMode;

/// Server: accepts connections; each authenticated one (the handshake pins the peer's
/// certificate) replaces the current one.
pub(super) async fn server_manager(ctx: &Ctx, endpoint: &Endpoint) -> Result<()> {
    loop {
        let incoming = tokio::select! {
            i = endpoint.accept() => i,
            _ = ctx.stopped() => return Ok(()),
        };
        let Some(incoming) = incoming else {
            return Ok(());
        };
        let c = ctx.clone();
        ctx.handle.spawn(async move {
            let from = incoming.remote_address();
            match serve(&c, incoming).await {
                Ok(()) => {}
                Err(e) if c.is_stopping() => tracing::debug!("QUIC connection from {from}: {e:#}"),
                Err(e) => tracing::warn!("QUIC connection from {from}: {e:#}"),
            }
        });
    }
}

/// One accepted connection, from handshake to close.
async fn serve(ctx: &Ctx, incoming: quinn::Incoming) -> Result<()> {
    let from = incoming.remote_address();
    let conn = match incoming.await {
        Ok(c) => c,
        // The peer may close (mode mismatch) before our side of the handshake completes.
        Err(e @ quinn::ConnectionError::ApplicationClosed(_)) => {
            report::log_closed_reason(ctx, from, &e);
            return Ok(());
        }
        Err(e) => bail!("handshake failed (not our peer, or wrong keys): {e}"),
    };
    // Stream mode: the peer's first stream shows that it uses this mode (a peer of the other
    // mode closes the connection instead), before the connection replaces the current one.
    let first = match ctx.mode {
        QuicMode::Datagram => None,
        QuicMode::Stream => {
            let accepted = tokio::select! {
                r = conn.accept_uni() => r,
                _ = ctx.stopped() => return Ok(()),
            };
            match accepted {
                Ok(s) => Some(s),
                Err(e) => {
                    report::log_closed_reason(ctx, from, &e);
                    return Ok(());
                }
            }
        }
    };
    let cur = Current::new(ctx, conn).await?;
    if ctx.link.current().is_some() {
        tracing::info!("QUIC connection from {from} replaces the current one");
    }
    report::log_connected(ctx, &cur, "connection from");
    ctx.ends.peer.set_endpoint(from);
    ctx.link.install(cur.clone());
    spawn_receiver(ctx, &cur, first);
    tokio::select! {
        e = cur.conn.closed() => {
            report::log_closed(ctx, &cur, &e);
            ctx.link.drop_conn(cur.id);
        }
        _ = ctx.stopped() => {}
    }
    Ok(())
}
