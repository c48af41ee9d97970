//! The HTTP(S) client of a running bufscope's API: one HTTP/1.0 request per call (the daemon
//! answers small documents; no connection is kept), TLS with the CA file given, basic auth with
//! the password from `$BUFSCOPE_PASSWORD`. [`Client::status`] and [`Client::findings`] read the
//! documents as `bufscope-api` types.

use std::io::{Read as _, Write as _};
use std::net::{TcpStream, ToSocketAddrs as _};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bufscope_api::{Report, StatusDocument};
use rustls::pki_types::pem::PemObject as _;
use serde::de::DeserializeOwned;

/// A parsed `http(s)://host:port` base URL.
struct Url {
    tls: bool,
    host: String,
    port: u16,
}

fn parse_url(s: &str) -> anyhow::Result<Url> {
    let (tls, rest) = if let Some(r) = s.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = s.strip_prefix("http://") {
        (false, r)
    } else {
        bail!("invalid --url {s:?}: expected http://HOST:PORT or https://HOST:PORT");
    };
    let hostport = rest.split('/').next().unwrap_or(rest);
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() => (
            h.trim_matches(['[', ']']).to_string(),
            p.parse()
                .with_context(|| format!("invalid port in --url {s:?}"))?,
        ),
        _ => (hostport.to_string(), if tls { 443 } else { 80 }),
    };
    Ok(Url { tls, host, port })
}

/// How to reach a running bufscope: the flags `bufscope explain` and `bufscope top` share.
#[derive(clap::Args, Clone, Debug)]
pub struct ConnectArgs {
    /// Base URL of the running exporter (`https://…` with --tls.ca-file for TLS).
    #[arg(
        long = "url",
        default_value = "http://127.0.0.1:9477",
        value_name = "URL"
    )]
    pub url: String,
    /// CA certificate (PEM) to verify an https exporter with.
    #[arg(long = "tls.ca-file", value_name = "FILE")]
    pub ca_file: Option<std::path::PathBuf>,
    /// Basic-auth user (the password is read from $BUFSCOPE_PASSWORD).
    #[arg(long = "web.user", value_name = "USER")]
    pub user: Option<String>,
}

/// A client of a running bufscope's HTTP API (`--url`, `--tls.ca-file`, `--web.user` with the
/// password in `$BUFSCOPE_PASSWORD`: [`ConnectArgs`]), shared by `bufscope explain` and
/// `bufscope top`. One
/// HTTP/1.0 request per call; the TLS configuration is built once.
pub struct Client {
    /// The base URL as given.
    base: String,
    url: Url,
    tls: Option<Arc<rustls::ClientConfig>>,
    /// `Authorization` header value.
    auth: Option<String>,
    /// Connect and read timeout.
    timeout: Duration,
}

impl Client {
    /// A client as `args` say ([`Client::new`]).
    pub fn from_args(args: &ConnectArgs) -> anyhow::Result<Self> {
        Self::new(&args.url, args.ca_file.as_deref(), args.user.as_deref())
    }

