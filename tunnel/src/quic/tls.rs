//! The QUIC handshake's TLS identities, pinned by the WireGuard keys.
//!
//! QUIC needs TLS 1.3 and certificates; WireGuard already authenticates every packet, so no
//! certificate files are needed. Instead, both ends derive the same two Ed25519 key pairs from
//! the WireGuard static-static Diffie-Hellman secret (`X25519(our private, peer public)`, which
//! the two ends compute alike, plus the pre-shared key if any), one for the listening side and
//! one for the connecting side, and build a self-signed certificate from each at start. rcgen's
//! certificates are deterministic (fixed validity, serial from the key, deterministic Ed25519
//! signatures), so each end knows the exact certificate the peer must present and pins it
//! byte for byte, client and server alike (mutual TLS). Only the holder of one of the two
//! WireGuard private keys can complete a QUIC handshake: a stranger cannot even open a QUIC
//! connection to the listening side, let alone replace the current one.
//!
//! The ALPN says the mode (`--quic.mode`), so two ends that disagree find out in the handshake.

use std::fmt;
use std::sync::Arc;

use anyhow::{Context as _, Result, bail};
use boringtun::x25519::{PublicKey, StaticSecret};
use quinn::rustls;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use crate::config::QuicMode;

/// ALPN of `--quic.mode datagram`.
pub const ALPN_DATAGRAM: &[u8] = b"bufscope-wg-datagram/1";
/// ALPN of `--quic.mode stream` (3: a stream per chunk, no chunk header; 2 had 32 fixed
/// streams with a chunk header; 1 one stream).
pub const ALPN_STREAM: &[u8] = b"bufscope-wg-stream/3";
/// Server name the client asks for (the pinning verifier does not look at names).
pub const SERVER_NAME: &str = "bufscope-tunnel";

/// The ALPN of a mode.
pub fn alpn(mode: QuicMode) -> &'static [u8] {
    match mode {
        QuicMode::Datagram => ALPN_DATAGRAM,
        QuicMode::Stream => ALPN_STREAM,
    }
}

/// The mode an ALPN stands for.
pub fn mode_of(alpn: &[u8]) -> Option<QuicMode> {
    match alpn {
        ALPN_DATAGRAM => Some(QuicMode::Datagram),
        ALPN_STREAM => Some(QuicMode::Stream),
        _ => None,
    }
}

/// Which end of the QUIC connection a certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The listening side (no endpoint).
    Server,
    /// The side with an endpoint.
    Client,
}

impl Role {
    fn label(self) -> &'static [u8] {
        match self {
            Role::Server => b"bufscope-tunnel quic server certificate v1",
            Role::Client => b"bufscope-tunnel quic client certificate v1",
        }
    }

    fn other(self) -> Role {
        match self {
            Role::Server => Role::Client,
            Role::Client => Role::Server,
        }
    }
}

/// A certificate and its private key.
pub struct Identity {
    /// The self-signed certificate (DER).
    pub cert: CertificateDer<'static>,
    /// Its Ed25519 key, PKCS#8.
    pub key: PrivatePkcs8KeyDer<'static>,
}

/// This end's identity and the certificate the peer must present.
pub struct Pinned {
    /// Ours.
    pub ours: Identity,
    /// The peer's certificate, as it must be byte for byte.
    pub peer_cert: CertificateDer<'static>,
}

/// PKCS#8 v1 wrapping of a raw Ed25519 seed (RFC 8410): a fixed 16-byte prefix, then the seed.
const ED25519_PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

struct Seed;

impl ring::hkdf::KeyType for Seed {
    fn len(&self) -> usize {
        32
    }
}

/// Derives both ends' certificates for `role` (this end's side of the connection).
pub fn pinned(
    private: &StaticSecret,
    peer: &PublicKey,
    psk: Option<[u8; 32]>,
    role: Role,
) -> Result<Pinned> {
    let shared = private.diffie_hellman(peer);
    if !shared.was_contributory() {
        bail!("the peer's public key is a low-order point: no shared secret for the QUIC identity");
    }
    let salt = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, &psk.unwrap_or([0; 32]));
    let prk = salt.extract(shared.as_bytes());
    let derive = |r: Role| -> Result<Identity> {
        let mut seed = [0u8; 32];
        prk.expand(&[r.label()], Seed)
            .and_then(|okm| okm.fill(&mut seed))
            .map_err(|_| anyhow::anyhow!("HKDF expansion failed"))?;
        identity_from_seed(&seed)
    };
    Ok(Pinned {
        ours: derive(role)?,
        peer_cert: derive(role.other())?.cert,
    })
}

/// A self-signed certificate for the Ed25519 key with this seed (deterministic).
fn identity_from_seed(seed: &[u8; 32]) -> Result<Identity> {
    let mut der = ED25519_PKCS8_PREFIX.to_vec();
    der.extend_from_slice(seed);
    let key = PrivatePkcs8KeyDer::from(der);
    let pair = rcgen::KeyPair::from_pkcs8_der_and_sign_algo(&key, &rcgen::PKCS_ED25519)
        .context("loading the derived Ed25519 key")?;
    let mut params = rcgen::CertificateParams::new(vec![SERVER_NAME.to_string()])
        .context("certificate parameters")?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, SERVER_NAME);
    let cert = params
        .self_signed(&pair)
        .context("self-signing the QUIC certificate")?;
    Ok(Identity {
        cert: cert.der().clone(),
        key,
    })
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Accepts exactly one certificate (the pinned one) and checks the handshake signatures
/// against it.
struct Pin {
    cert: CertificateDer<'static>,
    algs: WebPkiSupportedAlgorithms,
}

