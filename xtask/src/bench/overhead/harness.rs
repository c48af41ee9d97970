//! What every section runs on: the release binaries, child processes whose stdout lines
//! arrive on a channel, a running `bufscope run`, a running bpftrace script, HTTP and the
//! statistics the tables show.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use super::Args;
use crate::bench::release_dir;
use crate::util::{cargo, run_cmd};

/// The release binaries under test.
pub(super) struct Bins {
    pub(super) bufscope: PathBuf,
    pub(super) workload: PathBuf,
}

impl Bins {
    pub(super) fn find_or_build(a: &Args) -> anyhow::Result<Self> {
        let dir = match &a.bin_dir {
            Some(d) => d.clone(),
            None => {
                run_cmd(cargo().args([
                    "build",
                    "--release",
                    "-p",
                    "bufscope",
                    "-p",
                    "bufscope-integration",
                ]))?;
                release_dir()
            }
        };
        let b = Self {
            bufscope: dir.join("bufscope"),
            workload: dir.join("bufscope-workload"),
        };
        for p in [&b.bufscope, &b.workload] {
            if !p.exists() {
                bail!(
                    "{} not found (build with `cargo build --release -p bufscope -p bufscope-integration`)",
                    p.display()
                );
            }
        }
        Ok(b)
    }

    pub(super) fn workload(&self, netns: Option<&str>, args: &[&str]) -> Command {
        match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.workload).args(args);
                c
            }
            None => {
                let mut c = Command::new(&self.workload);
                c.args(args);
                c
            }
        }
    }
}

unsafe extern "C" {
    pub(super) fn kill(pid: i32, sig: i32) -> i32;
}
const SIGINT: i32 = 2;
const SIGTERM: i32 = 15;

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe {
        kill(pid as i32, sig);
    }
}

/// A child process whose stdout lines arrive on a channel. Dropping it closes its stdin,
/// signals it (`stop_signal`) and reaps it.
pub(super) struct Proc {
    pub(super) child: Child,
    pub(super) stdin: Option<ChildStdin>,
    pub(super) lines: Receiver<String>,
    pub(super) name: String,
    pub(super) stop_signal: i32,
}

