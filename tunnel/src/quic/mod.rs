//! WireGuard over QUIC (quinn 0.11, rustls on ring).
//!
//! `--quic.mode datagram` (default) carries one WireGuard packet per QUIC DATAGRAM frame;
//! `--quic.mode stream` carries them length-prefixed (2 bytes, big endian, as the TCP transport)
//! in chunks, each on a unidirectional stream of its own, read back in order ([`streams`]: one
//! stream could not survive loss), where QUIC's flow-control windows bound one tunnelled flow.
//! With `--buffer-policy recommended` the windows come from `bufscope-policy` (stream mode: its
//! 16 MiB stream window twice over, as the connection's window; 64 MiB send), otherwise they
//! are quinn's defaults (stream mode: its 1.25 MB stream window as the connection's); the
//! outer UDP socket is
//! sized like the UDP transport's. The side with an endpoint connects (and reconnects); the
//! other listens. The handshake is authenticated by certificates derived from the WireGuard
//! keys ([`tls`]), and the ALPN carries the mode.
//!
//! Threads: a tokio runtime (quinn's endpoint and connection drivers, the connection manager
//! and the receive task: QUIC → decrypt → TUN), one plain thread for TUN → encrypt → QUIC (it
//! waits for quinn's buffers with `block_on`, so a full congestion window or flow-control window
//! pushes back on the TUN), and boringtun's timers.

mod congestion;
mod connect;
mod datapath;
mod report;
mod serve;
mod socket;
mod streams;
mod tls;
mod transport;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context as _, Result};
use bufscope_policy::Transport;
use bytes::Bytes;
use quinn::{Connection, Endpoint, EndpointConfig, VarInt};
use tokio::sync::watch;

use crate::config::{QuicMode, Settings, TransportKind};
use crate::sys::{Shutdown, Wake, wait_readable};
use crate::tun::Tun;
use crate::wg::{self, Ends, Peer, Stats};
use crate::{Workers, spawn};
use tls::Role;
pub use transport::EffectiveConfig;

/// Application close codes (QUIC CONNECTION_CLOSE of type application).
const CLOSE_SHUTDOWN: u32 = 0;
/// The peer uses another `--quic.mode`.
const CLOSE_MODE_MISMATCH: u32 = 0x4d;
/// A newer authenticated connection from the same peer replaced this one.
const CLOSE_REPLACED: u32 = 0x52;

/// Per-connection counts of what the receive task read from quinn.
#[derive(Default)]
struct ConnCounters {
    datagrams_read: AtomicU64,
    stream_bytes_read: AtomicU64,
    /// Stream mode: chunks (streams) read to their end.
    chunks_read: AtomicU64,
    /// Times the TUN → QUIC thread waited for quinn (quinn's windows, not the TUN, set the
    /// pace): in datagram mode for room in its datagram send buffer, in stream mode for a
    /// stream's flow-control credit or room in its send buffer (writes of 1 ms or more) ...
    send_waits: AtomicU64,
    /// ... and the microseconds it waited in all.
    send_wait_us: AtomicU64,
}

/// The connection in use.
#[derive(Clone)]
struct Current {
    id: u64,
    conn: Connection,
    /// Stream mode: this end's sending half (only the writer thread writes).
    send: Option<Arc<tokio::sync::Mutex<streams::Sender>>>,
    counters: Arc<ConnCounters>,
}

impl Current {
    /// A new connection in use: datagram mode checks the datagram size.
    async fn new(ctx: &Ctx, conn: Connection) -> Result<Current> {
        let send = match ctx.mode {
            QuicMode::Datagram => {
                report::check_datagrams(&conn, ctx.mtu);
                None
            }
            QuicMode::Stream => Some(Arc::new(tokio::sync::Mutex::new(streams::Sender::new(
                conn.clone(),
                ctx.chunk,
            )))),
        };
        ctx.link.tally.established();
        Ok(Current {
            id: ctx.link.next_id.fetch_add(1, Ordering::Relaxed),
            conn,
            send,
            counters: Arc::new(ConnCounters::default()),
        })
    }
}

