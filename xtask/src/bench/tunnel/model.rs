//! What the bench measures and what a row holds: the outer transport, the buffer policy, the
//! tunnel (variant) that carries the traffic, the link's loss of a loss row, and the figures of
//! a transfer and a row.

use super::human_bytes;
use crate::setup::peers;

/// Loss on the emulated link of a loss row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Loss {
    /// Long-run fraction of packets lost, each direction.
    pub(super) rate: f64,
    /// Mean burst length in packets (1: independent losses).
    pub(super) burst: f64,
}

impl Loss {
    pub(super) fn label(self) -> String {
        if self.burst > 1.0 {
            format!("{}% loss, bursts of {}", self.rate * 100.0, self.burst)
        } else {
            format!("{}% loss", self.rate * 100.0)
        }
    }
}

/// Outer transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Transport {
    Udp,
    Tcp,
    /// QUIC, WireGuard packets in DATAGRAM frames.
    QuicDatagram,
    /// QUIC, WireGuard packets in chunks spread over the connection's streams.
    QuicStream,
}

impl Transport {
    pub(super) fn name(self) -> &'static str {
        match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
            Transport::QuicDatagram => "quic-dgram",
            Transport::QuicStream => "quic-stream",
        }
    }

    pub(super) fn is_quic(self) -> bool {
        matches!(self, Transport::QuicDatagram | Transport::QuicStream)
    }

    /// bufscope-tunnel's `--transport` (and `--quic.mode`) flags.
    pub(super) fn flags(self) -> &'static [&'static str] {
        match self {
            Transport::Udp => &["--transport", "udp"],
            Transport::Tcp => &["--transport", "tcp"],
            Transport::QuicDatagram => &["--transport", "quic", "--quic.mode", "datagram"],
            Transport::QuicStream => &["--transport", "quic", "--quic.mode", "stream"],
        }
    }

    /// The policies measured over this transport.
    pub(super) fn policies(self, fixed: u64) -> Vec<Policy> {
        match self {
            Transport::Udp | Transport::Tcp => {
                vec![Policy::Recommended, Policy::Fixed(fixed), Policy::OsDefault]
            }
            Transport::QuicDatagram => vec![Policy::Recommended],
            Transport::QuicStream => vec![Policy::OsDefault, Policy::Recommended],
        }
    }

    /// Order of the table's row groups.
    pub(super) fn rank(self) -> u8 {
        match self {
            Transport::Udp => 0,
            Transport::Tcp => 1,
            Transport::QuicDatagram => 2,
            Transport::QuicStream => 3,
        }
    }
}

/// Buffer policy of bufscope-tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Policy {
    Recommended,
    Fixed(u64),
    OsDefault,
}

impl Policy {
    /// The name `--policies` selects it by.
    pub(super) fn name(self) -> &'static str {
        match self {
            Policy::Recommended => "recommended",
            Policy::Fixed(_) => "fixed",
            Policy::OsDefault => "os-default",
        }
    }

    pub(super) fn flag(self) -> String {
        match self {
            Policy::Recommended => "recommended".into(),
            Policy::Fixed(n) => format!("fixed={n}"),
            Policy::OsDefault => "os-default".into(),
        }
    }
}

/// What carries the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Variant {
    Bufscope(Transport, Policy),
    /// bufscope-tunnel from `--compare-bin`.
    BufscopeOther(Transport, Policy),
    WireguardGo,
    /// Upstream wireguard-go, built by `cargo xtask setup` (xtask/src/setup_peers.rs).
    WireguardGoUpstream,
    /// boringtun-cli from crates.io, built by `cargo xtask setup`.
    BoringtunCli,
}

impl Variant {
    pub(super) fn transport(self) -> Transport {
        match self {
            Variant::Bufscope(t, _) | Variant::BufscopeOther(t, _) => t,
            Variant::WireguardGo | Variant::WireguardGoUpstream | Variant::BoringtunCli => {
                Transport::Udp
            }
        }
    }

    pub(super) fn label(self) -> String {
        match self {
            Variant::Bufscope(_, Policy::Fixed(n)) => format!("bufscope fixed={}", human_bytes(n)),
            Variant::Bufscope(t, Policy::Recommended) if t.is_quic() => {
                "bufscope recommended (policy windows)".into()
            }
            Variant::Bufscope(t, Policy::OsDefault) if t.is_quic() => {
                "bufscope os-default (quinn windows)".into()
            }
            Variant::Bufscope(_, p) => format!("bufscope {}", p.flag()),
            Variant::BufscopeOther(t, p) => {
                format!("{} (--compare-bin)", Variant::Bufscope(t, p).label())
            }
            Variant::WireguardGo => "wireguard-go (Debian)".into(),
            Variant::WireguardGoUpstream => format!(
                "wireguard-go {} (upstream {})",
                peers::WIREGUARD_GO_VERSION,
                &peers::WIREGUARD_GO_COMMIT[..7]
            ),
            Variant::BoringtunCli => format!("boringtun-cli {}", peers::BORINGTUN_CLI_VERSION),
        }
    }
}

/// One transfer's figures.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Transfer {
    pub(super) mbit: f64,
    pub(super) latency_ms: Option<f64>,
    pub(super) retransmits: u64,
    pub(super) drops: u64,
    /// CPU time of both tunnel processes (user + system, `/proc/<pid>/stat`) per Gbit the
    /// inner flow carried over the measured part of the transfer: cores per Gbit/s.
    pub(super) cores_per_gbps: Option<f64>,
    /// The lowest and highest throughput of the transfers this one is the median of.
    pub(super) spread: (f64, f64),
}

/// One table row.
#[derive(Debug, Clone)]
pub(super) struct Row {
    pub(super) rtt_ms: u64,
    /// Loss rows: the link's loss.
    pub(super) loss: Option<Loss>,
    pub(super) variant: Variant,
    pub(super) result: Result<Measured, String>,
}

#[derive(Debug, Clone)]
pub(super) struct Measured {
    pub(super) rcvbuf: Option<u64>,
    pub(super) idle_ms: Option<f64>,
    pub(super) down: Transfer,
    pub(super) up: Transfer,
    /// QUIC rows: what the tunnels' shutdown logs say quinn did.
    pub(super) quic: Option<QuicFigures>,
}

/// From the client's (a's) shutdown log: offloads, quinn-internal drops, windows in effect.
#[derive(Debug, Clone, Default)]
pub(super) struct QuicFigures {
    /// UDP datagrams per send call (GSO), over the whole run of the client.
    pub(super) datagrams_per_send: Option<f64>,
    /// UDP datagrams per received buffer (GRO).
    pub(super) datagrams_per_recv: Option<f64>,
    /// Datagram mode: datagrams quinn dropped from its receive buffer (client + server).
    pub(super) quinn_drops: Option<u64>,
    /// Stream mode: the connection window the client granted, ≈ bytes × 8 / MAX_DATA.
    pub(super) window: Option<u64>,
    /// The congestion controller the client's connection ran.
    pub(super) congestion: Option<String>,
    /// Times the client reconnected during the row (0 when the connection held).
    pub(super) reconnects: usize,
    /// Connections the transport closed during the row (errors, resets, timeouts), both ends.
    pub(super) transport_closes: u64,
}
