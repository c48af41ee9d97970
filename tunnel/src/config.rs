//! Configuration: a wg-quick-like file, overridden by command-line flags.
//!
//! ```text
//! [Interface]
//! PrivateKey = <base64, from `wg genkey`>
//! Address = 10.99.0.1/24
//! ListenPort = 51820
//! MTU = 1420
//!
//! [Peer]
//! PublicKey = <base64>
//! PresharedKey = <base64>          # optional
//! Endpoint = 192.168.77.2:51820    # optional on the listening side
//! AllowedIPs = 10.99.0.2/32
//! PersistentKeepalive = 25         # optional, seconds
//!
//! [Bufscope]
//! Transport = udp                  # udp | tcp | quic
//! QuicMode = datagram              # quic: datagram | stream
//! Congestion = tunnel              # quic: tunnel | cubic | bbr
//! BufferPolicy = recommended       # recommended | fixed=<bytes> | os-default
//! TargetBandwidth = 1G             # optional, bits/s, sizes UDP buffers from the BDP
//! TargetRtt = 190ms                # optional
//! Interface = bst0                 # optional, the TUN device's name
//! Offload = true                   # TUN TSO/GRO and UDP GSO/GRO (default true)
//! ```

use bufscope_policy::units::parse_duration;
use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use base64::Engine as _;
use boringtun::x25519::{PublicKey, StaticSecret};
use bufscope_policy::Target;

use crate::net::{AllowedIps, Cidr};

/// Default device name.
pub const DEFAULT_INTERFACE: &str = "bufscope0";
/// Default MTU, as wg-quick: 1500 minus the 80 bytes of IPv6 + UDP + WireGuard overhead.
pub const DEFAULT_MTU: u16 = 1420;

/// Default MTU over the TCP transport. The outer TCP connection segments the byte stream
/// itself, so an inner packet need not fit one path MTU; at 1420 the inner and outer headers
/// (inner IP+TCP 52, WireGuard 32, length 2, outer IP+TCP 52 per 1500) cap one flow at ~90.8% of
/// the link, which the tunnel bench measured as 87–90% at 50 ms over a 200 Mbit/s link. A jumbo
/// inner MTU amortises the inner headers over 6× more payload.
pub const DEFAULT_TCP_MTU: u16 = 8920;

/// Default MTU over QUIC DATAGRAM frames: one WireGuard packet (MTU + 32) per QUIC datagram,
/// which must fit one QUIC packet. With a 1452-byte UDP payload (a 1500-byte IPv6 path, what
/// WireGuard's own 1420 assumes) QUIC's short header, AEAD tag and DATAGRAM frame header leave
/// 1414 bytes (quinn's `max_datagram_size` with 8-byte connection IDs): 1414 − 32 = 1382.
pub const DEFAULT_QUIC_DATAGRAM_MTU: u16 = 1380;

/// The UDP payload size of the QUIC transport's packets (quinn's `initial_mtu` and `min_mtu`):
/// what a 1500-byte IPv6 path carries, as WireGuard's own MTU 1420 assumes.
pub const QUIC_INITIAL_MTU: u16 = 1452;

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
    /// no back-off below it (see `quic::congestion`). Datagram mode's default.
    Tunnel,
    /// quinn's CUBIC as it comes (10-packet initial window, slow start). Stream mode's default.
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
        if n == 0 || n > i32::MAX as usize / 2 {
            return Err(format!("fixed buffer size {bytes:?} out of range"));
        }
        Ok(BufferPolicy::Fixed(n))
    }
}

/// `65536`, `64K`, `64KiB`, `4M`, `4MiB` (binary multiples).
fn parse_bytes(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mult) = split_suffix(
        t,
        &[
            ("kib", 1 << 10),
            ("k", 1 << 10),
            ("mib", 1 << 20),
            ("m", 1 << 20),
        ],
    );
    num.trim()
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("{s:?} is not a byte size (e.g. 65536, 64K, 4M)"))
}