impl Proc {
    pub(super) fn spawn(mut cmd: Command, name: &str, stop_signal: i32) -> anyhow::Result<Self> {
        // Workloads are quiet unless something fails; bpftrace warns about things that do
        // not matter here.
        let stderr = if stop_signal == SIGINT {
            Stdio::null()
        } else {
            Stdio::inherit()
        };
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr);
        let mut child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        let stdout = child.stdout.take().context("child stdout")?;
        let stdin = child.stdin.take();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            child,
            stdin,
            lines: rx,
            name: name.to_string(),
            stop_signal,
        })
    }

    /// Starts a workload and waits for its `READY` line; returns it with the line's fields.
    pub(super) fn workload(
        bins: &Bins,
        netns: Option<&str>,
        args: &[&str],
    ) -> anyhow::Result<(Self, BTreeMap<String, String>)> {
        let mut p = Self::spawn(bins.workload(netns, args), args[0], SIGTERM)?;
        let line = p.wait_line("READY", Duration::from_secs(60))?;
        let fields = line
            .split_whitespace()
            .skip(1)
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Ok((p, fields))
    }

    pub(super) fn wait_line(&mut self, prefix: &str, timeout: Duration) -> anyhow::Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return Ok(l),
                Ok(_) => {}
                Err(_) => bail!("{} did not print {prefix} within {timeout:?}", self.name),
            }
        }
    }

    pub(super) fn send(&mut self, line: &str) -> anyhow::Result<()> {
        let s = self.stdin.as_mut().context("stdin closed")?;
        writeln!(s, "{line}")?;
        s.flush()?;
        Ok(())
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until it exits by itself.
    pub(super) fn wait(mut self, timeout: Duration) -> anyhow::Result<()> {
        self.stdin.take();
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait()? {
                if st.success() {
                    return Ok(());
                }
                bail!("{} failed: {st}", self.name);
            }
            if Instant::now() > deadline {
                bail!("{} did not finish within {timeout:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut s) = self.stdin.take() {
            let _ = s.write_all(b"exit\n");
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        signal(self.child.id(), self.stop_signal);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running `bufscope run` on 127.0.0.1:<ephemeral>. Dropping it stops it with SIGTERM.
pub(super) struct Exporter {
    pub(super) child: Child,
    pub(super) addr: String,
    pub(super) logs: Arc<Mutex<Vec<String>>>,
}

impl Exporter {
    pub(super) fn start(bins: &Bins, extra: &[&str]) -> anyhow::Result<Self> {
        let mut child = Command::new(&bins.bufscope)
            .args([
                "run",
                "--web.listen-address",
                "127.0.0.1:0",
                "--log.level",
                "info",
            ])
            .args(extra)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting bufscope")?;
        let stderr = child.stderr.take().context("bufscope stderr")?;
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = channel();
        {
            let logs = logs.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    // "serving metrics on http://127.0.0.1:PORT/metrics"
                    if let Some(rest) = line.split("serving metrics on ").nth(1) {
                        let host = rest.split("://").nth(1).unwrap_or("");
                        let _ = tx.send(host.split('/').next().unwrap_or("").to_string());
                    }
                    if let Ok(mut l) = logs.lock() {
                        l.push(line);
                    }
                }
            });
        }
        let addr = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                let log = logs.lock().map(|l| l.join("\n")).unwrap_or_default();
                bail!("bufscope did not start serving within 60 s:\n{log}");
            }
        };
        let e = Self { child, addr, logs };
        e.check_attached()?;
        Ok(e)
    }

    /// Fails when a probe that was not disabled did not attach.
    pub(super) fn check_attached(&self) -> anyhow::Result<()> {
        let log = self.logs.lock().map(|l| l.join("\n")).unwrap_or_default();
        if log.contains("probe could not attach") {
            bail!("a bufscope probe did not attach:\n{log}");
        }
        Ok(())
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(super) fn scrape(&self) -> anyhow::Result<String> {
        let (status, body) = http_get(&self.addr, "/metrics")?;
        if status != 200 {
            bail!("GET /metrics: HTTP {status}");
        }
        Ok(body)
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        signal(self.child.id(), SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running bpftrace one-liner (attached once it printed "Attaching"). Dropped with SIGINT.
pub(super) struct Bpftrace(Proc);

impl Bpftrace {
    pub(super) fn start(script: &str) -> anyhow::Result<Self> {
        let mut cmd = Command::new("bpftrace");
        cmd.args(["-e", script]);
        let mut p = Proc::spawn(cmd, "bpftrace", SIGINT)?;
        p.wait_line("Attaching", Duration::from_secs(120))
            .with_context(|| format!("bpftrace -e '{script}'"))?;
        // "Attaching N probes..." is printed before the attach calls return.
        std::thread::sleep(Duration::from_millis(500));
        Ok(Self(p))
    }

    pub(super) fn pid(&self) -> u32 {
        self.0.pid()
    }
}

/// Minimal HTTP/1.0 GET; returns (status, body).
fn http_get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_string()))
}

/// Sum of the samples of `name` (with all of `labels`) in a Prometheus text body.
pub(super) fn metric_sum(body: &str, name: &str, labels: &[&str]) -> f64 {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
        })
        .filter(|l| labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub(super) fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Nearest-rank percentile (`p` in 0..=100).
pub(super) fn percentile(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * s.len() as f64).ceil().max(1.0) as usize;
    s[rank.min(s.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_percentiles() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
    }

    #[test]
    fn metric_sums_match_labels() {
        let body = "# HELP x y\nx{map=\"DROPS\"} 3\nx{map=\"AUTOTUNE\"} 4\nx_total 9\n";
        assert_eq!(metric_sum(body, "x", &["map=\"DROPS\""]), 3.0);
        assert_eq!(metric_sum(body, "x", &[]), 7.0);
    }
}
