//! Helpers for bufscope's privileged integration tests: start the real `bufscope` binary,
//! scrape its real `/metrics`, run workloads in separate processes, and read the kernel's own
//! counters (`/proc/<pid>/net/udp` drops column, `/proc/net/snmp`, `ss -tni`).
//!
//! Tests panic with a message rather than return errors, so a failure shows where.
#![allow(clippy::unwrap_used)]

pub mod fixtures;
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `target/<profile>/` (the directory holding this test binary's `deps/`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test binary has a parent dir");
    if deps.ends_with("deps") {
        deps.parent().expect("deps has a parent").to_path_buf()
    } else {
        deps.to_path_buf()
    }
}

/// Path of the `bufscope` binary under test (`$BUFSCOPE_BIN`, else next to this test).
pub fn bufscope_bin() -> PathBuf {
    let p = std::env::var_os("BUFSCOPE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("bufscope"));
    assert!(
        p.exists(),
        "{} not found: build it first (`cargo build -p bufscope`; `cargo xtask test` does)",
        p.display()
    );
    p
}

/// Path of the workload helper (built with this package).
pub fn workload_bin() -> PathBuf {
    let p = target_dir().join("bufscope-workload");
    assert!(p.exists(), "{} not found", p.display());
    p
}

/// Panics unless running as root (the tests load BPF and create namespaces).
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test needs root: run `cargo xtask test`"
    );
}

/// Polls `f` until it returns `Some`, or panics with `what` after `timeout`.
pub fn eventually<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A running workload process. Dropping it closes its stdin (it exits) and reaps it.
pub struct Workload {
    child: Child,
    stdin: Option<ChildStdin>,
    /// Fields of its `READY` line.
    pub ready: HashMap<String, String>,
    lines: Receiver<String>,
}

impl Workload {
    /// Starts `bufscope-workload <args>` and waits for its `READY` line.
    pub fn start(args: &[&str]) -> Self {
        Self::start_with(Command::new(workload_bin()), args)
    }

    /// Like [`Workload::start`] but through a wrapper (e.g. `setpriv … --`).
    pub fn start_wrapped(wrapper: &[&str], args: &[&str]) -> Self {
        let mut c = Command::new(wrapper[0]);
        c.args(&wrapper[1..]).arg(workload_bin());
        Self::start_with(c, args)
    }

    fn start_with(mut cmd: Command, args: &[&str]) -> Self {
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().expect("spawn workload");
        let stdout = child.stdout.take().expect("stdout");
        let stdin = child.stdin.take();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut w = Self {
            child,
            stdin,
            ready: HashMap::new(),
            lines: rx,
        };
        let line = w.wait_line("READY", Duration::from_secs(30));
        w.ready = line
            .split_whitespace()
            .skip(1)
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        w
    }