/// `1000000`, `500k`, `200M`, `1G` bits per second (decimal multiples; an optional `bit/s`).
fn parse_bandwidth(s: &str) -> Result<u64, String> {
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

/// Flags of `bufscope-tunnel` (each overrides the config file).
#[derive(Debug, Default, clap::Parser)]
#[command(
    name = "bufscope-tunnel",
    version,
    about = "Point-to-point WireGuard L3 tunnel (boringtun) over UDP, TCP or QUIC that applies bufscope's buffer policy"
)]
pub struct Cli {
    /// wg-quick-like configuration file ([Interface], [Peer], [Bufscope]).
    #[arg(short, long)]
    pub config: Option<PathBuf>,
    /// Name of the TUN device to create (default: [Bufscope] Interface, else bufscope0).
    #[arg(short, long)]
    pub interface: Option<String>,
    /// File holding the base64 private key (as written by `wg genkey`).
    #[arg(long)]
    pub private_key_file: Option<PathBuf>,
    /// Address(es) of the TUN device, CIDR, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub address: Vec<Cidr>,
    /// UDP port to listen on (TCP transport: port of the listening side).
    #[arg(long)]
    pub listen_port: Option<u16>,
    /// MTU of the TUN device.
    #[arg(long)]
    pub mtu: Option<u16>,
    /// The peer's base64 public key.
    #[arg(long)]
    pub peer_public_key: Option<String>,
    /// File holding a base64 pre-shared key.
    #[arg(long)]
    pub preshared_key_file: Option<PathBuf>,
    /// The peer's address, host:port. With TCP transport, the side with an endpoint connects
    /// and the other listens.
    #[arg(long)]
    pub endpoint: Option<String>,
    /// Inner prefixes routed to and accepted from the peer, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub allowed_ips: Vec<Cidr>,
    /// Seconds between keepalives (0 = off).
    #[arg(long)]
    pub persistent_keepalive: Option<u16>,
    /// Outer transport.
    #[arg(long)]
    pub transport: Option<TransportKind>,
    /// QUIC transport: WireGuard packets in DATAGRAM frames (default) or in one stream. Both ends
    /// must use the same.
    #[arg(long = "quic.mode")]
    pub quic_mode: Option<QuicMode>,
    /// QUIC transport: congestion controller (default tunnel in datagram mode, cubic in stream
    /// mode).
    #[arg(long)]
    pub congestion: Option<Congestion>,
    /// Outer socket buffers: recommended | fixed=<bytes> | os-default. QUIC: `recommended` also
    /// sets bufscope-policy's flow-control windows, the others leave quinn's defaults.
    #[arg(long)]
    pub buffer_policy: Option<BufferPolicy>,
    /// Expected path bandwidth in bits/s (e.g. 1G): the recommended policy sizes UDP buffers
    /// from bandwidth x RTT when that exceeds its default. Needs --target-rtt.
    #[arg(long, value_parser = parse_bandwidth)]
    pub target_bandwidth: Option<u64>,
    /// Expected path RTT (e.g. 190ms). Needs --target-bandwidth.
    #[arg(long, value_parser = parse_duration)]
    pub target_rtt: Option<Duration>,
    /// Turn off the segmentation/coalescing offloads (TUN TSO/GRO, UDP GSO/GRO): one syscall
    /// and one trip through the inner stack per packet, as older userspace WireGuards do.
    #[arg(long)]
    pub no_offload: bool,
    /// TCP and QUIC transports: how long to keep trying the first connection (QUIC: to complete
    /// the handshake) before giving up.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub connect_timeout: Duration,
}

/// Everything the tunnel needs, validated.
pub struct Settings {
    /// TUN device name.
    pub interface: String,
    /// Our static private key.
    pub private_key: StaticSecret,
    /// The peer's static public key.
    pub peer_public_key: PublicKey,
    /// Optional pre-shared key.
    pub preshared_key: Option<[u8; 32]>,
    /// Addresses of the TUN device.
    pub addresses: Vec<Cidr>,
    /// Listening port.
    pub listen_port: Option<u16>,
    /// MTU of the TUN device.
    pub mtu: u16,
    /// Resolved peer endpoint.
    pub endpoint: Option<SocketAddr>,
    /// The peer's allowed inner prefixes.
    pub allowed_ips: AllowedIps,
    /// Keepalive interval in seconds.
    pub persistent_keepalive: Option<u16>,
    /// Outer transport.
    pub transport: TransportKind,
    /// QUIC transport: how packets ride in QUIC.
    pub quic_mode: QuicMode,
    /// QUIC transport: congestion controller.
    pub congestion: Congestion,
    /// Outer socket buffer policy.
    pub buffer_policy: BufferPolicy,
    /// Target path for the recommended policy.
    pub target: Option<Target>,
    /// TCP transport: first-connection deadline.
    pub connect_timeout: Duration,
    /// Segmentation/coalescing offloads on.
    pub offload: bool,
}

