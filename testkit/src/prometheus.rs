//! A real `prometheus` server on loopback (Debian's package; `cargo xtask setup` installs it)
//! with a temporary TSDB, for tests that check what Prometheus itself stores and computes.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};

use crate::http_get;

/// A running `prometheus`; stopped and its directory removed on drop.
pub struct Prometheus {
    child: Child,
    addr: String,
    dir: PathBuf,
}

impl Prometheus {
    /// Starts `prometheus` with `config` (prometheus.yml text) and `extra` flags on a free
    /// loopback port; returns once `/-/ready` answers 200 (30 s at most).
    pub fn start(config: &str, extra: &[&str]) -> anyhow::Result<Self> {
        Self::start_with_files(config, &[], extra)
    }

    /// Like [`Prometheus::start`], with `files` (name, text) written beside prometheus.yml
    /// first: rule files the config names, say.
    pub fn start_with_files(
        config: &str,
        files: &[(&str, &str)],
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "bufscope-prometheus-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::write(dir.join("prometheus.yml"), config)?;
        for (name, text) in files {
            std::fs::write(dir.join(name), text)
                .with_context(|| format!("writing {name} in {}", dir.display()))?;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr = format!("127.0.0.1:{port}");
        let log = std::fs::File::create(dir.join("prometheus.log"))?;
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("prometheus (Debian package prometheus; cargo xtask setup installs it)")?;
        let mut p = Self { child, addr, dir };
        let start = Instant::now();
        loop {
            if let Ok(Some(st)) = p.child.try_wait() {
                bail!("prometheus exited ({st}):\n{}", p.log());
            }
            if http_get(&p.addr, "/-/ready").is_ok_and(|(s, _)| s == 200) {
                return Ok(p);
            }
            if start.elapsed() > Duration::from_secs(30) {
                bail!("prometheus not ready after 30 s:\n{}", p.log());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `host:port` it serves on.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// GET an HTTP API path with query parameters (URL-encoded here); returns the body (JSON)
    /// when the status is 200.
    pub fn api(&self, path: &str, params: &[(&str, &str)]) -> anyhow::Result<String> {
        let q: Vec<String> = params
            .iter()
            .map(|(k, v)| format!("{k}={}", urlencode(v)))
            .collect();
        let (status, body) = http_get(&self.addr, &format!("{path}?{}", q.join("&")))?;
        if status != 200 {
            bail!("{path} {params:?}: HTTP {status}: {body}");
        }
        Ok(body)
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        crate::terminate(&mut self.child);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Percent-encodes everything but unreserved characters.
pub fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