/// The current connection and the stream writer's control queue.
struct Link {
    current: Mutex<Option<Current>>,
    next_id: AtomicU64,
    control: crate::framing::Control,
    mode: QuicMode,
    /// Connections made and lost over the process's life.
    tally: report::Tally,
}

impl Link {
    fn lock(&self) -> MutexGuard<'_, Option<Current>> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn current(&self) -> Option<Current> {
        self.lock().clone()
    }

    /// Makes `cur` the connection in use, closing the previous one.
    fn install(&self, cur: Current) {
        if let Some(old) = self.lock().replace(cur) {
            old.conn.close(
                VarInt::from_u32(CLOSE_REPLACED),
                b"replaced by a newer connection",
            );
        }
        // The writer may be waiting for a connection.
        self.control.ready.notify();
    }

    /// Forgets connection `id` if it is the current one.
    fn drop_conn(&self, id: u64) {
        let mut cur = self.lock();
        if cur.as_ref().is_some_and(|c| c.id == id) {
            cur.take();
        }
    }

    /// Sends a handshake/keepalive packet: as a datagram, or through the stream writer.
    fn send_control(&self, p: &[u8], peer: &Peer) {
        match self.mode {
            QuicMode::Datagram => {
                if let Some(cur) = self.current() {
                    match cur.conn.send_datagram(Bytes::copy_from_slice(p)) {
                        Ok(()) => Stats::add(&peer.stats.net_out, 1),
                        Err(e) => tracing::debug!("sending a control datagram: {e}"),
                    }
                }
            }
            QuicMode::Stream => self.control.push(p),
        }
    }
}

/// What the data path and the managers share.
#[derive(Clone)]
struct Ctx {
    ends: Ends,
    link: Arc<Link>,
    stop: watch::Receiver<bool>,
    handle: tokio::runtime::Handle,
    mode: QuicMode,
    mtu: u16,
    sock: Arc<socket::Counters>,
    max_gso: usize,
    max_gro: usize,
    /// Stream mode: bytes of frames per chunk at most ([`streams::chunk_limit`] of the
    /// connection window this end grants; both ends of a tunnel run the same policy).
    chunk: usize,
}

impl Ctx {
    /// Resolves when shutdown starts.
    async fn stopped(&self) {
        let mut stop = self.stop.clone();
        let _ = stop.wait_for(|s| *s).await;
    }

    fn is_stopping(&self) -> bool {
        self.ends.shutdown.is_triggered()
    }
}