    /// Waits for a stdout line starting with `prefix`.
    pub fn wait_line(&mut self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return l,
                Ok(_) => {}
                Err(_) => panic!(
                    "workload {:?} did not print {prefix} within {timeout:?}",
                    self.child.id()
                ),
            }
        }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A field of the READY line.
    pub fn get(&self, key: &str) -> &str {
        self.ready
            .get(key)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("READY line has no {key}: {:?}", self.ready))
    }

    /// Waits for the process to exit by itself; returns true on success.
    pub fn wait(mut self) -> bool {
        self.stdin.take();
        self.child.wait().map(|s| s.success()).unwrap_or(false)
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        if let Some(mut s) = self.stdin.take() {
            let _ = s.write_all(b"exit\n");
        }
        let deadline = Instant::now() + Duration::from_secs(5);
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

/// Socket memory of UDP socket `inode` as `ss -uame` shows it (`skmem:(…,rb<N>,…)`): the
/// kernel's effective receive buffer (`sk_rcvbuf`). Host network namespace.
pub fn ss_udp_rcvbuf(inode: u64) -> Option<u64> {
    let out = Command::new("ss").args(["-uameH"]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let ino = format!("ino:{inode} ");
    // skmem is on the socket's line or on the indented line after it.
    let mut lines = text.lines().skip_while(|l| !l.contains(&ino));
    let first = lines.next()?;
    let second = lines.next().unwrap_or("");
    let skmem = first
        .split("skmem:(")
        .nth(1)
        .or_else(|| second.split("skmem:(").nth(1))?;
    skmem
        .split(',')
        .find_map(|f| f.strip_prefix("rb"))
        .and_then(|v| v.trim_end_matches(')').parse().ok())
}

/// A running `bufscope run`. Dropping it stops it with SIGTERM (graceful detach).
pub struct Exporter {
    child: Child,
    /// `host:port` it serves on.
    pub addr: String,
    /// Its log lines so far.
    pub logs: Arc<Mutex<Vec<String>>>,
}

impl Exporter {
    /// Starts `bufscope run --web.listen-address 127.0.0.1:0 <extra>` and waits until it serves.
    pub fn start(extra: &[&str]) -> Self {
        require_root();
        let mut child = Command::new(bufscope_bin())
            .args(["run", "--web.listen-address", "127.0.0.1:0"])
            .args(extra)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn bufscope");
        let stderr = child.stderr.take().expect("stderr");
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = channel();
        {
            let logs = logs.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let addr = line.split("serving metrics on ").nth(1).map(|rest| {
                        let rest = rest.split("://").nth(1).unwrap_or("");
                        rest.split('/').next().unwrap_or("").to_string()
                    });
                    // Log first, so the caller sees the line once start() returns.
                    logs.lock().unwrap().push(line);
                    if let Some(a) = addr {
                        let _ = tx.send(a);
                    }
                }
            });
        }
        let addr = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "bufscope did not start serving within 60 s; log:\n{}",
                    logs.lock().unwrap().join("\n")
                );
            }
        };
        Self { child, addr, logs }
    }

    /// GET `path`; returns (status, body).
    pub fn get(&self, path: &str) -> (u16, String) {
        http_get(&self.addr, path)
    }

    /// Scrapes `/metrics`.
    pub fn scrape(&self) -> Metrics {
        let (status, body) = self.get("/metrics");
        assert_eq!(status, 200, "GET /metrics: {body}");
        Metrics::parse(&body)
    }

    /// Raw `/metrics` text.
    pub fn scrape_text(&self) -> String {
        self.get("/metrics").1
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The log so far.
    pub fn log(&self) -> String {
        self.logs.lock().unwrap().join("\n")
    }

    /// Stops it with SIGTERM and returns its exit status (graceful shutdown).
    pub fn stop(mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        self.child.wait().expect("wait for bufscope")
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

/// Stops a child with SIGTERM (graceful shutdown), SIGKILL after 10 s, and reaps it.
pub fn terminate(child: &mut Child) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// BPF object ids held open by `pid`: the `key` lines (`prog_id:`, `link_id:`, `map_id:`) of
/// `/proc/<pid>/fdinfo`.
pub fn held_bpf_ids(pid: u32, key: &str) -> std::collections::BTreeSet<u32> {
    let mut ids = std::collections::BTreeSet::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .flatten()
    {
        if let Ok(text) = std::fs::read_to_string(e.path()) {
            for l in text.lines() {
                if let Some(v) = l.strip_prefix(key) {
                    ids.insert(v.trim().parse().unwrap());
                }
            }
        }
    }
    ids
}

/// True while the kernel still has BPF object `kind` (`prog`, `link`) `id` (per `bpftool`).
pub fn bpf_exists(kind: &str, id: u32) -> bool {
    Command::new("bpftool")
        .args([kind, "show", "id", &id.to_string()])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Runs `promtool check metrics` on `text`; returns (success, output).
pub fn promtool_check_metrics(text: &str) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus; cargo xtask setup installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let msg = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), msg)
}

/// Minimal HTTP/1.0 GET (no client dependency needed for tests).
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, body.to_string())
}

/// One sample of the exposition.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Metric name.
    pub name: String,
    /// Labels (unescaped values).
    pub labels: BTreeMap<String, String>,
    /// Value.
    pub value: f64,
}

/// A parsed scrape.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// Every sample.
    pub samples: Vec<Sample>,
}

impl Metrics {
    /// Parses the Prometheus text format (what bufscope emits: no timestamps).
    pub fn parse(text: &str) -> Self {
        let mut samples = Vec::new();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (name, rest) = match line.find('{') {
                Some(i) => (&line[..i], &line[i..]),
                None => match line.split_once(' ') {
                    Some((n, v)) => {
                        samples.push(Sample {
                            name: n.to_string(),
                            labels: BTreeMap::new(),
                            value: v.trim().parse().unwrap_or(f64::NAN),
                        });
                        continue;
                    }
                    None => continue,
                },
            };
            let (labels, after) = parse_labels(rest);
            samples.push(Sample {
                name: name.to_string(),
                labels,
                value: after.trim().parse().unwrap_or(f64::NAN),
            });
        }
        Self { samples }
    }

    /// Samples of `name` whose labels include all of `want`.
    pub fn find<'a>(
        &'a self,
        name: &'a str,
        want: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name
                && want
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }

    /// Sum of matching samples (0 when none).
    pub fn sum(&self, name: &str, want: &[(&str, &str)]) -> f64 {
        self.find(name, want).map(|s| s.value).sum()
    }
}

