//! WireGuard over QUIC (quinn 0.11, rustls on ring).
//!
//! `--quic.mode datagram` (default) carries one WireGuard packet per QUIC DATAGRAM frame;
//! `--quic.mode stream` carries them length-prefixed (2 bytes, big endian, as the TCP transport)
//! in one bidirectional stream, where QUIC's flow-control windows bound one tunnelled flow.
//! With `--buffer-policy recommended` the windows come from `bufscope-policy` (16 MiB stream,
//! 64 MiB connection, 64 MiB send), otherwise they are quinn's defaults; the outer UDP socket is
//! sized like the UDP transport's. The side with an endpoint connects (and reconnects); the
//! other listens. The handshake is authenticated by certificates derived from the WireGuard
//! keys ([`tls`]), and the ALPN carries the mode.
//!
//! Threads: a tokio runtime (quinn's endpoint and connection drivers, the connection manager
//! and the receive task: QUIC → decrypt → TUN), one plain thread for TUN → encrypt → QUIC (it
//! waits for quinn's buffers with `block_on`, so a full congestion window or flow-control window
//! pushes back on the TUN), and boringtun's timers.

mod congestion;
mod datapath;
mod socket;
mod tls;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use bufscope_policy::{Plan, Target, Transport};
use bytes::Bytes;
use quinn::{Connection, Endpoint, EndpointConfig, SendStream, TransportConfig, VarInt};
use tokio::sync::watch;

use crate::config::{
    BufferPolicy, Congestion, QUIC_INITIAL_MTU, QuicMode, Settings, TransportKind,
};
use crate::sys::{Shutdown, Wake, wait_readable};
use crate::tun::Tun;
use crate::wg::{self, Ends, Peer, Stats};
use crate::{Workers, spawn};
use tls::Role;

/// Application close codes (QUIC CONNECTION_CLOSE of type application).
const CLOSE_SHUTDOWN: u32 = 0;
/// The peer uses another `--quic.mode`.
const CLOSE_MODE_MISMATCH: u32 = 0x4d;
/// A newer authenticated connection from the same peer replaced this one.
const CLOSE_REPLACED: u32 = 0x52;
/// quinn keeps the path alive (and notices a dead peer) with this interval ...
const KEEP_ALIVE: Duration = Duration::from_secs(5);
/// ... and gives a silent connection up after this long.
const IDLE_TIMEOUT: Duration = Duration::from_secs(15);
/// Connection ID length of the listening side (quinn's default is 8). It has one peer, so 4
/// random bytes route unambiguously, and keeping a CID (unlike the connecting side) lets the
/// peer's address change (NAT rebinding) without a new handshake.
const SERVER_CID_LEN: usize = 4;
/// Connection ID length of the connecting side: none. It has one connection to one address,
/// which quinn routes by that address.
///
/// Shorter CIDs leave room in a full-size QUIC packet next to a WireGuard packet of the default
/// datagram-mode MTU, so quinn piggybacks its ACK frames there instead of sending ACK-only
/// packets: measured at 50 ms / 200 Mbit/s, ACK-only packets went from 14% to 3% of the data
/// sender's packets and one inner flow from 179 to 181 Mbit/s (the ceiling is ~181).
const CLIENT_CID_LEN: usize = 0;

/// Datagram mode asks the peer (QUIC ACK frequency extension) to acknowledge every 8th
/// ack-eliciting packet instead of every 2nd (or after its max_ack_delay). Each end of a
/// tunnelled TCP flow receives the other's segments or ACKs as datagrams, and with quinn's
/// default the data sender acknowledged the inner ACKs so often that its ACK frames did not
/// all fit beside full-size datagrams: measured at 50 and 190 ms / 200 Mbit/s, 15–21% of
/// the packets each end sent were ACK-only (10–15% with ECN counters hidden, see
/// `socket::Metered::new`); with this none are, and one inner flow gained up to 1 Mbit/s
/// (180.2–181.1 Mbit/s in all four directions over three runs, against 179.5–181.2 and one
/// 175.5 without it). Losses are detected from the later ACKs all the same (quinn's ACK
/// ranges and time threshold), and the pinned MTU keeps its black-hole detector out of it.
const DATAGRAM_ACK_ELICITING_THRESHOLD: u32 = 7;