/// Starts the QUIC transport: the first connection (client side) or the listener, the
/// runtime thread, the TUN → QUIC thread and the timers.
pub fn start(s: &Settings, tun: Arc<Tun>, peer: Arc<Peer>, shutdown: &Shutdown) -> Result<Workers> {
    debug_assert_eq!(s.transport, TransportKind::Quic);
    let role = if s.endpoint.is_some() {
        Role::Client
    } else {
        Role::Server
    };
    let transport = Arc::new(transport::transport_config(s)?);
    log_windows(s, &transport)?;
    let chunk = streams::chunk_limit(transport::EffectiveConfig::read(&transport)?.receive_window);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("quic")
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let (endpoint, sock) = {
        let _guard = rt.enter();
        build_endpoint(s, role, transport)?
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let ctx = Ctx {
        ends: Ends::new(tun, peer, shutdown),
        link: Arc::new(Link {
            current: Mutex::new(None),
            next_id: AtomicU64::new(1),
            control: crate::framing::Control::new().context("cannot create an eventfd")?,
            mode: s.quic_mode,
            tally: report::Tally::default(),
        }),
        stop: stop_rx,
        handle: rt.handle().clone(),
        mode: s.quic_mode,
        mtu: s.mtu,
        sock: sock.counters,
        max_gso: sock.max_gso,
        max_gro: sock.max_gro,
        chunk,
    };
    // Client: the first connection now, so that a wrong peer is a clear startup error.
    let first = match s.endpoint {
        Some(ep) => {
            let cur = rt.block_on(connect::connect_first(
                &ctx,
                &endpoint,
                ep,
                s.connect_timeout,
            ))?;
            connect::install_client(&ctx, cur.clone());
            Some((ep, cur))
        }
        None => None,
    };
    let mut threads = vec![spawn_runtime(&ctx, rt, endpoint, first, stop_tx)?];
    let c = ctx.clone();
    threads.push(spawn("tun-to-quic", move || datapath::tun_to_quic(&c))?);
    let c = ctx;
    threads.push(spawn("timers", move || {
        wg::run_timers(&c.ends.peer, &c.ends.shutdown, |p| {
            c.link.send_control(p, &c.ends.peer)
        });
        Ok(())
    })?);
    Ok(threads)
}

/// Logs the windows and buffers quinn was given, read back from its `TransportConfig`.
fn log_windows(s: &Settings, transport: &quinn::TransportConfig) -> Result<()> {
    let eff = EffectiveConfig::read(transport)?;
    let max_streams = match s.quic_mode {
        QuicMode::Stream => streams::MAX_OPEN_STREAMS,
        QuicMode::Datagram => 0,
    };
    tracing::info!(
        mode = %s.quic_mode,
        congestion = %s.congestion,
        buffer_policy = %s.buffer_policy,
        stream_receive_window = eff.stream_receive_window,
        max_streams,
        receive_window = eff.receive_window,
        send_window = eff.send_window,
        datagram_receive_buffer = ?eff.datagram_receive_buffer,
        datagram_send_buffer = eff.datagram_send_buffer,
        initial_mtu = eff.initial_mtu,
        "QUIC windows in effect (read back from quinn's TransportConfig): connection {}, stream {} (a stream per chunk, {max_streams} open at most), send {}",
        eff.receive_window,
        eff.stream_receive_window,
        eff.send_window
    );
    Ok(())
}

/// The outer socket as quinn sees it: the counting wrapper and quinn-udp's offloads.
struct Sock {
    counters: Arc<socket::Counters>,
    max_gso: usize,
    max_gro: usize,
}

/// The outer UDP socket (sized by the buffer policy) under a quinn endpoint of `role`. Runs
/// inside the tokio runtime.
fn build_endpoint(
    s: &Settings,
    role: Role,
    transport: Arc<quinn::TransportConfig>,
) -> Result<(Endpoint, Sock)> {
    let pinned = tls::pinned(&s.private_key, &s.peer_public_key, s.preshared_key, role)?;
    let v6 = s.endpoint.is_some_and(|e| e.is_ipv6());
    // The connecting side also uses ListenPort, if given, as its source port.
    let std_sock = crate::udp::bind_outer(
        s.listen_port.unwrap_or(0),
        v6,
        s.buffer_policy,
        Transport::Quic,
        s.target,
        "outer QUIC (UDP) socket",
    )?;
    let runtime = Arc::new(quinn::TokioRuntime);
    let inner = quinn::Runtime::wrap_udp_socket(&*runtime, std_sock)
        .context("cannot hand the UDP socket to quinn")?;
    let metered = Arc::new(socket::Metered::new(
        inner,
        s.quic_mode == QuicMode::Datagram,
    ));
    let sock = Sock {
        counters: metered.counters.clone(),
        max_gso: quinn::AsyncUdpSocket::max_transmit_segments(&*metered),
        max_gro: quinn::AsyncUdpSocket::max_receive_segments(&*metered),
    };
    let server = match role {
        Role::Server => {
            let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls::server_config(
                &pinned,
                s.quic_mode,
            )?)
            .context("QUIC server TLS configuration")?;
            let mut sc = quinn::ServerConfig::with_crypto(Arc::new(crypto));
            sc.transport_config(transport.clone());
            Some(sc)
        }
        Role::Client => None,
    };
    let mut config = EndpointConfig::default();
    let cid_len = match role {
        Role::Server => transport::SERVER_CID_LEN,
        Role::Client => transport::CLIENT_CID_LEN,
    };
    config.cid_generator(move || Box::new(transport::RandomCids(cid_len)));
    let mut ep = Endpoint::new_with_abstract_socket(config, server, metered, runtime)
        .context("cannot create the QUIC endpoint")?;
    if role == Role::Client {
        let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls::client_config(
            &pinned,
            s.quic_mode,
        )?)
        .context("QUIC client TLS configuration")?;
        let mut cc = quinn::ClientConfig::new(Arc::new(crypto));
        cc.transport_config(transport);
        ep.set_default_client_config(cc);
    }
    tracing::info!(
        gso_segments = sock.max_gso,
        gro_segments = sock.max_gro,
        "listening on udp {} (QUIC, {} side); quinn-udp offloads: GSO up to {} datagrams per send, GRO up to {} per receive",
        ep.local_addr()
            .map_or_else(|e| e.to_string(), |a| a.to_string()),
        match role {
            Role::Server => "listening",
            Role::Client => "connecting",
        },
        sock.max_gso,
        sock.max_gro
    );
    Ok((ep, sock))
}

