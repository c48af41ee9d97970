//! The command line: every setting of the config file also has a flag, which overrides it.

use std::path::PathBuf;
use std::time::Duration;

use bufscope_policy::units::parse_duration;

use super::values::parse_bandwidth;
use super::{BufferPolicy, Congestion, QuicMode, TransportKind};
use crate::net::Cidr;

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
    /// QUIC transport: WireGuard packets in DATAGRAM frames (default) or in streams (reliable,
    /// in order). Both ends must use the same.
    #[arg(long = "quic.mode")]
    pub quic_mode: Option<QuicMode>,
    /// QUIC transport: congestion controller (default tunnel).
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