/// Values read from a config file (all optional; flags may supply the rest).
#[derive(Debug, Default)]
struct FileConfig {
    private_key: Option<String>,
    addresses: Vec<Cidr>,
    listen_port: Option<u16>,
    mtu: Option<u16>,
    peer_public_key: Option<String>,
    preshared_key: Option<String>,
    endpoint: Option<String>,
    allowed_ips: Vec<Cidr>,
    persistent_keepalive: Option<u16>,
    transport: Option<TransportKind>,
    quic_mode: Option<QuicMode>,
    congestion: Option<Congestion>,
    buffer_policy: Option<BufferPolicy>,
    target_bandwidth: Option<u64>,
    target_rtt: Option<Duration>,
    interface: Option<String>,
    offload: Option<bool>,
}

fn parse_file(text: &str) -> Result<FileConfig> {
    #[derive(PartialEq)]
    enum Section {
        None,
        Interface,
        Peer,
        Bufscope,
    }
    let mut c = FileConfig::default();
    let mut section = Section::None;
    let mut peers = 0;
    for (i, raw) in text.lines().enumerate() {
        let lineno = i + 1;
        let line = raw.split(['#', ';']).next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = match name.trim().to_ascii_lowercase().as_str() {
                "interface" => Section::Interface,
                "peer" => {
                    peers += 1;
                    if peers > 1 {
                        bail!(
                            "line {lineno}: only one [Peer] is supported (point-to-point tunnel)"
                        );
                    }
                    Section::Peer
                }
                "bufscope" => Section::Bufscope,
                other => bail!("line {lineno}: unknown section [{other}]"),
            };
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| anyhow!("line {lineno}: expected `Key = Value`, got {raw:?}"))?;
        let key = key.trim().to_ascii_lowercase();
        let value = value.trim();
        let ctx = || format!("line {lineno}: bad value for {}", key);
        match (&section, key.as_str()) {
            (Section::Interface, "privatekey") => c.private_key = Some(value.to_string()),
            (Section::Interface, "address") => {
                for a in value.split(',') {
                    c.addresses.push(
                        a.parse()
                            .map_err(|e: String| anyhow!(e))
                            .with_context(ctx)?,
                    );
                }
            }
            (Section::Interface, "listenport") => {
                c.listen_port = Some(value.parse().with_context(ctx)?)
            }
            (Section::Interface, "mtu") => c.mtu = Some(value.parse().with_context(ctx)?),
            (
                Section::Interface,
                "dns" | "table" | "preup" | "postup" | "predown" | "postdown" | "saveconfig"
                | "fwmark",
            ) => {
                tracing::warn!(
                    "config line {lineno}: {key} is a wg-quick setting bufscope-tunnel ignores"
                );
            }
            (Section::Peer, "publickey") => c.peer_public_key = Some(value.to_string()),
            (Section::Peer, "presharedkey") => c.preshared_key = Some(value.to_string()),
            (Section::Peer, "endpoint") => c.endpoint = Some(value.to_string()),
            (Section::Peer, "allowedips") => {
                for a in value.split(',').filter(|a| !a.trim().is_empty()) {
                    c.allowed_ips.push(
                        a.parse()
                            .map_err(|e: String| anyhow!(e))
                            .with_context(ctx)?,
                    );
                }
            }
            (Section::Peer, "persistentkeepalive") => {
                c.persistent_keepalive = match value.to_ascii_lowercase().as_str() {
                    "off" => Some(0),
                    v => Some(v.parse().with_context(ctx)?),
                }
            }
            (Section::Bufscope, "transport") => {
                c.transport = Some(
                    value
                        .parse()
                        .map_err(|e: String| anyhow!(e))
                        .with_context(ctx)?,
                )
            }
            (Section::Bufscope, "quicmode") => {
                c.quic_mode = Some(
                    value
                        .parse()
                        .map_err(|e: String| anyhow!(e))
                        .with_context(ctx)?,
                )
            }
            (Section::Bufscope, "congestion") => {
                c.congestion = Some(
                    value
                        .parse()
                        .map_err(|e: String| anyhow!(e))
                        .with_context(ctx)?,
                )
            }
            (Section::Bufscope, "bufferpolicy") => {
                c.buffer_policy = Some(
                    value
                        .parse()
                        .map_err(|e: String| anyhow!(e))
                        .with_context(ctx)?,
                )
            }
            (Section::Bufscope, "targetbandwidth") => {
                c.target_bandwidth = Some(
                    parse_bandwidth(value)
                        .map_err(|e| anyhow!(e))
                        .with_context(ctx)?,
                )
            }
            (Section::Bufscope, "targetrtt") => {
                c.target_rtt = Some(
                    parse_duration(value)
                        .map_err(|e| anyhow!(e))
                        .with_context(ctx)?,
                )
            }
            (Section::Bufscope, "interface") => c.interface = Some(value.to_string()),
            (Section::Bufscope, "offload") => {
                c.offload = Some(match value.to_ascii_lowercase().as_str() {
                    "true" | "yes" | "on" | "1" => true,
                    "false" | "no" | "off" | "0" => false,
                    _ => bail!("line {lineno}: Offload must be true or false"),
                })
            }
            (Section::None, _) => bail!("line {lineno}: {key} outside of a section"),
            (_, _) => bail!("line {lineno}: unknown key {key:?} in this section"),
        }
    }
    Ok(c)
}

