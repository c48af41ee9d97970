//! The WireGuard peer (boringtun's `Tunn`) shared by the data-path threads, and its timers.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use boringtun::noise::errors::WireGuardError;
use boringtun::noise::{Tunn, TunnResult};

use crate::config::Settings;
use crate::net::{AllowedIps, packet_dst};
use crate::sys::{Shutdown, Wake, wait_readable};
use crate::tun::{Tun, TunReader};

/// Largest packet handled anywhere (IP packets are at most 65535 bytes; WireGuard adds 32).
pub const SLOT: usize = 65536 + 64;

/// How often boringtun's timers run (keepalive, rekey, handshake retries).
const TIMER_TICK: Duration = Duration::from_millis(250);

/// Counters, logged at shutdown.
#[derive(Default)]
pub struct Stats {
    /// Packets read from the TUN device.
    pub tun_in: AtomicU64,
    /// Packets written to the TUN device.
    pub tun_out: AtomicU64,
    /// WireGuard packets sent to the peer.
    pub net_out: AtomicU64,
    /// WireGuard packets received.
    pub net_in: AtomicU64,
    /// Inner packets dropped: destination/source outside AllowedIPs, malformed.
    pub not_allowed: AtomicU64,
    /// Packets dropped for lack of a connection/endpoint or on a send error.
    pub send_dropped: AtomicU64,
    /// Received packets boringtun rejected.
    pub decap_errors: AtomicU64,
}

impl Stats {
    /// Adds `n` to a counter.
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// One line for the log.
    pub fn summary(&self) -> String {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "tun in {} out {}, net in {} out {}, dropped: not allowed {} no route/send error {} rejected {}",
            g(&self.tun_in),
            g(&self.tun_out),
            g(&self.net_in),
            g(&self.net_out),
            g(&self.not_allowed),
            g(&self.send_dropped),
            g(&self.decap_errors)
        )
    }
}

/// The one peer of this point-to-point tunnel.
pub struct Peer {
    tunn: Mutex<Tunn>,
    endpoint: Mutex<Option<SocketAddr>>,
    /// The peer's AllowedIPs.
    pub allowed: AllowedIps,
    /// Counters.
    pub stats: Stats,
}

impl Peer {
    /// A peer from the settings (its endpoint may be learnt later from authenticated packets).
    pub fn new(s: &Settings) -> Self {
        let tunn = Tunn::new(
            s.private_key.clone(),
            s.peer_public_key,
            s.preshared_key,
            s.persistent_keepalive,
            // Local index; one peer, so any value works.
            1,
            None,
        );
        Self {
            tunn: Mutex::new(tunn),
            endpoint: Mutex::new(s.endpoint),
            allowed: s.allowed_ips.clone(),
            stats: Stats::default(),
        }
    }

    /// Locks the noise state. A panic in another thread cannot leave it half-updated in a way
    /// that matters more than stopping the tunnel would, so poisoning is ignored.
    pub fn tunn(&self) -> MutexGuard<'_, Tunn> {
        self.tunn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Current endpoint.
    pub fn endpoint(&self) -> Option<SocketAddr> {
        *self.endpoint.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Roaming: the peer was authenticated from `addr`.
    pub fn set_endpoint(&self, addr: SocketAddr) {
        let mut ep = self.endpoint.lock().unwrap_or_else(|e| e.into_inner());
        if *ep != Some(addr) {
            tracing::info!("peer endpoint is now {addr}");
            *ep = Some(addr);
        }
    }
}

/// What the data-path threads of a connection-oriented transport (TCP, QUIC) share besides
/// their connection: the TUN device, the WireGuard peer and the shutdown they stop on.
#[derive(Clone)]
pub struct Ends {
    /// The TUN device.
    pub tun: Arc<Tun>,
    /// The peer (noise state, endpoint, counters).
    pub peer: Arc<Peer>,
    /// Triggered when the tunnel stops.
    pub shutdown: Shutdown,
}

impl Ends {
    /// The ends of one transport's data path.
    pub fn new(tun: Arc<Tun>, peer: Arc<Peer>, shutdown: &Shutdown) -> Self {
        Self {
            tun,
            peer,
            shutdown: shutdown.clone(),
        }
    }
}

/// Encrypts what the TUN read pending in `reader` holds (one packet, or the segments of a
/// GSO super-packet): `each` gets `peer`'s noise state and every packet. The state is locked
/// per packet, not per burst, so that the receiving thread (which needs it to decrypt the
/// inner flow's ACKs) never waits for a whole 64 KiB burst to be encrypted; on a CPU shared
/// by both threads a burst-long hold also meant a context switch to a thread that could only
/// block again. A read that cannot be split into packets is counted as not allowed.
pub fn encrypt_read(
    peer: &Peer,
    tun: &Tun,
    reader: &mut TunReader,
    mut each: impl FnMut(&mut Tunn, &[u8]),
) {
    let r = reader.emit(tun, |packet| each(&mut peer.tunn(), packet));
    if let Err(e) = r {
        tracing::debug!("unusable packet from the TUN: {e:?}");
        Stats::add(&peer.stats.not_allowed, 1);
    }
}

/// Encrypts one packet from the TUN into `dst`: the WireGuard packet, or `None` when its
/// destination is not in the peer's AllowedIPs (counted) or boringtun sends nothing for it
/// (it queues packets until a session exists).
pub fn encapsulate<'a>(
    peer: &Peer,
    tunn: &mut Tunn,
    packet: &[u8],
    dst: &'a mut [u8],
) -> Option<&'a mut [u8]> {
    if !packet_dst(packet).is_some_and(|d| peer.allowed.contains(d)) {
        Stats::add(&peer.stats.not_allowed, 1);
        return None;
    }
    match tunn.encapsulate(packet, dst) {
        TunnResult::WriteToNetwork(p) => Some(p),
        TunnResult::Err(e) => {
            tracing::debug!("encapsulate: {e:?}");
            None
        }
        _ => None,
    }
}