impl fmt::Debug for Pin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Pin(derived from the WireGuard keys)")
    }
}

impl Pin {
    fn new(cert: CertificateDer<'static>) -> Self {
        Self {
            cert,
            algs: rustls::crypto::ring::default_provider().signature_verification_algorithms,
        }
    }

    fn check(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
    ) -> Result<(), rustls::Error> {
        if intermediates.is_empty() && end_entity.as_ref() == self.cert.as_ref() {
            Ok(())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }
}

/// The handshake-signature methods [`ServerCertVerifier`] and [`ClientCertVerifier`] both
/// have: rustls's own checks with the pinned provider's algorithms (the certificate itself is
/// what [`Pin::check`] pins).
macro_rules! signature_checks {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.algs.supported_schemes()
        }
    };
}

impl ServerCertVerifier for Pin {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.check(end_entity, intermediates)
            .map(|()| ServerCertVerified::assertion())
    }

    signature_checks!();
}

impl ClientCertVerifier for Pin {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.check(end_entity, intermediates)
            .map(|()| ClientCertVerified::assertion())
    }

    signature_checks!();
}

/// rustls configuration of the listening side: its derived certificate, the client's pinned,
/// only this end's mode in ALPN.
pub fn server_config(p: &Pinned, mode: QuicMode) -> Result<rustls::ServerConfig> {
    let mut c = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3")?
        .with_client_cert_verifier(Arc::new(Pin::new(p.peer_cert.clone())))
        .with_single_cert(
            vec![p.ours.cert.clone()],
            PrivateKeyDer::Pkcs8(p.ours.key.clone_key()),
        )
        .context("loading the QUIC server certificate")?;
    c.alpn_protocols = vec![alpn(mode).to_vec()];
    Ok(c)
}

/// rustls configuration of the connecting side: the server's pinned certificate, its own, and
/// both modes in ALPN (its own first), so that it can tell which mode the peer uses.
pub fn client_config(p: &Pinned, mode: QuicMode) -> Result<rustls::ClientConfig> {
    let other = match mode {
        QuicMode::Datagram => QuicMode::Stream,
        QuicMode::Stream => QuicMode::Datagram,
    };
    let mut c = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("TLS 1.3")?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Pin::new(p.peer_cert.clone())))
        .with_client_auth_cert(
            vec![p.ours.cert.clone()],
            PrivateKeyDer::Pkcs8(p.ours.key.clone_key()),
        )
        .context("loading the QUIC client certificate")?;
    c.alpn_protocols = vec![alpn(mode).to_vec(), alpn(other).to_vec()];
    Ok(c)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn secret(b: u8) -> StaticSecret {
        StaticSecret::from([b; 32])
    }

    #[test]
    fn both_ends_derive_the_same_pair_of_certificates() {
        let (a, b) = (secret(1), secret(2));
        let (pa, pb) = (PublicKey::from(&a), PublicKey::from(&b));
        let server = pinned(&b, &pa, None, Role::Server).unwrap();
        let client = pinned(&a, &pb, None, Role::Client).unwrap();
        assert_eq!(server.ours.cert, client.peer_cert);
        assert_eq!(client.ours.cert, server.peer_cert);
        assert_ne!(server.ours.cert, client.ours.cert);
        // Deterministic: a restart derives the same certificate.
        assert_eq!(
            pinned(&b, &pa, None, Role::Server).unwrap().ours.cert,
            server.ours.cert
        );
    }

    #[test]
    fn another_key_or_psk_gives_another_certificate() {
        let (a, b, c) = (secret(1), secret(2), secret(3));
        let (pa, pb) = (PublicKey::from(&a), PublicKey::from(&b));
        let good = pinned(&a, &pb, None, Role::Client).unwrap();
        let stranger = pinned(&c, &pb, None, Role::Client).unwrap();
        assert_ne!(good.ours.cert, stranger.ours.cert);
        let with_psk = pinned(&a, &pb, Some([9; 32]), Role::Client).unwrap();
        assert_ne!(good.ours.cert, with_psk.ours.cert);
        let _ = pa;
    }

    #[test]
    fn pin_accepts_only_the_derived_certificate() {
        let (a, b) = (secret(1), secret(2));
        let p = pinned(&a, &PublicKey::from(&b), None, Role::Client).unwrap();
        let pin = Pin::new(p.peer_cert.clone());
        assert!(pin.check(&p.peer_cert, &[]).is_ok());
        assert!(pin.check(&p.ours.cert, &[]).is_err());
        assert!(
            pin.check(&p.peer_cert, std::slice::from_ref(&p.ours.cert))
                .is_err()
        );
    }

    #[test]
    fn alpn_round_trips() {
        for m in [QuicMode::Datagram, QuicMode::Stream] {
            assert_eq!(mode_of(alpn(m)), Some(m));
        }
        assert_eq!(mode_of(b"h3"), None);
    }
}