/// Decodes a base64 WireGuard key (32 bytes).
pub fn decode_key(what: &str, text: &str) -> Result<[u8; 32]> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|_| {
            anyhow!("invalid {what}: not base64 (generate keys with `wg genkey` / `wg pubkey`)")
        })?;
    <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| {
        anyhow!(
            "invalid {what}: {} bytes instead of 32 (generate keys with `wg genkey` / `wg pubkey`)",
            bytes.len()
        )
    })
}

fn read_key_file(what: &str, path: &Path) -> Result<[u8; 32]> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {what} file {}", path.display()))?;
    decode_key(what, &text).with_context(|| format!("in {}", path.display()))
}

/// Resolves `host:port` to one socket address.
pub fn resolve_endpoint(text: &str) -> Result<SocketAddr> {
    text.to_socket_addrs()
        .with_context(|| format!("cannot resolve endpoint {text:?} (expected host:port)"))?
        .next()
        .ok_or_else(|| anyhow!("endpoint {text:?} resolves to no address"))
}

impl Cli {
    /// Reads the config file (if any), applies the flags over it and validates the result.
    pub fn settings(&self) -> Result<Settings> {
        let file = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read config file {}", path.display()))?;
                parse_file(&text).with_context(|| format!("config file {}", path.display()))?
            }
            None => FileConfig::default(),
        };

        let private_key = match (&self.private_key_file, &file.private_key) {
            (Some(path), _) => read_key_file("private key", path)?,
            (None, Some(text)) => decode_key("PrivateKey", text)?,
            (None, None) => {
                bail!("no private key: give --private-key-file or PrivateKey in [Interface]")
            }
        };
        let peer_public_key = match (&self.peer_public_key, &file.peer_public_key) {
            (Some(text), _) => decode_key("peer public key", text)?,
            (None, Some(text)) => decode_key("peer PublicKey", text)?,
            (None, None) => {
                bail!("no peer public key: give --peer-public-key or PublicKey in [Peer]")
            }
        };
        let preshared_key = match (&self.preshared_key_file, &file.preshared_key) {
            (Some(path), _) => Some(read_key_file("pre-shared key", path)?),
            (None, Some(text)) => Some(decode_key("PresharedKey", text)?),
            (None, None) => None,
        };
        let endpoint = match self.endpoint.as_ref().or(file.endpoint.as_ref()) {
            Some(text) => Some(resolve_endpoint(text)?),
            None => None,
        };
        let pick = |flag: &Vec<Cidr>, file: &Vec<Cidr>| {
            if flag.is_empty() {
                file.clone()
            } else {
                flag.clone()
            }
        };
        let allowed = pick(&self.allowed_ips, &file.allowed_ips);
        if allowed.is_empty() {
            bail!("no AllowedIPs: the peer would not be allowed to send or receive anything");
        }
        let interface = self
            .interface
            .clone()
            .or(file.interface)
            .unwrap_or_else(|| DEFAULT_INTERFACE.to_string());
        if interface.is_empty() || interface.len() > 15 || interface.contains(['/', ' ']) {
            bail!("invalid interface name {interface:?} (1 to 15 characters, no '/' or spaces)");
        }

        let target = match (
            self.target_bandwidth.or(file.target_bandwidth),
            self.target_rtt.or(file.target_rtt),
        ) {
            (Some(bw), Some(rtt)) => Some(Target::new(bw, rtt)),
            (None, None) => None,
            _ => bail!(
                "a target needs both a bandwidth and an RTT (--target-bandwidth, --target-rtt)"
            ),
        };
        let transport = self
            .transport
            .or(file.transport)
            .unwrap_or(TransportKind::Udp);
        let quic_mode = self
            .quic_mode
            .or(file.quic_mode)
            .unwrap_or(QuicMode::Datagram);
        // Datagram mode: CUBIC with a window floor, because quinn's slow start made inner CUBIC
        // flows leave theirs early. Stream mode: quinn's CUBIC, because a floor's bursts of
        // losses left more gaps in the peer's stream buffer than quinn allows (1024), which
        // closes the connection (docs/tunnel.md, "Congestion control").
        let congestion = self
            .congestion
            .or(file.congestion)
            .unwrap_or(match quic_mode {
                QuicMode::Datagram => Congestion::Tunnel,
                QuicMode::Stream => Congestion::Cubic,
            });
        if transport == TransportKind::Quic
            && quic_mode == QuicMode::Stream
            && congestion == Congestion::Tunnel
        {
            tracing::warn!(
                "--congestion tunnel in stream mode: its loss bursts can leave more than 1024 gaps in \
                 the peer's stream buffer, and quinn then closes the connection (measured at 50 ms); \
                 stream mode's default is cubic"
            );
        }
        if transport != TransportKind::Quic
            && (self.quic_mode.or(file.quic_mode).is_some()
                || self.congestion.or(file.congestion).is_some())
        {
            tracing::warn!("QuicMode/Congestion only apply to the QUIC transport; ignored");
        }
        let mtu = self
            .mtu
            .or(file.mtu)
            .unwrap_or(match (transport, quic_mode) {
                (TransportKind::Tcp, _) | (TransportKind::Quic, QuicMode::Stream) => {
                    DEFAULT_TCP_MTU
                }
                (TransportKind::Quic, QuicMode::Datagram) => DEFAULT_QUIC_DATAGRAM_MTU,
                (TransportKind::Udp, _) => DEFAULT_MTU,
            });
        if !(576..=65000).contains(&mtu) {
            bail!("MTU {mtu} out of range (576..=65000)");
        }
        let listen_port = self.listen_port.or(file.listen_port);
        if transport != TransportKind::Udp && endpoint.is_none() && listen_port.is_none() {
            bail!(
                "{} transport needs an Endpoint (to connect) or a ListenPort (to listen)",
                transport.to_string().to_ascii_uppercase()
            );
        }
        Ok(Settings {
            interface,
            private_key: StaticSecret::from(private_key),
            peer_public_key: PublicKey::from(peer_public_key),
            preshared_key,
            addresses: pick(&self.address, &file.addresses),
            listen_port,
            mtu,
            endpoint,
            allowed_ips: AllowedIps::new(allowed),
            persistent_keepalive: self
                .persistent_keepalive
                .or(file.persistent_keepalive)
                .filter(|&k| k > 0),
            transport,
            quic_mode,
            congestion,
            buffer_policy: self
                .buffer_policy
                .or(file.buffer_policy)
                .unwrap_or(BufferPolicy::Recommended),
            target,
            connect_timeout: self.connect_timeout,
            offload: !self.no_offload && file.offload.unwrap_or(true),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const SK: &str = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=";
    const PK: &str = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=";

    fn cli_with(text: &str) -> (Cli, tempfile_path::TempPath) {
        let path = tempfile_path::TempPath::new(text);
        let cli = Cli {
            config: Some(path.0.clone()),
            connect_timeout: Duration::from_secs(10),
            ..Cli::default()
        };
        (cli, path)
    }

    mod tempfile_path {
        pub struct TempPath(pub std::path::PathBuf);
        impl TempPath {
            pub fn new(text: &str) -> Self {
                static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
                let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let p = std::env::temp_dir()
                    .join(format!("bst-config-{}-{n}.conf", std::process::id()));
                std::fs::write(&p, text).unwrap();
                Self(p)
            }
        }
        impl Drop for TempPath {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    #[test]
    fn full_file_parses() {
        let (cli, _p) = cli_with(&format!(
            "# comment\n[Interface]\nPrivateKey = {SK}\nAddress = 10.9.0.1/24, fd09::1/64\nListenPort = 51820\nMTU = 1380\n\
             DNS = 1.1.1.1\n\n[Peer]\nPublicKey = {PK}\nEndpoint = 127.0.0.1:51821\nAllowedIPs = 10.9.0.2/32\n\
             PersistentKeepalive = 25\n\n[Bufscope]\nTransport = tcp\nBufferPolicy = fixed=64K\nTargetBandwidth = 200M\nTargetRtt = 190ms\nInterface = bst9\n"
        ));
        let s = cli.settings().unwrap();
        assert_eq!(s.interface, "bst9");
        assert_eq!(s.addresses.len(), 2);
        assert_eq!(s.listen_port, Some(51820));
        assert_eq!(s.mtu, 1380);
        assert_eq!(s.endpoint, Some("127.0.0.1:51821".parse().unwrap()));
        assert_eq!(s.persistent_keepalive, Some(25));
        assert_eq!(s.transport, TransportKind::Tcp);
        assert_eq!(s.buffer_policy, BufferPolicy::Fixed(65536));
        assert_eq!(
            s.target,
            Some(Target::new(200_000_000, Duration::from_millis(190)))
        );
        assert!(s.allowed_ips.contains("10.9.0.2".parse().unwrap()));
        assert_eq!(s.peer_public_key.as_bytes(), &decode_key("k", PK).unwrap());
    }

    #[test]
    fn flags_override_file() {
        let (mut cli, _p) = cli_with(&format!(
            "[Interface]\nPrivateKey = {SK}\n[Peer]\nPublicKey = {PK}\nAllowedIPs = 10.9.0.2/32\n"
        ));
        cli.transport = Some(TransportKind::Tcp);
        cli.listen_port = Some(4000);
        cli.buffer_policy = Some(BufferPolicy::OsDefault);
        cli.allowed_ips = vec!["10.8.0.0/16".parse().unwrap()];
        let s = cli.settings().unwrap();
        assert_eq!(s.transport, TransportKind::Tcp);
        assert_eq!(s.buffer_policy, BufferPolicy::OsDefault);
        assert!(!s.allowed_ips.contains("10.9.0.2".parse().unwrap()));
        assert!(s.allowed_ips.contains("10.8.1.1".parse().unwrap()));
        assert_eq!(s.interface, DEFAULT_INTERFACE);
        assert_eq!(
            s.mtu, DEFAULT_TCP_MTU,
            "TCP transport defaults to a jumbo inner MTU"
        );
    }

    #[test]
    fn quic_keys_and_defaults() {
        let base = format!(
            "[Interface]\nPrivateKey = {SK}\nListenPort = 51820\n[Peer]\nPublicKey = {PK}\nAllowedIPs = 10.9.0.2/32\n[Bufscope]\nTransport = quic\n"
        );
        let (cli, _p) = cli_with(&base);
        let s = cli.settings().unwrap();
        assert_eq!(s.transport, TransportKind::Quic);
        assert_eq!(s.quic_mode, QuicMode::Datagram);
        assert_eq!(s.congestion, Congestion::Tunnel);
        assert_eq!(s.mtu, DEFAULT_QUIC_DATAGRAM_MTU);
        let (cli, _p) = cli_with(&format!("{base}QuicMode = stream\n"));
        assert_eq!(cli.settings().unwrap().congestion, Congestion::Cubic);
        let (cli, _p) = cli_with(&format!("{base}QuicMode = stream\nCongestion = BBR\n"));
        let s = cli.settings().unwrap();
        assert_eq!(s.quic_mode, QuicMode::Stream);
        assert_eq!(s.congestion, Congestion::Bbr);
        assert_eq!(
            s.mtu, DEFAULT_TCP_MTU,
            "stream mode: jumbo inner MTU as over TCP"
        );
        let (cli, _p) = cli_with(&format!("{base}Congestion = cubic\n"));
        assert_eq!(cli.settings().unwrap().congestion, Congestion::Cubic);
        // Flags override the file.
        let (mut cli, _p) = cli_with(&format!("{base}QuicMode = stream\n"));
        cli.quic_mode = Some(QuicMode::Datagram);
        assert_eq!(cli.settings().unwrap().quic_mode, QuicMode::Datagram);
        let (cli, _p) = cli_with(&format!("{base}QuicMode = udp\n"));
        let e = format!("{:#}", cli.settings().err().unwrap());
        assert!(e.contains("unknown QUIC mode"), "{e}");
        // Neither an endpoint nor a port: nothing to connect to or listen on.
        let (cli, _p) = cli_with(&base.replace("ListenPort = 51820\n", ""));
        let e = format!("{:#}", cli.settings().err().unwrap());
        assert!(e.contains("QUIC transport needs an Endpoint"), "{e}");
    }

    #[test]
    fn bad_keys_are_named() {
        let (cli, _p) = cli_with(&format!(
            "[Interface]\nPrivateKey = notakey!!\n[Peer]\nPublicKey = {PK}\nAllowedIPs = 10.9.0.2/32\n"
        ));
        let e = format!("{:#}", cli.settings().err().unwrap());
        assert!(e.contains("invalid PrivateKey: not base64"), "{e}");
        let (cli, _p) = cli_with(&format!(
            "[Interface]\nPrivateKey = {SK}\n[Peer]\nPublicKey = AAAA\nAllowedIPs = 10.9.0.2/32\n"
        ));
        let e = format!("{:#}", cli.settings().err().unwrap());
        assert!(
            e.contains("invalid peer PublicKey: 3 bytes instead of 32"),
            "{e}"
        );
    }

    #[test]
    fn file_errors_name_the_line() {
        let (cli, _p) = cli_with("[Interface]\nPrivateKey\n");
        let e = format!("{:#}", cli.settings().err().unwrap());
        assert!(e.contains("line 2"), "{e}");
        let (cli, _p) = cli_with(&format!(
            "[Peer]\nPublicKey = {PK}\n[Peer]\nPublicKey = {PK}\n"
        ));
        let e = format!("{:#}", cli.settings().err().unwrap());
        assert!(e.contains("only one [Peer]"), "{e}");
    }

    #[test]
    fn value_parsers() {
        assert_eq!("recommended".parse(), Ok(BufferPolicy::Recommended));
        assert_eq!("os-default".parse(), Ok(BufferPolicy::OsDefault));
        assert_eq!("fixed=65536".parse(), Ok(BufferPolicy::Fixed(65536)));
        assert_eq!("fixed=4M".parse(), Ok(BufferPolicy::Fixed(4 << 20)));
        assert!("fixed=".parse::<BufferPolicy>().is_err());
        assert!("huge".parse::<BufferPolicy>().is_err());
        assert_eq!(parse_bandwidth("1G"), Ok(1_000_000_000));
        assert_eq!(parse_bandwidth("200Mbit/s"), Ok(200_000_000));
        assert_eq!(parse_duration("190ms"), Ok(Duration::from_millis(190)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("50").is_err(), "a bare number: 50s or 50ms?");
    }
}
