//! What the tunnel logs about its QUIC connections: set-up, path samples, why one ended, the
//! statistics quinn kept, and how many connections the process made and lost.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use quinn::{Connection, VarInt};

use super::transport::controller_name;
use super::{CLOSE_MODE_MISMATCH, CLOSE_REPLACED, Ctx, Current, streams};
use crate::config::QuicMode;

/// Connections over the life of the process, logged at shutdown (and read by the bench).
#[derive(Default)]
pub(super) struct Tally {
    /// Connections set up (either side).
    established: AtomicU64,
    /// Connections the connecting side made after the first.
    reconnects: AtomicU64,
    /// Connections that ended other than by an application's close: a transport error (ours
    /// or the peer's, e.g. quinn's "too many gaps in stream buffer"), a reset or a timeout.
    lost: AtomicU64,
}

impl Tally {
    /// Counts a connection set up.
    pub(super) fn established(&self) {
        self.established.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a reconnect; returns how many there were.
    pub(super) fn reconnected(&self) -> u64 {
        self.reconnects.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Whether `e` ended the connection from below the application.
    fn is_transport_close(e: &quinn::ConnectionError) -> bool {
        !matches!(
            e,
            quinn::ConnectionError::ApplicationClosed(_) | quinn::ConnectionError::LocallyClosed
        )
    }

    /// One line for the shutdown summary.
    pub(super) fn summary(&self) -> String {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "QUIC connections: {} established, {} reconnects, {} closed by the transport (errors, resets, timeouts)",
            g(&self.established),
            g(&self.reconnects),
            g(&self.lost)
        )
    }
}

/// Datagram mode: warns when quinn's largest datagram is smaller than a WireGuard packet.
pub(super) fn check_datagrams(conn: &Connection, mtu: u16) {
    let need = usize::from(mtu) + 32;
    match conn.max_datagram_size() {
        None => tracing::warn!(
            "the peer at {} accepts no QUIC datagrams: nothing will get through",
            conn.remote_address()
        ),
        Some(max) if max < need => tracing::warn!(
            "QUIC datagrams hold at most {max} bytes on this path, WireGuard packets of MTU {mtu} need {need}: larger packets are dropped (lower MTU to {})",
            max.saturating_sub(32)
        ),
        Some(_) => {}
    }
}

pub(super) fn log_connected(ctx: &Ctx, cur: &Current, what: &str) {
    let st = cur.conn.stats();
    tracing::info!(
        mode = %ctx.mode,
        congestion = controller_name(&cur.conn),
        rtt_us = cur.conn.rtt().as_micros() as u64,
        max_datagram = ?cur.conn.max_datagram_size(),
        udp_mtu = st.path.current_mtu,
        "QUIC {what} {} (mode {}, congestion controller {} in effect, window {})",
        cur.conn.remote_address(),
        ctx.mode,
        controller_name(&cur.conn),
        st.path.cwnd
    );
}

/// With debug logging: quinn's path state once a second while the connection lasts (to see
/// its congestion window and losses over a run, not only at the end).
pub(super) async fn sample_path(cur: Current) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last = cur.conn.stats();
    let mut last_waits = 0;
    let mut last_wait_us = 0;
    let mut last_read = 0;
    let mut last_probe = tunnel_probe(&cur.conn).unwrap_or_default();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = cur.conn.closed() => return,
        }
        let st = cur.conn.stats();
        let waits = cur.counters.send_waits.load(Ordering::Relaxed);
        let wait_us = cur.counters.send_wait_us.load(Ordering::Relaxed);
        let read = cur.counters.stream_bytes_read.load(Ordering::Relaxed);
        let probe = tunnel_probe(&cur.conn).unwrap_or_default();
        tracing::debug!(
            "QUIC path: rtt {:?} cwnd {} in flight {} (max {}) app-limited {}/{} ack batches, sent {} lost {} congestion events +{} udp out {} kB in {} kB, stream read {} kB, datagrams out {} in {} acks out {} MAX_STREAM_DATA out {} waits +{} ({} ms)",
            st.path.rtt,
            st.path.cwnd,
            probe.in_flight,
            probe.max_in_flight,
            probe.app_limited - last_probe.app_limited,
            probe.ack_batches - last_probe.ack_batches,
            st.path.sent_packets - last.path.sent_packets,
            st.path.lost_packets - last.path.lost_packets,
            st.path.congestion_events - last.path.congestion_events,
            (st.udp_tx.bytes - last.udp_tx.bytes) / 1000,
            (st.udp_rx.bytes - last.udp_rx.bytes) / 1000,
            (read - last_read) / 1000,
            st.frame_tx.datagram - last.frame_tx.datagram,
            st.frame_rx.datagram - last.frame_rx.datagram,
            st.frame_tx.acks - last.frame_tx.acks,
            st.frame_tx.max_stream_data - last.frame_tx.max_stream_data,
            waits - last_waits,
            (wait_us - last_wait_us) / 1000,
        );
        last = st;
        last_waits = waits;
        last_wait_us = wait_us;
        last_read = read;
        last_probe = probe;
    }
}

