//! A running `bufscope run` on 127.0.0.1 and an ephemeral port.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context as _, bail};

use crate::metrics::Metrics;
use crate::process::{signal, terminate};

/// A running `bufscope run`. Dropping it stops it with SIGTERM (graceful detach), SIGKILL after
/// 10 s.
pub struct Exporter {
    child: Child,
    addr: String,
    logs: Arc<Mutex<Vec<String>>>,
}

impl Exporter {
    /// Starts `<bin> run --web.listen-address 127.0.0.1:0 <extra>` (with `NO_COLOR=1`) and waits
    /// up to 60 s until it logs the address it serves on.
    pub fn start(bin: &Path, extra: &[&str]) -> anyhow::Result<Self> {
        Self::start_with_env(bin, extra, &[])
    }

    /// [`Exporter::start`] with `env` added to its environment (e.g. a debug build's test
    /// knob).
    pub fn start_with_env(
        bin: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let mut child = Command::new(bin)
            .args(["run", "--web.listen-address", "127.0.0.1:0"])
            .args(extra)
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stderr = child.stderr.take().context("bufscope stderr")?;
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = channel();
        {
            let logs = logs.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    // "serving metrics on http://127.0.0.1:PORT/metrics"
                    let addr = line.split("serving metrics on ").nth(1).map(|rest| {
                        let rest = rest.split("://").nth(1).unwrap_or("");
                        rest.split('/').next().unwrap_or("").to_string()
                    });
                    // Log first, so the caller sees the line once start() returns.
                    logs.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(line);
                    if let Some(a) = addr {
                        let _ = tx.send(a);
                    }
                }
            });
        }
        let mut e = Self {
            child,
            addr: String::new(),
            logs,
        };
        let within = crate::patience(Duration::from_secs(60));
        match rx.recv_timeout(within) {
            Ok(a) => e.addr = a,
            Err(_) => {
                let _ = e.child.kill();
                let _ = e.child.wait();
                bail!(
                    "bufscope did not start serving within {within:?}; log:\n{}",
                    e.log()
                );
            }
        }
        Ok(e)
    }

    /// `host:port` it serves on.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Its log lines so far (stderr), shared with the thread that reads them.
    pub fn logs(&self) -> &Arc<Mutex<Vec<String>>> {
        &self.logs
    }

    /// The log so far, one string.
    pub fn log(&self) -> String {
        self.logs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .join("\n")
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// GET `path`; returns (status, body).
    pub fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        crate::http_get(&self.addr, path)
    }

    /// The `/metrics` text; an error unless the status is 200.
    pub fn metrics_text(&self) -> anyhow::Result<String> {
        let (status, body) = self.get("/metrics")?;
        if status != 200 {
            bail!("GET /metrics: HTTP {status}: {body}");
        }
        Ok(body)
    }

    /// Scrapes and parses `/metrics`.
    pub fn scrape(&self) -> anyhow::Result<Metrics> {
        Ok(Metrics::parse(&self.metrics_text()?))
    }

    /// Stops it with SIGTERM, waits (no time limit) and returns its exit status (graceful
    /// shutdown).
    pub fn stop(mut self) -> anyhow::Result<ExitStatus> {
        signal(self.child.id(), libc::SIGTERM)?;
        self.child.wait().context("waiting for bufscope")
    }

    /// Sends SIGKILL and reaps (for restart tests).
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        terminate(&mut self.child);
    }
}