    /// A client of the exporter at `url` (`http://HOST:PORT` or `https://HOST:PORT`; an https
    /// URL needs `ca_file`, the CA that signed the exporter's certificate). With `user`, every
    /// request carries basic auth with the password from `$BUFSCOPE_PASSWORD`.
    pub fn new(url: &str, ca_file: Option<&Path>, user: Option<&str>) -> anyhow::Result<Self> {
        let parsed = parse_url(url)?;
        let tls = if parsed.tls {
            let ca = ca_file.context(
                "an https --url needs --tls.ca-file (the CA that signed the exporter's certificate)",
            )?;
            let pem = std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
            let mut roots = rustls::RootCertStore::empty();
            for c in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
                roots.add(c.context("--tls.ca-file is not valid PEM")?)?;
            }
            let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
            Some(Arc::new(cfg))
        } else {
            None
        };
        let auth = user.map(|user| {
            let pass = std::env::var("BUFSCOPE_PASSWORD").unwrap_or_default();
            format!("Basic {}", BASE64.encode(format!("{user}:{pass}")))
        });
        Ok(Self {
            base: url.to_string(),
            url: parsed,
            tls,
            auth,
            timeout: Duration::from_secs(30),
        })
    }

    /// Sets the read timeout (default 30 s); connecting waits at most 5 s or this, whichever
    /// is shorter.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The base URL as given.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// GETs `path` and returns (status, body).
    pub fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let url = &self.url;
        let a = &self.base;
        let addr = (url.host.as_str(), url.port)
            .to_socket_addrs()
            .with_context(|| format!("resolving {a}"))?
            .next()
            .with_context(|| format!("{a} resolves to no address"))?;
        let tcp = TcpStream::connect_timeout(&addr, self.timeout.min(Duration::from_secs(5)))
            .with_context(|| format!("connecting to {a} (is `bufscope run` running there?)"))?;
        tcp.set_read_timeout(Some(self.timeout))?;
        let mut req = format!(
            "GET {path} HTTP/1.0\r\nHost: {}\r\nAccept: application/json\r\n",
            url.host
        );
        if let Some(auth) = &self.auth {
            req.push_str(&format!("Authorization: {auth}\r\n"));
        }
        req.push_str("\r\n");
        let mut raw = Vec::new();
        if let Some(cfg) = &self.tls {
            let name = rustls::pki_types::ServerName::try_from(url.host.clone())
                .with_context(|| format!("invalid TLS server name {}", url.host))?;
            let conn = rustls::ClientConnection::new(cfg.clone(), name)?;
            let mut s = rustls::StreamOwned::new(conn, tcp);
            s.write_all(req.as_bytes())?;
            match s.read_to_end(&mut raw) {
                Ok(_) => {}
                // Servers may close without close_notify after the body.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
                Err(e) => return Err(e).context("TLS read"),
            }
        } else {
            let mut s = tcp;
            s.write_all(req.as_bytes())?;
            s.read_to_end(&mut raw)?;
        }
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        Ok((status, body.to_string()))
    }

    /// GETs `path` and parses the JSON document as `T`; a status other than 200 is an error
    /// that says what to do (basic auth wanted, HTTP code otherwise).
    pub fn get_json<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        let (status, body) = self.get(path)?;
        match status {
            200 => {}
            401 => bail!(
                "{} wants basic auth: pass --web.user and set $BUFSCOPE_PASSWORD",
                self.base
            ),
            s => bail!("GET {}{path} returned HTTP {s}", self.base),
        }
        parse(path, &body)
    }

    /// Reads `/api/v1/status`.
    pub fn status(&self) -> anyhow::Result<StatusDocument> {
        self.get_json(bufscope_api::status::PATH)
    }

    /// Reads `/api/v1/findings`; a report of another schema version is an error naming both.
    pub fn findings(&self) -> anyhow::Result<Report> {
        let r: Report = self.get_json(bufscope_api::findings::PATH)?;
        if r.version != bufscope_api::SCHEMA_VERSION {
            bail!(
                "the exporter serves findings schema version {}, this bufscope reads version {}: \
                 run the bufscope of the exporter's release",
                r.version,
                bufscope_api::SCHEMA_VERSION
            );
        }
        Ok(r)
    }
}

/// Parses the body of `path`: syntax first (a truncated or non-JSON body is "invalid JSON"
/// whatever it starts with), then the shape.
fn parse<T: DeserializeOwned>(path: &str, body: &str) -> anyhow::Result<T> {
    let doc: serde_json::Value =
        serde_json::from_str(body).context("the exporter returned invalid JSON")?;
    serde_json::from_value(doc).with_context(|| {
        format!(
            "the exporter's {path} is not the document this bufscope reads (bufscope-api {})",
            env!("CARGO_PKG_VERSION")
        )
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn urls() {
        let u = parse_url("http://127.0.0.1:9477").unwrap();
        assert!(!u.tls && u.port == 9477 && u.host == "127.0.0.1");
        let u = parse_url("https://[::1]:1234/x").unwrap();
        assert!(u.tls && u.port == 1234 && u.host == "::1");
        assert!(parse_url("ftp://x").is_err());
    }

    #[test]
    fn invalid_json_then_the_wrong_document() {
        let e = parse::<StatusDocument>("/api/v1/status", r#"{"processes": [1, 2"#).unwrap_err();
        assert_eq!(e.to_string(), "the exporter returned invalid JSON");
        assert!(
            e.root_cause().to_string().starts_with("EOF while parsing"),
            "{e:#}"
        );
        let e = parse::<StatusDocument>("/api/v1/status", r#"{"processes": [1]}"#).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("the exporter's /api/v1/status is not the document"),
            "{e:#}"
        );
        assert!(
            e.root_cause()
                .to_string()
                .contains("expected struct ProcessRow"),
            "{e:#}"
        );
        let s: StatusDocument = parse("/api/v1/status", r#"{"processes": []}"#).unwrap();
        assert!(s.processes.is_empty());
    }
}
