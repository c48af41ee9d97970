//! quinn's configuration for the tunnel: transport parameters (windows, MTU, streams, ACK
//! frequency, congestion controller), connection IDs, and the windows read back from quinn.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow};
use bufscope_policy::{Plan, Target, Transport};
use quinn::{Connection, TransportConfig, VarInt};

use super::{congestion, streams};
use crate::config::{BufferPolicy, Congestion, QUIC_INITIAL_MTU, QuicMode, Settings};

/// quinn keeps the path alive (and notices a dead peer) with this interval ...
pub(super) const KEEP_ALIVE: Duration = Duration::from_secs(5);
/// ... and gives a silent connection up after this long.
pub(super) const IDLE_TIMEOUT: Duration = Duration::from_secs(15);
/// Connection ID length of the listening side (quinn's default is 8). It has one peer, so 4
/// random bytes route unambiguously, and keeping a CID (unlike the connecting side) lets the
/// peer's address change (NAT rebinding) without a new handshake.
pub(super) const SERVER_CID_LEN: usize = 4;
/// Connection ID length of the connecting side: none. It has one connection to one address,
/// which quinn routes by that address.
///
/// Shorter CIDs leave room in a full-size QUIC packet next to a WireGuard packet of the default
/// datagram-mode MTU, so quinn piggybacks its ACK frames there instead of sending ACK-only
/// packets: measured at 50 ms / 200 Mbit/s, ACK-only packets went from 14% to 3% of the data
/// sender's packets and one inner flow from 179 to 181 Mbit/s (the ceiling is ~181).
pub(super) const CLIENT_CID_LEN: usize = 0;

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
pub(super) struct RandomCids(pub(super) usize);

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
pub(super) fn transport_config(s: &Settings) -> Result<TransportConfig> {
    let mut t = TransportConfig::default();
    let varint = |v: u64| VarInt::from_u64(v).map_err(|_| anyhow!("window {v} too large"));
    if s.buffer_policy != BufferPolicy::Recommended && s.quic_mode == QuicMode::Stream {
        // quinn's default stream window, for the tunnel as a whole: stream mode puts each
        // chunk on a stream of its own (see `streams`), so the connection's window bounds it.
        let quinn_default = EffectiveConfig::read(&t)?.stream_receive_window;
        t.stream_receive_window(varint(streams::MAX_STREAM_WINDOW.min(quinn_default))?)
            .receive_window(varint(quinn_default)?);
    }
    if s.buffer_policy == BufferPolicy::Recommended {
        let plan = Plan::for_current(Transport::Quic, s.target);
        let w = plan
            .quic
            .context("bufscope-policy gave no QUIC windows for a QUIC plan")?;
        // Stream mode puts each chunk on a stream of its own; twice the policy's stream
        // window (within its connection window) bounds them all (see `streams`).
        let connection = match s.quic_mode {
            QuicMode::Stream => streams::tunnel_window(w.stream_receive).min(w.connection_receive),
            QuicMode::Datagram => w.connection_receive,
        };
        t.stream_receive_window(varint(streams::MAX_STREAM_WINDOW)?)
            .receive_window(varint(connection)?)
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
        .max_concurrent_bidi_streams(VarInt::from_u32(0))
        .max_concurrent_uni_streams(VarInt::from_u32(match s.quic_mode {
            QuicMode::Stream => streams::MAX_OPEN_STREAMS,
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
pub(super) fn window_floor(target: Option<Target>) -> u64 {
    match Plan::for_current(Transport::Quic, target).buffers {
        bufscope_policy::Buffers::Set { receive, .. } => receive as u64,
        bufscope_policy::Buffers::LeaveAlone => bufscope_policy::UDP_DEFAULT_BUFFER as u64,
    }
}

/// The congestion controller a connection actually runs.
pub(super) fn controller_name(conn: &Connection) -> &'static str {
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
