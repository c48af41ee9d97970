//! A minimal HTTP/1.0 client: enough for `/metrics`, the status page and the JSON API.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::Context as _;

/// Minimal HTTP/1.0 GET of `path` from `addr` (`host:port`), 30 s read timeout; returns
/// (status, body). The status is 0 when the response has no status line.
pub fn http_get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let (status, _, body) = http_get_with(addr, path, &[])?;
    Ok((status, body))
}

/// Response headers: (lower-case name, value), in order.
pub type Headers = Vec<(String, String)>;

/// Like [`http_get`] with extra request headers; returns (status, response headers, body).
pub fn http_get_with(
    addr: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> anyhow::Result<(u16, Headers, String)> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("connect {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes())
        .with_context(|| format!("sending GET {path} to {addr}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .with_context(|| format!("reading GET {path} from {addr}"))?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok((status, headers, body.to_string()))
}
