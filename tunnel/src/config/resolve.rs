//! From the file and the flags to [`Settings`]: each flag over its file key, the defaults that
//! depend on other settings (MTU, congestion controller), and every check that can be made
//! before anything is created.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;

use anyhow::{Context as _, Result, anyhow, bail};
use base64::Engine as _;
use boringtun::x25519::{PublicKey, StaticSecret};
use bufscope_policy::Target;

use super::file::{FileConfig, parse_file};
use super::{
    BufferPolicy, Cli, Congestion, DEFAULT_INTERFACE, DEFAULT_MTU, DEFAULT_QUIC_DATAGRAM_MTU,
    DEFAULT_TCP_MTU, QuicMode, Settings, TransportKind,
};
use crate::net::{AllowedIps, Cidr};

/// Decodes a base64 WireGuard key (32 bytes).
pub(super) fn decode_key(what: &str, text: &str) -> Result<[u8; 32]> {
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
pub(super) fn resolve_endpoint(text: &str) -> Result<SocketAddr> {
    text.to_socket_addrs()
        .with_context(|| format!("cannot resolve endpoint {text:?} (expected host:port)"))?
        .next()
        .ok_or_else(|| anyhow!("endpoint {text:?} resolves to no address"))
}

/// The three keys: ours, the peer's, the optional pre-shared one.
struct Keys {
    private: [u8; 32],
    peer_public: [u8; 32],
    preshared: Option<[u8; 32]>,
}

/// The flag's list if it has any entries, else the file's.
fn pick(flag: &[Cidr], file: &[Cidr]) -> Vec<Cidr> {
    if flag.is_empty() {
        file.to_vec()
    } else {
        flag.to_vec()
    }
}

impl Cli {
    /// Reads the config file (if any), applies the flags over it and validates the result.
    pub fn settings(&self) -> Result<Settings> {
        let file = self.file()?;
        let keys = self.keys(&file)?;
        let endpoint = match self.endpoint.as_ref().or(file.endpoint.as_ref()) {
            Some(text) => Some(resolve_endpoint(text)?),
            None => None,
        };
        let allowed = pick(&self.allowed_ips, &file.allowed_ips);
        if allowed.is_empty() {
            bail!("no AllowedIPs: the peer would not be allowed to send or receive anything");
        }
        let interface = self.interface_name(&file)?;
        let target = self.target(&file)?;
        let (transport, quic_mode, congestion) = self.transport(&file);
        let mtu = self.mtu(&file, transport, quic_mode)?;
        let listen_port = self.listen_port.or(file.listen_port);
        if transport != TransportKind::Udp && endpoint.is_none() && listen_port.is_none() {
            bail!(
                "{} transport needs an Endpoint (to connect) or a ListenPort (to listen)",
                transport.to_string().to_ascii_uppercase()
            );
        }
        Ok(Settings {
            interface,
            private_key: StaticSecret::from(keys.private),
            peer_public_key: PublicKey::from(keys.peer_public),
            preshared_key: keys.preshared,
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

    /// The config file's values (none without `--config`).
    fn file(&self) -> Result<FileConfig> {
        let Some(path) = &self.config else {
            return Ok(FileConfig::default());
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        parse_file(&text).with_context(|| format!("config file {}", path.display()))
    }

    fn keys(&self, file: &FileConfig) -> Result<Keys> {
        let private = match (&self.private_key_file, &file.private_key) {
            (Some(path), _) => read_key_file("private key", path)?,
            (None, Some(text)) => decode_key("PrivateKey", text)?,
            (None, None) => {
                bail!("no private key: give --private-key-file or PrivateKey in [Interface]")
            }
        };
        let peer_public = match (&self.peer_public_key, &file.peer_public_key) {
            (Some(text), _) => decode_key("peer public key", text)?,
            (None, Some(text)) => decode_key("peer PublicKey", text)?,
            (None, None) => {
                bail!("no peer public key: give --peer-public-key or PublicKey in [Peer]")
            }
        };
        let preshared = match (&self.preshared_key_file, &file.preshared_key) {
            (Some(path), _) => Some(read_key_file("pre-shared key", path)?),
            (None, Some(text)) => Some(decode_key("PresharedKey", text)?),
            (None, None) => None,
        };
        Ok(Keys {
            private,
            peer_public,
            preshared,
        })
    }

    fn interface_name(&self, file: &FileConfig) -> Result<String> {
        let interface = self
            .interface
            .clone()
            .or_else(|| file.interface.clone())
            .unwrap_or_else(|| DEFAULT_INTERFACE.to_string());
        if interface.is_empty() || interface.len() > 15 || interface.contains(['/', ' ']) {
            bail!("invalid interface name {interface:?} (1 to 15 characters, no '/' or spaces)");
        }
        Ok(interface)
    }

    fn target(&self, file: &FileConfig) -> Result<Option<Target>> {
        match (
            self.target_bandwidth.or(file.target_bandwidth),
            self.target_rtt.or(file.target_rtt),
        ) {
            (Some(bw), Some(rtt)) => Ok(Some(Target::new(bw, rtt))),
            (None, None) => Ok(None),
            _ => bail!(
                "a target needs both a bandwidth and an RTT (--target-bandwidth, --target-rtt)"
            ),
        }
    }

    /// Transport, QUIC mode and congestion controller (the last two warned about when they
    /// do not apply).
    fn transport(&self, file: &FileConfig) -> (TransportKind, QuicMode, Congestion) {
        let transport = self
            .transport
            .or(file.transport)
            .unwrap_or(TransportKind::Udp);
        let quic_mode = self
            .quic_mode
            .or(file.quic_mode)
            .unwrap_or(QuicMode::Datagram);
        // CUBIC with a window floor in both modes, because quinn's slow start made inner CUBIC
        // flows leave theirs early (docs/tunnel.md, "Congestion control").
        let congestion = self
            .congestion
            .or(file.congestion)
            .unwrap_or(Congestion::Tunnel);
        if transport != TransportKind::Quic
            && (self.quic_mode.or(file.quic_mode).is_some()
                || self.congestion.or(file.congestion).is_some())
        {
            tracing::warn!("QuicMode/Congestion only apply to the QUIC transport; ignored");
        }
        (transport, quic_mode, congestion)
    }

    /// The MTU: given, or the transport's default.
    fn mtu(&self, file: &FileConfig, transport: TransportKind, mode: QuicMode) -> Result<u16> {
        let mtu = self.mtu.or(file.mtu).unwrap_or(match (transport, mode) {
            (TransportKind::Tcp, _) | (TransportKind::Quic, QuicMode::Stream) => DEFAULT_TCP_MTU,
            (TransportKind::Quic, QuicMode::Datagram) => DEFAULT_QUIC_DATAGRAM_MTU,
            (TransportKind::Udp, _) => DEFAULT_MTU,
        });
        if !(576..=65000).contains(&mtu) {
            bail!("MTU {mtu} out of range (576..=65000)");
        }
        Ok(mtu)
    }
}