/// The thread that runs the tokio runtime: the connection manager until shutdown, then the
/// shutdown summary and a CONNECTION_CLOSE for the peer.
fn spawn_runtime(
    ctx: &Ctx,
    rt: tokio::runtime::Runtime,
    endpoint: Endpoint,
    first: Option<(std::net::SocketAddr, Current)>,
    stop_tx: watch::Sender<bool>,
) -> Result<crate::Worker> {
    let c = ctx.clone();
    spawn("quic", move || {
        let result = rt.block_on(async {
            // The shutdown eventfd is blocking; watch it from the blocking pool.
            let sd = c.ends.shutdown.clone();
            let watcher = tokio::task::spawn_blocking(move || {
                while wait_readable(-1, None, &sd, None).is_ok_and(|w| w != Wake::Shutdown) {}
                let _ = stop_tx.send(true);
            });
            let r = match first {
                Some((ep, cur)) => connect::client_manager(&c, &endpoint, ep, cur).await,
                None => serve::server_manager(&c, &endpoint).await,
            };
            if let Some(cur) = c.link.current() {
                report::log_conn_summary(&c, &cur, "at shutdown");
                cur.conn.close(
                    VarInt::from_u32(CLOSE_SHUTDOWN),
                    b"bufscope-tunnel shutting down",
                );
            }
            // Let the CONNECTION_CLOSE reach the peer.
            let _ = tokio::time::timeout(Duration::from_millis(500), endpoint.wait_idle()).await;
            tracing::info!("{}", c.sock.summary(c.max_gso, c.max_gro));
            tracing::info!("{}", c.link.tally.summary());
            watcher.abort();
            r
        });
        rt.shutdown_timeout(Duration::from_millis(200));
        result
    })
}

/// Starts the receive task of a connection (stream mode: with the peer's first stream if it
/// was accepted already).
fn spawn_receiver(ctx: &Ctx, cur: &Current, first: Option<quinn::RecvStream>) {
    if tracing::enabled!(tracing::Level::DEBUG) {
        ctx.handle.spawn(report::sample_path(cur.clone()));
    }
    let c = ctx.clone();
    let cur = cur.clone();
    ctx.handle.spawn(async move {
        let r = match c.mode {
            QuicMode::Stream => {
                let rx = streams::Receiver::new(cur.conn.clone(), first);
                datapath::stream_to_tun(&c, &cur, rx).await
            }
            QuicMode::Datagram => datapath::datagrams_to_tun(&c, &cur).await,
        };
        if let Err(e) = r
            && !c.is_stopping()
        {
            tracing::warn!("QUIC receive task for {}: {e:#}", cur.conn.remote_address());
            cur.conn
                .close(VarInt::from_u32(CLOSE_SHUTDOWN), b"receive error");
        }
    });
}