/// Random connection IDs of a fixed length (quinn routes zero-length ones by address).
struct RandomCids(usize);

impl quinn::ConnectionIdGenerator for RandomCids {
    fn generate_cid(&mut self) -> quinn::ConnectionId {
        let mut b = [0u8; 20];
        let n = self.0.min(b.len());
        if ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b[..n]).is_err() {
            // The system RNG failing leaves a fixed ID: routing still works (one peer).
            tracing::debug!("system RNG failed generating a connection ID");
        }
        quinn::ConnectionId::new(&b[..n])
    }

    fn cid_len(&self) -> usize {
        self.0
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

/// Per-connection counts of what the receive task read from quinn.
#[derive(Default)]
struct ConnCounters {
    datagrams_read: AtomicU64,
    stream_bytes_read: AtomicU64,
    /// Datagram mode: times the TUN → QUIC thread found quinn's datagram send buffer full and
    /// waited (quinn's congestion window, not the TUN, set the pace) ...
    send_waits: AtomicU64,
    /// ... and the microseconds it waited in all.
    send_wait_us: AtomicU64,
}

/// The connection in use.
#[derive(Clone)]
struct Current {
    id: u64,
    conn: Connection,
    /// Stream mode: our half of the one bidirectional stream (only the writer thread writes).
    send: Option<Arc<tokio::sync::Mutex<SendStream>>>,
    counters: Arc<ConnCounters>,
}

/// The current connection and the stream writer's control queue.
struct Link {
    current: Mutex<Option<Current>>,
    next_id: AtomicU64,
    control: crate::framing::Control,
    mode: QuicMode,
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

/// The QUIC windows and buffers quinn was given, read back from its `TransportConfig` (it has
/// no getters, but its `Debug` lists every field).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EffectiveConfig {
    /// `stream_receive_window`.
    pub stream_receive_window: u64,
    /// `receive_window` (connection).
    pub receive_window: u64,
    /// `send_window`.
    pub send_window: u64,
    /// `datagram_receive_buffer_size` (`None`: datagrams refused).
    pub datagram_receive_buffer: Option<u64>,
    /// `datagram_send_buffer_size`.
    pub datagram_send_buffer: u64,
    /// `initial_mtu`.
    pub initial_mtu: u64,
}

impl EffectiveConfig {
    /// Parses quinn's `Debug` of a `TransportConfig`.
    pub fn read(t: &TransportConfig) -> Result<Self> {
        let text = format!("{t:?}");
        let field = |name: &str| -> Result<&str> {
            let start = text
                .find(&format!(" {name}: "))
                .with_context(|| format!("quinn's TransportConfig has no {name}: {text}"))?
                + name.len()
                + 3;
            let rest = &text[start..];
            Ok(rest[..rest.find([',', '}']).unwrap_or(rest.len())].trim())
        };
        let num = |name: &str| -> Result<u64> {
            let v = field(name)?;
            v.parse()
                .with_context(|| format!("quinn's {name} is {v:?}, not a number"))
        };
        let dgram = field("datagram_receive_buffer_size")?;
        let datagram_receive_buffer = match dgram.strip_prefix("Some(") {
            Some(v) => Some(
                v.trim_end_matches(')')
                    .parse()
                    .with_context(|| format!("datagram_receive_buffer_size {dgram:?}"))?,
            ),
            None => None,
        };
        Ok(Self {
            stream_receive_window: num("stream_receive_window")?,
            receive_window: num("receive_window")?,
            send_window: num("send_window")?,
            datagram_receive_buffer,
            datagram_send_buffer: num("datagram_send_buffer_size")?,
            initial_mtu: num("initial_mtu")?,
        })
    }
}

/// quinn's transport configuration for these settings.
fn transport_config(s: &Settings) -> Result<TransportConfig> {
    let mut t = TransportConfig::default();
    if s.buffer_policy == BufferPolicy::Recommended {
        let plan = Plan::for_current(Transport::Quic, s.target);
        let w = plan
            .quic
            .context("bufscope-policy gave no QUIC windows for a QUIC plan")?;
        let varint = |v: u64| VarInt::from_u64(v).map_err(|_| anyhow!("window {v} too large"));
        t.stream_receive_window(varint(w.stream_receive)?)
            .receive_window(varint(w.connection_receive)?)
            .send_window(w.send);
        // Waiting datagrams play the part of a UDP receive buffer: size them like one.
        if let bufscope_policy::Buffers::Set { receive, .. } = plan.buffers {
            t.datagram_receive_buffer_size(Some(receive));
        }
    }
    // The path is assumed to carry 1452-byte UDP payloads from the start, as WireGuard at MTU
    // 1420 assumes 1500-byte IPv6 packets: quinn's `min_mtu` too, because its black-hole
    // detector takes loss bursts of full-size packets for an MTU black hole and falls back to
    // `min_mtu`, and in a tunnel nearly every packet is full-size, so congestion losses look
    // exactly like that (measured at 190 ms: datagram mode fell to 1200-byte packets, where no
    // WireGuard packet fits, and to 20 Mbit/s). Nothing above 1452 is probed.
    t.initial_mtu(QUIC_INITIAL_MTU)
        .min_mtu(QUIC_INITIAL_MTU)
        .mtu_discovery_config(None)
        .keep_alive_interval(Some(KEEP_ALIVE))
        .max_idle_timeout(Some(
            IDLE_TIMEOUT
                .try_into()
                .map_err(|_| anyhow!("idle timeout out of range"))?,
        ))
        .max_concurrent_uni_streams(VarInt::from_u32(0))
        .max_concurrent_bidi_streams(VarInt::from_u32(match s.quic_mode {
            QuicMode::Stream => 1,
            QuicMode::Datagram => 0,
        }));
    if s.quic_mode == QuicMode::Datagram {
        let mut af = quinn::AckFrequencyConfig::default();
        af.ack_eliciting_threshold(VarInt::from_u32(DATAGRAM_ACK_ELICITING_THRESHOLD));
        t.ack_frequency_config(Some(af));
    }
    match s.congestion {
        Congestion::Tunnel => t.congestion_controller_factory(Arc::new(match s.quic_mode {
            QuicMode::Datagram => congestion::TunnelConfig::datagram(window_floor(s.target)),
            QuicMode::Stream => congestion::TunnelConfig::stream(window_floor(s.target)),
        })),
        Congestion::Cubic => {
            t.congestion_controller_factory(Arc::new(quinn::congestion::CubicConfig::default()))
        }
        Congestion::Bbr => {
            t.congestion_controller_factory(Arc::new(quinn::congestion::BbrConfig::default()))
        }
    };
    Ok(t)
}

/// The `tunnel` controller's window floor: the policy's UDP buffer for the path (7 MiB, or the
/// BDP of the targets), whatever `--buffer-policy` does with the socket.
fn window_floor(target: Option<Target>) -> u64 {
    match Plan::for_current(Transport::Quic, target).buffers {
        bufscope_policy::Buffers::Set { receive, .. } => receive as u64,
        bufscope_policy::Buffers::LeaveAlone => bufscope_policy::UDP_DEFAULT_BUFFER as u64,
    }
}

/// The congestion controller a connection actually runs.
fn controller_name(conn: &Connection) -> &'static str {
    let any = conn.congestion_state().into_any();
    if any.is::<quinn::congestion::Cubic>() {
        "cubic"
    } else if any.is::<quinn::congestion::Bbr>() {
        "bbr"
    } else if any.is::<congestion::Tunnel>() {
        "tunnel"
    } else if any.is::<quinn::congestion::NewReno>() {
        "newreno"
    } else {
        "other"
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
    let pinned = tls::pinned(&s.private_key, &s.peer_public_key, s.preshared_key, role)?;
    let transport = transport_config(s)?;
    let eff = EffectiveConfig::read(&transport)?;
    let transport = Arc::new(transport);
    tracing::info!(
        mode = %s.quic_mode,
        congestion = %s.congestion,
        buffer_policy = %s.buffer_policy,
        stream_receive_window = eff.stream_receive_window,
        receive_window = eff.receive_window,
        send_window = eff.send_window,
        datagram_receive_buffer = ?eff.datagram_receive_buffer,
        datagram_send_buffer = eff.datagram_send_buffer,
        initial_mtu = eff.initial_mtu,
        "QUIC windows in effect (read back from quinn's TransportConfig): stream {} connection {} send {}",
        eff.stream_receive_window,
        eff.receive_window,
        eff.send_window
    );

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("quic")
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let v6 = s.endpoint.is_some_and(|e| e.is_ipv6());
    // The connecting side also uses ListenPort, if given, as its source port.
    let port = s.listen_port.unwrap_or(0);
    let std_sock = crate::udp::bind_outer(
        port,
        v6,
        s.buffer_policy,
        Transport::Quic,
        s.target,
        "outer QUIC (UDP) socket",
    )?;
    let (endpoint, counters, max_gso, max_gro) = {
        let _guard = rt.enter();
        let runtime = Arc::new(quinn::TokioRuntime);
        let inner = quinn::Runtime::wrap_udp_socket(&*runtime, std_sock)
            .context("cannot hand the UDP socket to quinn")?;
        let metered = Arc::new(socket::Metered::new(
            inner,
            s.quic_mode == QuicMode::Datagram,
        ));
        let counters = metered.counters.clone();
        let (max_gso, max_gro) = (
            quinn::AsyncUdpSocket::max_transmit_segments(&*metered),
            quinn::AsyncUdpSocket::max_receive_segments(&*metered),
        );
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
            Role::Server => SERVER_CID_LEN,
            Role::Client => CLIENT_CID_LEN,
        };
        config.cid_generator(move || Box::new(RandomCids(cid_len)));
        let mut ep = Endpoint::new_with_abstract_socket(config, server, metered, runtime)
            .context("cannot create the QUIC endpoint")?;
        if role == Role::Client {
            let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls::client_config(
                &pinned,
                s.quic_mode,
            )?)
            .context("QUIC client TLS configuration")?;
            let mut cc = quinn::ClientConfig::new(Arc::new(crypto));
            cc.transport_config(transport.clone());
            ep.set_default_client_config(cc);
        }
        (ep, counters, max_gso, max_gro)
    };
    tracing::info!(
        gso_segments = max_gso,
        gro_segments = max_gro,
        "listening on udp {} (QUIC, {} side); quinn-udp offloads: GSO up to {max_gso} datagrams per send, GRO up to {max_gro} per receive",
        endpoint
            .local_addr()
            .map_or_else(|e| e.to_string(), |a| a.to_string()),
        match role {
            Role::Server => "listening",
            Role::Client => "connecting",
        }
    );

    let (stop_tx, stop_rx) = watch::channel(false);
    let link = Arc::new(Link {
        current: Mutex::new(None),
        next_id: AtomicU64::new(1),
        control: crate::framing::Control::new().context("cannot create an eventfd")?,
        mode: s.quic_mode,
    });
    let ctx = Ctx {
        ends: Ends::new(tun, peer, shutdown),
        link,
        stop: stop_rx,
        handle: rt.handle().clone(),
        mode: s.quic_mode,
        mtu: s.mtu,
        sock: counters,
        max_gso,
        max_gro,
    };

    // Client: the first connection now, so that a wrong peer is a clear startup error.
    let first = match s.endpoint {
        Some(ep) => {
            let cur = rt.block_on(connect_first(&ctx, &endpoint, ep, s.connect_timeout))?;
            install_client(&ctx, cur.clone());
            Some((ep, cur))
        }
        None => None,
    };

    let mut threads = Vec::new();
    {
        let c = ctx.clone();
        threads.push(spawn("quic", move || {
            let result = rt.block_on(async {
                // The shutdown eventfd is blocking; watch it from the blocking pool.
                let sd = c.ends.shutdown.clone();
                let watcher = tokio::task::spawn_blocking(move || {
                    while wait_readable(-1, None, &sd, None).is_ok_and(|w| w != Wake::Shutdown) {}
                    let _ = stop_tx.send(true);
                });
                let r = match first {
                    Some((ep, cur)) => client_manager(&c, &endpoint, ep, cur).await,
                    None => server_manager(&c, &endpoint).await,
                };
                if let Some(cur) = c.link.current() {
                    log_conn_summary(&c, &cur, "at shutdown");
                    cur.conn.close(
                        VarInt::from_u32(CLOSE_SHUTDOWN),
                        b"bufscope-tunnel shutting down",
                    );
                }
                // Let the CONNECTION_CLOSE reach the peer.
                let _ =
                    tokio::time::timeout(Duration::from_millis(500), endpoint.wait_idle()).await;
                tracing::info!("{}", c.sock.summary(c.max_gso, c.max_gro));
                watcher.abort();
                r
            });
            rt.shutdown_timeout(Duration::from_millis(200));
            result
        })?);
    }
    {
        let c = ctx.clone();
        threads.push(spawn("tun-to-quic", move || datapath::tun_to_quic(&c))?);
    }
    {
        let c = ctx.clone();
        threads.push(spawn("timers", move || {
            wg::run_timers(&c.ends.peer, &c.ends.shutdown, |p| {
                c.link.send_control(p, &c.ends.peer)
            });
            Ok(())
        })?);
    }
    Ok(threads)
}

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
    let send = match ctx.mode {
        QuicMode::Datagram => {
            check_datagrams(&conn, ctx.mtu);
            None
        }
        QuicMode::Stream => {
            let (send, recv) = conn.open_bi().await.map_err(|e| {
                ConnectError::retry(anyhow!("cannot open the QUIC stream to {peer}: {e}"))
            })?;
            Some((send, recv))
        }
    };
    let id = ctx.link.next_id.fetch_add(1, Ordering::Relaxed);
    let counters = Arc::new(ConnCounters::default());
    let (send, recv) = match send {
        Some((s, r)) => (Some(Arc::new(tokio::sync::Mutex::new(s))), Some(r)),
        None => (None, None),
    };
    let cur = Current {
        id,
        conn,
        send,
        counters,
    };
    log_connected(ctx, &cur, "connected to");
    spawn_receiver(ctx, &cur, recv);
    Ok(cur)
}