/// Logs `WireGuardError`s from received packets at a useful level.
pub fn log_decap_error(e: &WireGuardError, from: Option<SocketAddr>) {
    match e {
        WireGuardError::DuplicateCounter | WireGuardError::InvalidCounter => {
            tracing::trace!(?from, "replayed or late packet: {e:?}")
        }
        _ => tracing::debug!(?from, "rejected packet: {e:?}"),
    }
}

/// Runs boringtun's timers every 250 ms until shutdown: keepalives, handshake (re)tries and
/// rekeys go out through `send`. Logs completed handshakes.
pub fn run_timers(peer: &Peer, shutdown: &Shutdown, mut send: impl FnMut(&[u8])) {
    let mut buf = vec![0u8; 256];
    let mut last_handshake: Option<Duration> = None;
    let mut handshakes = 0u64;
    let started = Instant::now();
    let mut warned_no_handshake = false;
    loop {
        let mut tunn = peer.tunn();
        match tunn.update_timers(&mut buf) {
            TunnResult::WriteToNetwork(p) => send(p),
            TunnResult::Err(WireGuardError::ConnectionExpired) => {
                tracing::debug!("session expired; a new handshake starts with the next packet")
            }
            TunnResult::Err(e) => tracing::debug!("timer: {e:?}"),
            _ => {}
        }
        let since = tunn.stats().0;
        drop(tunn);
        if let Some(d) = since {
            if last_handshake.is_none_or(|prev| d < prev) {
                handshakes += 1;
                if handshakes == 1 {
                    tracing::info!("handshake completed with peer {:?}", peer.endpoint());
                } else {
                    tracing::debug!("rekeyed (handshake #{handshakes})");
                }
            }
        } else if !warned_no_handshake
            && started.elapsed() > Duration::from_secs(15)
            && peer.endpoint().is_some()
        {
            warned_no_handshake = true;
            tracing::warn!(
                "no handshake with peer {:?} after 15 s: check the endpoint, the keys and that the peer is up",
                peer.endpoint()
            );
        }
        last_handshake = since;
        // Sleep a tick, waking early on shutdown.
        match wait_readable(-1, None, shutdown, Some(TIMER_TICK)) {
            Ok(Wake::Shutdown) => return,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!("timer wait: {e}");
                std::thread::sleep(TIMER_TICK);
            }
        }
        if shutdown.is_triggered() {
            return;
        }
    }
}

/// Starts a handshake now (instead of waiting for the first packet), sending it through `send`.
pub fn initiate(peer: &Peer, force: bool, mut send: impl FnMut(&[u8])) {
    let mut buf = [0u8; 256];
    let mut tunn = peer.tunn();
    if let TunnResult::WriteToNetwork(p) = tunn.format_handshake_initiation(&mut buf, force) {
        send(p);
    }
}
