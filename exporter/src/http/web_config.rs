//! `--web.config.file`: TLS, basic auth and response headers, in the Prometheus
//! exporter-toolkit format (<https://github.com/prometheus/exporter-toolkit/blob/master/docs/web-configuration.md>):
//!
//! ```yaml
//! tls_server_config:
//!   cert_file: server.crt
//!   key_file: server.key
//!   client_auth_type: RequireAndVerifyClientCert   # optional
//!   client_ca_file: ca.crt                          # with client auth
//!   min_version: TLS12                              # TLS12 | TLS13
//! http_server_config:
//!   headers:
//!     Strict-Transport-Security: max-age=31536000
//! basic_auth_users:
//!   prometheus: $2y$10$...   # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\n')
//! ```
//!
//! The file is read at start-up (restart bufscope to rotate certificates).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, bail};
use axum::http::{HeaderName, HeaderValue};
use serde::Deserialize;
use tokio_rustls::rustls;

/// The web configuration file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebConfig {
    /// TLS; plain HTTP when absent.
    #[serde(default)]
    pub tls_server_config: Option<TlsConfig>,
    /// Extra response headers.
    #[serde(default)]
    pub http_server_config: Option<HttpConfig>,
    /// user → bcrypt hash. Basic auth is on when non-empty.
    #[serde(default)]
    pub basic_auth_users: BTreeMap<String, String>,
}

/// `tls_server_config`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain file.
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// PEM private key file.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// Inline PEM certificate (instead of `cert_file`).
    #[serde(default)]
    pub cert: Option<String>,
    /// Inline PEM key (instead of `key_file`).
    #[serde(default)]
    pub key: Option<String>,
    /// `NoClientCert` (default), `RequestClientCert`, `RequireAnyClientCert`,
    /// `VerifyClientCertIfGiven` or `RequireAndVerifyClientCert`.
    #[serde(default)]
    pub client_auth_type: Option<String>,
    /// CA bundle for client certificates.
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
    /// `TLS12` or `TLS13`.
    #[serde(default)]
    pub min_version: Option<String>,
    /// `TLS12` or `TLS13`.
    #[serde(default)]
    pub max_version: Option<String>,
    /// Accepted for compatibility; rustls always uses its own safe suites.
    #[serde(default)]
    pub cipher_suites: Option<Vec<String>>,
    /// Accepted for compatibility; rustls chooses curves itself.
    #[serde(default)]
    pub curve_preferences: Option<Vec<String>>,
    /// Accepted for compatibility.
    #[serde(default)]
    pub prefer_server_cipher_suites: Option<bool>,
}

/// `http_server_config`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Accepted for compatibility (HTTP/1.1 is always served).
    #[serde(default)]
    pub http2: Option<bool>,
    /// Headers added to every response.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

