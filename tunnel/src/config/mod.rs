//! Configuration: a wg-quick-like file ([`file`]), overridden by command-line flags ([`Cli`]),
//! resolved into validated [`Settings`] ([`resolve`]).
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

mod cli;
mod file;
mod resolve;
#[cfg(test)]
mod tests;
mod values;

use std::net::SocketAddr;
use std::time::Duration;

use boringtun::x25519::{PublicKey, StaticSecret};
use bufscope_policy::Target;

use crate::net::{AllowedIps, Cidr};
pub use cli::Cli;
pub use values::{BufferPolicy, Congestion, QuicMode, TransportKind};

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