/// Parses `{a="x",b="y\"z"}` and returns the labels and the text after `}`.
fn parse_labels(s: &str) -> (BTreeMap<String, String>, &str) {
    let mut labels = BTreeMap::new();
    let b = s.as_bytes();
    let mut i = 1; // after '{'
    loop {
        while i < b.len() && (b[i] == b',' || b[i] == b' ') {
            i += 1;
        }
        if i >= b.len() || b[i] == b'}' {
            return (labels, s.get(i + 1..).unwrap_or(""));
        }
        let eq = s[i..].find('=').map(|x| x + i).unwrap_or(b.len());
        let key = s[i..eq].to_string();
        i = eq + 2; // skip ="
        let mut val = Vec::new();
        while i < b.len() && b[i] != b'"' {
            if b[i] == b'\\' && i + 1 < b.len() {
                val.push(match b[i + 1] {
                    b'n' => b'\n',
                    c => c,
                });
                i += 2;
            } else {
                val.push(b[i]);
                i += 1;
            }
        }
        i += 1; // closing quote
        labels.insert(key, String::from_utf8_lossy(&val).into_owned());
    }
}

/// The `drops` column of socket `inode` in `/proc/<pid>/net/udp{,6}` (the kernel's per-socket
/// count, read in the socket's own network namespace through a process inside it).
pub fn proc_udp_drops(pid: u32, inode: u64) -> Option<u64> {
    for file in ["udp", "udp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{file}")).ok()?;
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 12 && f[9].parse::<u64>().ok() == Some(inode) {
                return f.last()?.parse().ok();
            }
        }
    }
    None
}

/// A counter from `/proc/<pid>/net/snmp` (e.g. `("Udp", "RcvbufErrors")`).
pub fn snmp(pid: u32, proto: &str, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/snmp")).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{proto}:")))
        .collect();
    let names: Vec<&str> = lines[0].split_whitespace().collect();
    let vals: Vec<&str> = lines[1].split_whitespace().collect();
    let i = names.iter().position(|n| *n == field).unwrap();
    vals[i].parse().unwrap()
}

/// One established TCP connection as `ss -tni` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SsConn {
    /// Local port.
    pub local_port: u16,
    /// Peer port.
    pub peer_port: u16,
    /// Our receive window scale (`wscale:<snd>,<rcv>`).
    pub rcv_wscale: u8,
    /// The peer's scale.
    pub snd_wscale: u8,
}

/// Established TCP connections on loopback in the host namespace (`ss -tni`).
pub fn ss_tcp() -> Vec<SsConn> {
    let out = Command::new("ss")
        .args(["-tniH", "state", "established"])
        .output()
        .expect("run ss");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut conns = Vec::new();
    let mut current: Option<(u16, u16)> = None;
    for line in text.lines() {
        if !line.starts_with(char::is_whitespace) {
            // Recv-Q Send-Q Local:Port Peer:Port
            let f: Vec<&str> = line.split_whitespace().collect();
            let port = |s: &str| s.rsplit(':').next().and_then(|p| p.parse().ok());
            current = match (
                f.get(2).and_then(|s| port(s)),
                f.get(3).and_then(|s| port(s)),
            ) {
                (Some(l), Some(p)) => Some((l, p)),
                _ => None,
            };
        } else if let Some((l, p)) = current {
            let ws = line
                .split_whitespace()
                .find_map(|t| t.strip_prefix("wscale:"));
            if let Some((snd, rcv)) = ws.and_then(|w| w.split_once(',')) {
                conns.push(SsConn {
                    local_port: l,
                    peer_port: p,
                    snd_wscale: snd.parse().unwrap_or(0),
                    rcv_wscale: rcv.parse().unwrap_or(0),
                });
            }
            current = None;
        }
    }
    conns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_escaped_labels() {
        let m = Metrics::parse("# HELP x y\nx_total{comm=\"a\\\"b\\\\c\\nd\",pid=\"1\"} 5\nup 1\n");
        assert_eq!(m.samples.len(), 2);
        assert_eq!(m.samples[0].labels["comm"], "a\"b\\c\nd");
        assert_eq!(m.sum("x_total", &[("pid", "1")]), 5.0);
        assert_eq!(m.sum("up", &[]), 1.0);
    }
}