impl WebConfig {
    /// Reads and validates `path` (relative file names inside are relative to its directory).
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading --web.config.file {}", path.display()))?;
        let mut c: WebConfig = serde_yaml::from_str(&text)
            .with_context(|| format!("invalid --web.config.file {}", path.display()))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        if let Some(t) = c.tls_server_config.as_mut() {
            for f in [&mut t.cert_file, &mut t.key_file, &mut t.client_ca_file] {
                if let Some(p) = f.as_mut()
                    && p.is_relative()
                {
                    *p = dir.join(&*p);
                }
            }
        }
        for (user, hash) in &c.basic_auth_users {
            if !hash.starts_with("$2") {
                bail!(
                    "invalid --web.config.file {}: basic_auth_users.{user} must be a bcrypt hash \
                     (e.g. from `htpasswd -nBC 10 \"\" | tr -d ':\\n'`), not a plain password",
                    path.display()
                );
            }
        }
        if let Some(h) = c.http_server_config.as_ref() {
            for (k, v) in &h.headers {
                HeaderName::from_bytes(k.as_bytes())
                    .with_context(|| format!("invalid header name {k:?} in --web.config.file"))?;
                HeaderValue::from_str(v).with_context(|| {
                    format!("invalid value for header {k} in --web.config.file")
                })?;
            }
        }
        Ok(c)
    }

    /// The TLS server configuration, when TLS is on.
    pub fn rustls(&self) -> anyhow::Result<Option<Arc<rustls::ServerConfig>>> {
        let Some(t) = self.tls_server_config.as_ref() else {
            return Ok(None);
        };
        if t.cipher_suites.is_some() || t.curve_preferences.is_some() {
            tracing::warn!(
                "tls_server_config: cipher_suites/curve_preferences are ignored; rustls uses its own safe defaults"
            );
        }
        let certs = read_pem(t.cert_file.as_deref(), t.cert.as_deref(), "cert")?;
        let chain = rustls::pki_types::CertificateDer::pem_slice_iter(&certs)
            .collect::<Result<Vec<_>, _>>()
            .context("tls_server_config: certificate is not valid PEM")?;
        if chain.is_empty() {
            bail!("tls_server_config: no certificate found in cert_file/cert");
        }
        let keypem = read_pem(t.key_file.as_deref(), t.key.as_deref(), "key")?;
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(&keypem)
            .context("tls_server_config: key is not a valid PEM private key")?;
        let versions: Vec<&'static rustls::SupportedProtocolVersion> = {
            let v = |s: &Option<String>, default: u8| -> anyhow::Result<u8> {
                match s.as_deref() {
                    None => Ok(default),
                    Some("TLS12") => Ok(12),
                    Some("TLS13") => Ok(13),
                    Some(o) => {
                        bail!("tls_server_config: unsupported TLS version {o} (use TLS12 or TLS13)")
                    }
                }
            };
            let (lo, hi) = (v(&t.min_version, 12)?, v(&t.max_version, 13)?);
            if lo > hi {
                bail!("tls_server_config: min_version is above max_version");
            }
            let mut out = Vec::new();
            if lo <= 12 {
                out.push(&rustls::version::TLS12);
            }
            if hi >= 13 {
                out.push(&rustls::version::TLS13);
            }
            out
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&versions)
            .context("tls_server_config: TLS versions")?;
        let auth = t.client_auth_type.as_deref().unwrap_or("NoClientCert");
        let builder = match auth {
            "NoClientCert" | "RequestClientCert" | "RequireAnyClientCert" => {
                if auth != "NoClientCert" {
                    tracing::warn!("client_auth_type {auth}: client certificates are not verified");
                }
                builder.with_no_client_auth()
            }
            "VerifyClientCertIfGiven" | "RequireAndVerifyClientCert" => {
                let ca = t.client_ca_file.as_deref().with_context(|| {
                    format!("tls_server_config: client_auth_type {auth} needs client_ca_file")
                })?;
                let pem = std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
                let mut roots = rustls::RootCertStore::empty();
                for c in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
                    roots
                        .add(c.context("client_ca_file is not valid PEM")?)
                        .context("client_ca_file: bad CA certificate")?;
                }
                let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                );
                let v = if auth == "VerifyClientCertIfGiven" {
                    v.allow_unauthenticated()
                } else {
                    v
                };
                builder.with_client_cert_verifier(v.build().context("client certificate verifier")?)
            }
            other => bail!("tls_server_config: unknown client_auth_type {other}"),
        };
        let mut cfg = builder
            .with_single_cert(chain, key)
            .context("tls_server_config: certificate and key do not match")?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Some(Arc::new(cfg)))
    }
}

fn read_pem(file: Option<&Path>, inline: Option<&str>, what: &str) -> anyhow::Result<Vec<u8>> {
    match (file, inline) {
        (Some(f), None) => {
            std::fs::read(f).with_context(|| format!("reading {what} file {}", f.display()))
        }
        (None, Some(s)) => Ok(s.as_bytes().to_vec()),
        (Some(_), Some(_)) => bail!("tls_server_config: set {what}_file or {what}, not both"),
        (None, None) => bail!("tls_server_config: {what}_file is required"),
    }
}

use rustls::pki_types::pem::PemObject as _;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn rejects_unknown_keys_and_plain_passwords() {
        let dir = std::env::temp_dir().join(format!("bufscope-web-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("web.yml");
        std::fs::write(&f, "tls_server_config:\n  cert_fiel: x\n").unwrap();
        let e = format!("{:#}", WebConfig::load(&f).unwrap_err());
        assert!(e.contains("cert_fiel"), "{e}");
        std::fs::write(&f, "basic_auth_users:\n  alice: hunter2\n").unwrap();
        let e = format!("{:#}", WebConfig::load(&f).unwrap_err());
        assert!(e.contains("bcrypt"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