/// Gives quinn a moment to send a CONNECTION_CLOSE before the process exits on a fatal error,
/// so that the peer logs why instead of waiting for the idle timeout.
async fn flush_close(endpoint: &Endpoint) {
    let _ = tokio::time::timeout(Duration::from_millis(300), endpoint.wait_idle()).await;
}

/// Datagram mode: warns when quinn's largest datagram is smaller than a WireGuard packet.
fn check_datagrams(conn: &Connection, mtu: u16) {
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

fn log_connected(ctx: &Ctx, cur: &Current, what: &str) {
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
async fn sample_path(cur: Current) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last = cur.conn.stats();
    let mut last_waits = 0;
    let mut last_wait_us = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = cur.conn.closed() => return,
        }
        let st = cur.conn.stats();
        let waits = cur.counters.send_waits.load(Ordering::Relaxed);
        let wait_us = cur.counters.send_wait_us.load(Ordering::Relaxed);
        tracing::debug!(
            "QUIC path: rtt {:?} cwnd {} sent {} lost {} congestion events +{} datagrams out {} in {} acks out {} waits +{} ({} ms)",
            st.path.rtt,
            st.path.cwnd,
            st.path.sent_packets - last.path.sent_packets,
            st.path.lost_packets - last.path.lost_packets,
            st.path.congestion_events - last.path.congestion_events,
            st.frame_tx.datagram - last.frame_tx.datagram,
            st.frame_rx.datagram - last.frame_rx.datagram,
            st.frame_tx.acks - last.frame_tx.acks,
            waits - last_waits,
            (wait_us - last_wait_us) / 1000,
        );
        last = st;
        last_waits = waits;
        last_wait_us = wait_us;
    }
}

