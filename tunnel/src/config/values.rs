//! The values of the tunnel's settings that have a syntax of their own: transport, QUIC mode,
//! congestion controller, buffer policy, bandwidth. Byte sizes and durations use the syntax
//! every bufscope program shares (`bufscope_policy::units`).

use std::fmt;
use std::str::FromStr;

use bufscope_policy::units::parse_bytes;

/// Outer transport of the tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportKind {
    /// WireGuard over UDP (interoperable with any WireGuard).
    Udp,
    /// Length-prefixed WireGuard packets over one TCP connection (for networks that block UDP;
    /// bufscope-tunnel on both ends).
    Tcp,
    /// WireGuard packets in QUIC (quinn): DATAGRAM frames or one length-prefixed stream, see
    /// [`QuicMode`] (bufscope-tunnel on both ends).
    Quic,
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TransportKind::Udp => "udp",
            TransportKind::Tcp => "tcp",
            TransportKind::Quic => "quic",
        })
    }
}

impl FromStr for TransportKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "udp" => Ok(TransportKind::Udp),
            "tcp" => Ok(TransportKind::Tcp),
            "quic" => Ok(TransportKind::Quic),
            other => Err(format!(
                "unknown transport {other:?} (expected udp, tcp or quic)"
            )),
        }
    }
}

/// How WireGuard packets ride in QUIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum QuicMode {
    /// One WireGuard packet per QUIC DATAGRAM frame (RFC 9221): unreliable and unordered like
    /// UDP, congestion-controlled, no flow control.
    Datagram,
    /// One bidirectional stream carrying WireGuard packets, each preceded by its length (2 bytes,
    /// big endian): reliable and ordered, so QUIC's flow-control windows bound throughput.
    Stream,
}

impl fmt::Display for QuicMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QuicMode::Datagram => "datagram",
            QuicMode::Stream => "stream",
        })
    }
}

impl FromStr for QuicMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "datagram" | "datagrams" => Ok(QuicMode::Datagram),
            "stream" => Ok(QuicMode::Stream),
            other => Err(format!(
                "unknown QUIC mode {other:?} (expected datagram or stream)"
            )),
        }
    }
}

/// QUIC congestion controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Congestion {
    /// CUBIC with a window floor: no slow start below the policy's UDP buffer for the path and
    /// no back-off below it (see `quic::congestion`). The default.
    Tunnel,
    /// quinn's CUBIC as it comes (10-packet initial window, slow start).
    Cubic,
    /// BBR (quinn's experimental BBRv1).
    Bbr,
}

impl fmt::Display for Congestion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Congestion::Tunnel => "tunnel",
            Congestion::Cubic => "cubic",
            Congestion::Bbr => "bbr",
        })
    }
}

impl FromStr for Congestion {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "tunnel" => Ok(Congestion::Tunnel),
            "cubic" => Ok(Congestion::Cubic),
            "bbr" => Ok(Congestion::Bbr),
            other => Err(format!(
                "unknown congestion controller {other:?} (expected tunnel, cubic or bbr)"
            )),
        }
    }
}

/// What to do with the outer socket's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferPolicy {
    /// bufscope's policy (`bufscope-policy`): UDP 7 MiB (or BDP-derived) with FORCE when
    /// possible; TCP left to the kernel's autotuning.
    Recommended,
    /// The anti-pattern, on purpose: plain `SO_RCVBUF`/`SO_SNDBUF` of this many bytes set before
    /// bind/connect/listen (locks TCP autotuning and shrinks the window scale).
    Fixed(usize),
    /// Do not touch the buffers.
    OsDefault,
}

impl fmt::Display for BufferPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BufferPolicy::Recommended => f.write_str("recommended"),
            BufferPolicy::Fixed(n) => write!(f, "fixed={n}"),
            BufferPolicy::OsDefault => f.write_str("os-default"),
        }
    }
}

impl FromStr for BufferPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        match s.to_ascii_lowercase().as_str() {
            "recommended" => return Ok(BufferPolicy::Recommended),
            "os-default" | "os_default" | "default" => return Ok(BufferPolicy::OsDefault),
            _ => {}
        }
        let bytes = s.strip_prefix("fixed=").ok_or_else(|| {
            format!(
                "unknown buffer policy {s:?} (expected recommended, fixed=<bytes> or os-default)"
            )
        })?;
        let n = parse_bytes(bytes)?;
        if n == 0 || n > i32::MAX as u64 / 2 {
            return Err(format!("fixed buffer size {bytes:?} out of range"));
        }
        Ok(BufferPolicy::Fixed(n as usize))
    }
}

/// `1000000`, `500k`, `200M`, `1G` bits per second (decimal multiples; an optional `bit/s`).
pub(super) fn parse_bandwidth(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let t = t
        .strip_suffix("bit/s")
        .or_else(|| t.strip_suffix("bps"))
        .unwrap_or(&t);
    let (num, mult) = split_suffix(t, &[("k", 1_000), ("m", 1_000_000), ("g", 1_000_000_000)]);
    num.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v > 0.0)
        .map(|v| (v * mult as f64) as u64)
        .ok_or_else(|| format!("{s:?} is not a bandwidth (e.g. 200M, 1G bits/s)"))
}

fn split_suffix<'a>(t: &'a str, suffixes: &[(&str, usize)]) -> (&'a str, usize) {
    let lower = t.to_ascii_lowercase();
    for (suffix, mult) in suffixes {
        if lower.ends_with(suffix) {
            return (&t[..t.len() - suffix.len()], *mult);
        }
    }
    (t, 1)
}