/// The `tunnel` controller's counts, if the connection runs it.
fn tunnel_probe(conn: &Connection) -> Option<super::congestion::Probe> {
    conn.congestion_state()
        .into_any()
        .downcast::<super::congestion::Tunnel>()
        .ok()
        .map(|t| t.probe())
}

pub(super) fn log_closed_reason(ctx: &Ctx, from: SocketAddr, e: &quinn::ConnectionError) {
    match e {
        quinn::ConnectionError::ApplicationClosed(c)
            if c.error_code == VarInt::from_u32(CLOSE_MODE_MISMATCH) =>
        {
            tracing::warn!(
                "QUIC mode mismatch: the peer at {from} closed the connection ({}); this end uses --quic.mode {} (set the same QuicMode on both ends)",
                String::from_utf8_lossy(&c.reason),
                ctx.mode
            )
        }
        quinn::ConnectionError::LocallyClosed if ctx.is_stopping() => {}
        quinn::ConnectionError::ApplicationClosed(c)
            if c.error_code == VarInt::from_u32(CLOSE_REPLACED) =>
        {
            tracing::info!("QUIC connection with {from} replaced by a newer one")
        }
        quinn::ConnectionError::ApplicationClosed(c) => tracing::warn!(
            "QUIC connection with {from} closed by the peer: {}",
            String::from_utf8_lossy(&c.reason)
        ),
        e => tracing::warn!("QUIC connection with {from} lost: {e}"),
    }
}

pub(super) fn log_closed(ctx: &Ctx, cur: &Current, e: &quinn::ConnectionError) {
    if ctx.is_stopping() {
        return; // the shutdown summary follows
    }
    if Tally::is_transport_close(e) {
        let n = ctx.link.tally.lost.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::warn!(
            closed_by_transport = n,
            "QUIC connection closed by the transport ({n} so far): {e}"
        );
    }
    log_closed_reason(ctx, cur.conn.remote_address(), e);
    log_conn_summary(ctx, cur, "at close");
}

/// quinn's view of a connection: path, loss, offloads and the receive windows it granted.
pub(super) fn log_conn_summary(ctx: &Ctx, cur: &Current, when: &str) {
    let st = cur.conn.stats();
    let bytes = cur.counters.stream_bytes_read.load(Ordering::Relaxed);
    let read = cur.counters.datagrams_read.load(Ordering::Relaxed);
    // quinn sends MAX_STREAM_DATA/MAX_DATA only once a window's worth / 8 has been read since
    // the last one, so bytes × 8 / frames is at least the window in effect, and close to it.
    let window = |frames: u64| match (bytes * 8).checked_div(frames) {
        _ if bytes == 0 => "no stream data".to_string(),
        Some(w) => w.to_string(),
        None => format!("none sent: window > {bytes}"),
    };
    let mode_part = match ctx.mode {
        QuicMode::Stream => format!(
            "stream bytes read {bytes} in {} chunks (a stream each), MAX_DATA sent {} (connection window in effect ≈ {}), MAX_STREAMS sent {}, STREAMS_BLOCKED sent {} (the peer's limit of {} open streams reached), MAX_STREAM_DATA sent {}, waits for quinn's credit, streams or send buffer {} ({} ms)",
            cur.counters.chunks_read.load(Ordering::Relaxed),
            st.frame_tx.max_data,
            window(st.frame_tx.max_data),
            st.frame_tx.max_streams_uni,
            st.frame_tx.streams_blocked_uni,
            streams::MAX_OPEN_STREAMS,
            st.frame_tx.max_stream_data,
            cur.counters.send_waits.load(Ordering::Relaxed),
            cur.counters.send_wait_us.load(Ordering::Relaxed) / 1000
        ),
        QuicMode::Datagram => format!(
            "datagrams received {} read {} (dropped in quinn's receive buffer {}), sent {}, waits for quinn's send buffer {} ({} ms)",
            st.frame_rx.datagram,
            read,
            st.frame_rx.datagram.saturating_sub(read),
            st.frame_tx.datagram,
            cur.counters.send_waits.load(Ordering::Relaxed),
            cur.counters.send_wait_us.load(Ordering::Relaxed) / 1000
        ),
    };
    tracing::info!(
        "QUIC stats {when} ({}): rtt {:?} cwnd {} congestion events {} lost packets {} of {} sent, black holes {}, udp mtu {}, udp tx {} datagrams in {} ios, {mode_part}",
        cur.conn.remote_address(),
        st.path.rtt,
        st.path.cwnd,
        st.path.congestion_events,
        st.path.lost_packets,
        st.path.sent_packets,
        st.path.black_holes_detected,
        st.path.current_mtu,
        st.udp_tx.datagrams,
        st.udp_tx.ios,
    );
}