/// Starts the receive task of a connection.
fn spawn_receiver(ctx: &Ctx, cur: &Current, recv: Option<quinn::RecvStream>) {
    if tracing::enabled!(tracing::Level::DEBUG) {
        ctx.handle.spawn(sample_path(cur.clone()));
    }
    let c = ctx.clone();
    let cur = cur.clone();
    ctx.handle.spawn(async move {
        let r = match recv {
            Some(r) => datapath::stream_to_tun(&c, &cur, r).await,
            None => datapath::datagrams_to_tun(&c, &cur).await,
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

/// Client side: installs a new connection and starts a WireGuard handshake on it (stream mode
/// needs a first write for the peer to see the stream; any mode may have lost the last one).
fn install_client(ctx: &Ctx, cur: Current) {
    ctx.ends.peer.set_endpoint(cur.conn.remote_address());
    ctx.link.install(cur);
    wg::initiate(&ctx.ends.peer, false, |p| {
        ctx.link.send_control(p, &ctx.ends.peer)
    });
}

async fn connect_first(
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
async fn client_manager(
    ctx: &Ctx,
    endpoint: &Endpoint,
    peer: SocketAddr,
    mut cur: Current,
) -> Result<()> {
    loop {
        tokio::select! {
            e = cur.conn.closed() => {
                log_closed(ctx, &cur, &e);
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
                    tracing::info!("QUIC reconnected to {peer}");
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

/// Server: accepts connections; each authenticated one (the handshake pins the peer's
/// certificate) replaces the current one.
async fn server_manager(ctx: &Ctx, endpoint: &Endpoint) -> Result<()> {
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
            log_closed_reason(ctx, from, &e);
            return Ok(());
        }
        Err(e) => bail!("handshake failed (not our peer, or wrong keys): {e}"),
    };
    let recv = match ctx.mode {
        QuicMode::Datagram => {
            check_datagrams(&conn, ctx.mtu);
            None
        }
        QuicMode::Stream => {
            let accepted = tokio::select! {
                r = conn.accept_bi() => r,
                _ = ctx.stopped() => return Ok(()),
            };
            match accepted {
                Ok((send, recv)) => Some((send, recv)),
                Err(e) => {
                    log_closed_reason(ctx, from, &e);
                    return Ok(());
                }
            }
        }
    };
    let (send, recv) = match recv {
        Some((s, r)) => (Some(Arc::new(tokio::sync::Mutex::new(s))), Some(r)),
        None => (None, None),
    };
    let cur = Current {
        id: ctx.link.next_id.fetch_add(1, Ordering::Relaxed),
        conn,
        send,
        counters: Arc::new(ConnCounters::default()),
    };
    if ctx.link.current().is_some() {
        tracing::info!("QUIC connection from {from} replaces the current one");
    }
    log_connected(ctx, &cur, "connection from");
    ctx.ends.peer.set_endpoint(from);
    ctx.link.install(cur.clone());
    spawn_receiver(ctx, &cur, recv);
    tokio::select! {
        e = cur.conn.closed() => {
            log_closed(ctx, &cur, &e);
            ctx.link.drop_conn(cur.id);
        }
        _ = ctx.stopped() => {}
    }
    Ok(())
}

fn log_closed_reason(ctx: &Ctx, from: SocketAddr, e: &quinn::ConnectionError) {
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

fn log_closed(ctx: &Ctx, cur: &Current, e: &quinn::ConnectionError) {
    if ctx.is_stopping() {
        return; // the shutdown summary follows
    }
    log_closed_reason(ctx, cur.conn.remote_address(), e);
    log_conn_summary(ctx, cur, "at close");
}

/// quinn's view of a connection: path, loss, offloads and the receive windows it granted.
fn log_conn_summary(ctx: &Ctx, cur: &Current, when: &str) {
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
            "stream bytes read {bytes}, MAX_STREAM_DATA sent {} (stream window in effect ≈ {}), MAX_DATA sent {} (connection window in effect ≈ {})",
            st.frame_tx.max_stream_data,
            window(st.frame_tx.max_stream_data),
            st.frame_tx.max_data,
            window(st.frame_tx.max_data)
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn effective_config_reads_quinn_defaults_and_settings() {
        let d = EffectiveConfig::read(&TransportConfig::default()).unwrap();
        // quinn 0.11: 1.25 MB stream window, unlimited connection window, 8 x 1.25 MB send.
        assert_eq!(d.stream_receive_window, 1_250_000);
        assert_eq!(d.receive_window, (1 << 62) - 1);
        assert_eq!(d.send_window, 10_000_000);
        assert_eq!(d.datagram_receive_buffer, Some(1_250_000));
        let mut t = TransportConfig::default();
        t.stream_receive_window(VarInt::from_u32(16 << 20))
            .datagram_receive_buffer_size(None)
            .send_window(3);
        let e = EffectiveConfig::read(&t).unwrap();
        assert_eq!(e.stream_receive_window, 16 << 20);
        assert_eq!(e.send_window, 3);
        assert_eq!(e.datagram_receive_buffer, None);
    }
}
