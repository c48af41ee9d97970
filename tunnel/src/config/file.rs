//! The wg-quick-like config file: `[Interface]`, one `[Peer]` and `[Bufscope]`, `Key = Value`
//! lines, `#`/`;` comments. Every error names its line.

use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use bufscope_policy::units::parse_duration;

use super::values::parse_bandwidth;
use super::{BufferPolicy, Congestion, QuicMode, TransportKind};
use crate::net::Cidr;

/// Values read from a config file (all optional; flags may supply the rest).
#[derive(Debug, Default)]
pub(super) struct FileConfig {
    pub(super) private_key: Option<String>,
    pub(super) addresses: Vec<Cidr>,
    pub(super) listen_port: Option<u16>,
    pub(super) mtu: Option<u16>,
    pub(super) peer_public_key: Option<String>,
    pub(super) preshared_key: Option<String>,
    pub(super) endpoint: Option<String>,
    pub(super) allowed_ips: Vec<Cidr>,
    pub(super) persistent_keepalive: Option<u16>,
    pub(super) transport: Option<TransportKind>,
    pub(super) quic_mode: Option<QuicMode>,
    pub(super) congestion: Option<Congestion>,
    pub(super) buffer_policy: Option<BufferPolicy>,
    pub(super) target_bandwidth: Option<u64>,
    pub(super) target_rtt: Option<Duration>,
    pub(super) interface: Option<String>,
    pub(super) offload: Option<bool>,
}

#[derive(PartialEq)]
enum Section {
    None,
    Interface,
    Peer,
    Bufscope,
}

/// One `Key = Value` line: the key (lower case), the value and the line number.
struct Line<'a> {
    lineno: usize,
    key: String,
    value: &'a str,
}

impl Line<'_> {
    /// The value through its `FromStr` (whose errors are strings), with the line in the error.
    fn parse<T: FromStr<Err = String>>(&self) -> Result<T> {
        self.value
            .parse()
            .map_err(|e: String| anyhow!(e))
            .with_context(|| self.bad())
    }

    /// A comma-separated list of prefixes.
    fn prefixes(&self) -> Result<Vec<Cidr>> {
        self.value
            .split(',')
            .filter(|a| !a.trim().is_empty())
            .map(|a| {
                a.parse()
                    .map_err(|e: String| anyhow!(e))
                    .with_context(|| self.bad())
            })
            .collect()
    }

    fn bad(&self) -> String {
        format!("line {}: bad value for {}", self.lineno, self.key)
    }
}

/// Parses a config file.
pub(super) fn parse_file(text: &str) -> Result<FileConfig> {
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
        let l = Line {
            lineno,
            key: key.trim().to_ascii_lowercase(),
            value: value.trim(),
        };
        let known = match section {
            Section::Interface => interface_key(&mut c, &l)?,
            Section::Peer => peer_key(&mut c, &l)?,
            Section::Bufscope => bufscope_key(&mut c, &l)?,
            Section::None => bail!("line {lineno}: {} outside of a section", l.key),
        };
        if !known {
            bail!("line {lineno}: unknown key {:?} in this section", l.key);
        }
    }
    Ok(c)
}

/// A key of `[Interface]`; `false` if there is no such key.
fn interface_key(c: &mut FileConfig, l: &Line) -> Result<bool> {
    match l.key.as_str() {
        "privatekey" => c.private_key = Some(l.value.to_string()),
        "address" => c.addresses.extend(l.prefixes()?),
        "listenport" => c.listen_port = Some(l.value.parse().with_context(|| l.bad())?),
        "mtu" => c.mtu = Some(l.value.parse().with_context(|| l.bad())?),
        "dns" | "table" | "preup" | "postup" | "predown" | "postdown" | "saveconfig" | "fwmark" => {
            tracing::warn!(
                "config line {}: {} is a wg-quick setting bufscope-tunnel ignores",
                l.lineno,
                l.key
            );
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// A key of `[Peer]`; `false` if there is no such key.
fn peer_key(c: &mut FileConfig, l: &Line) -> Result<bool> {
    match l.key.as_str() {
        "publickey" => c.peer_public_key = Some(l.value.to_string()),
        "presharedkey" => c.preshared_key = Some(l.value.to_string()),
        "endpoint" => c.endpoint = Some(l.value.to_string()),
        "allowedips" => c.allowed_ips.extend(l.prefixes()?),
        "persistentkeepalive" => {
            c.persistent_keepalive = match l.value.to_ascii_lowercase().as_str() {
                "off" => Some(0),
                v => Some(v.parse().with_context(|| l.bad())?),
            }
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// A key of `[Bufscope]`; `false` if there is no such key.
fn bufscope_key(c: &mut FileConfig, l: &Line) -> Result<bool> {
    match l.key.as_str() {
        "transport" => c.transport = Some(l.parse()?),
        "quicmode" => c.quic_mode = Some(l.parse()?),
        "congestion" => c.congestion = Some(l.parse()?),
        "bufferpolicy" => c.buffer_policy = Some(l.parse()?),
        "targetbandwidth" => {
            c.target_bandwidth = Some(
                parse_bandwidth(l.value)
                    .map_err(|e| anyhow!(e))
                    .with_context(|| l.bad())?,
            )
        }
        "targetrtt" => {
            c.target_rtt = Some(
                parse_duration(l.value)
                    .map_err(|e| anyhow!(e))
                    .with_context(|| l.bad())?,
            )
        }
        "interface" => c.interface = Some(l.value.to_string()),
        "offload" => {
            c.offload = Some(match l.value.to_ascii_lowercase().as_str() {
                "true" | "yes" | "on" | "1" => true,
                "false" | "no" | "off" | "0" => false,
                _ => bail!("line {}: Offload must be true or false", l.lineno),
            })
        }
        _ => return Ok(false),
    }
    Ok(true)
}
