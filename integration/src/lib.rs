//! Helpers for bufscope's privileged integration tests: start the real `bufscope` binary,
//! scrape its real `/metrics`, run workloads in separate processes, and read the kernel's own
//! counters (`/proc/<pid>/net/udp` drops column, `/proc/net/snmp`, `ss -tni`).
//!
//! Tests panic with a message rather than return errors, so a failure shows where.
#![allow(clippy::unwrap_used)]

pub mod bpftrace;
pub mod fixtures;
pub mod manifests;
pub mod node;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bufscope_testkit::LineChild;
// Shared with the benchmarks (`cargo xtask bench`): see `bufscope-testkit`.
pub use bufscope_testkit::{Metrics, Sample, comm_of, proc_udp_drops, terminate};

/// The value of a testkit helper, or a panic with its error (tests panic with a message).
fn ok<T>(r: anyhow::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e:#}"))
}

/// The repository root (the parent of this crate's directory).
pub fn repo() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent().unwrap_or(here).to_path_buf()
}

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

/// What the binary under test has, from its own registry (`bufscope check --list --json`):
/// `probes` (name, default, variants' hooks) and `status_columns`. Tests take their lists of
/// probes and columns from here, so a new signal cannot be missed by a hand-kept list.
pub fn registry() -> serde_json::Value {
    let out = Command::new(bufscope_bin())
        .args(["check", "--list", "--json"])
        .output()
        .expect("bufscope check --list --json");
    assert!(
        out.status.success(),
        "bufscope check --list --json: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("bufscope check --list --json prints JSON")
}

/// The probes `bufscope run` attaches with every flag at its default (from [`registry`]:
/// every probe but the ones configuration switches on, such as the guard).
pub fn default_probes() -> Vec<String> {
    registry()["probes"]
        .as_array()
        .expect("a probes list")
        .iter()
        .filter(|p| p["default"] == true)
        .filter_map(|p| p["name"].as_str().map(String::from))
        .collect()
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
pub fn eventually<T>(timeout: Duration, what: &str, f: impl FnMut() -> Option<T>) -> T {
    ok(bufscope_testkit::wait_until(
        timeout,
        Duration::from_millis(100),
        what,
        f,
    ))
}

/// A running workload process. Dropping it closes its stdin (it exits) and reaps it.
pub struct Workload {
    proc: LineChild,
    /// Fields of its `READY` line.
    pub ready: HashMap<String, String>,
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
        cmd.args(args).stderr(Stdio::inherit());
        let mut proc = ok(LineChild::spawn(cmd, "workload"));
        let ready = ok(proc.wait_ready(Duration::from_secs(30)));
        // Its series are labelled with its name (`wl<pid>`, set before READY): remembered now
        // so that a `("pid", N)` selection still finds them after it exits.
        let _ = comm_of(&proc.pid().to_string());
        Self { proc, ready }
    }

    /// Waits for a stdout line starting with `prefix`.
    pub fn wait_line(&mut self, prefix: &str, timeout: Duration) -> String {
        ok(self.proc.wait_line(prefix, timeout))
    }

    /// Writes `line` to its stdin.
    pub fn send(&mut self, line: &str) {
        ok(self.proc.send(line));
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.proc.pid()
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
        self.proc.wait().is_ok_and(|s| s.success())
    }
}

/// A helper process a test started (`ip xfrm monitor`, a namespace's resident, `ip -batch`):
/// killed (SIGKILL, which also ends a stopped process) and reaped when dropped, so also when
/// the test panics, and never left behind holding a netlink socket or the kernel lock.
pub struct Spawned {
    child: std::process::Child,
    what: String,
}

impl Spawned {
    /// Spawns `cmd`.
    pub fn new(cmd: &mut Command) -> Self {
        let what = format!("{:?}", cmd);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        Self { child, what }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `sig` (e.g. `libc::SIGSTOP`) to it.
    pub fn signal(&self, sig: i32) {
        // SAFETY: a signal to our own child, not yet reaped (reaping needs `&mut self`).
        let rc = unsafe { libc::kill(self.child.id() as i32, sig) };
        assert_eq!(rc, 0, "signal {sig} to {}", self.what);
    }

    /// Its stdin (when spawned with `Stdio::piped()`), taken.
    pub fn take_stdin(&mut self) -> std::process::ChildStdin {
        self.child
            .stdin
            .take()
            .unwrap_or_else(|| panic!("{} has no piped stdin", self.what))
    }

    /// Waits for it to exit by itself; panics unless it succeeded.
    pub fn wait_success(mut self) {
        let st = self.child.wait().unwrap();
        assert!(st.success(), "{} failed: {st}", self.what);
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
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
    bufscope_testkit::skmem_rb(first).or_else(|| bufscope_testkit::skmem_rb(second))
}

/// A running `bufscope run`. Dropping it stops it with SIGTERM (graceful detach), unless it
/// is a shared one ([`Exporter::shared`]), which outlives the test.
pub struct Exporter {
    inner: Option<bufscope_testkit::Exporter>,
    /// `host:port` it serves on.
    pub addr: String,
    /// Its log lines so far (empty for a shared exporter: see [`Exporter::log`]).
    pub logs: Arc<Mutex<Vec<String>>>,
    /// The pid and log file of a shared exporter.
    shared: Option<(u32, PathBuf)>,
}

/// The debug build's knob for how long a map entry must be idle before the GC may collect it
/// (30 s in a release): 3 s, for the tests that wait for the GC by design.
pub const GC_IDLE: (&str, &str) = ("BUFSCOPE_DEBUG_GC_IDLE", "3s");

/// The environment that names a shared exporter (see [`Exporter::shared`]): its address, pid,
/// log file and flags.
pub const SHARED_EXPORTER_ENV: [&str; 4] = [
    "BUFSCOPE_TEST_EXPORTER",
    "BUFSCOPE_TEST_EXPORTER_PID",
    "BUFSCOPE_TEST_EXPORTER_LOG",
    "BUFSCOPE_TEST_EXPORTER_ARGS",
];

impl Exporter {
    /// Starts `bufscope run --web.listen-address 127.0.0.1:0 <extra>` and waits until it serves.
    pub fn start(extra: &[&str]) -> Self {
        Self::start_bin(&bufscope_bin(), extra)
    }

    /// [`Exporter::start`] with `env` added to bufscope's environment: the debug build's test
    /// knobs, e.g. [`GC_IDLE`] for a test that waits for the map GC.
    pub fn start_env(env: &[(&str, &str)], extra: &[&str]) -> Self {
        require_root();
        let inner = ok(bufscope_testkit::Exporter::start_with_env(
            &bufscope_bin(),
            extra,
            env,
        ));
        Self {
            addr: inner.addr().to_string(),
            logs: inner.logs().clone(),
            inner: Some(inner),
            shared: None,
        }
    }

    /// [`Exporter::start`] with another executable in place of the binary (e.g. a script that
    /// changes the environment and `exec`s the real binary with its arguments).
    pub fn start_bin(bin: &std::path::Path, extra: &[&str]) -> Self {
        require_root();
        let inner = ok(bufscope_testkit::Exporter::start(bin, extra));
        Self {
            addr: inner.addr().to_string(),
            logs: inner.logs().clone(),
            inner: Some(inner),
            shared: None,
        }
    }

    /// A bufscope with the flags `extra`, for a test that judges it only on its own processes
    /// and sockets: the running one the environment names ([`SHARED_EXPORTER_ENV`]: address,
    /// pid, log file, flags) when its flags are exactly `extra`, else a new one
    /// ([`Exporter::start`]). The kernel matrix's guests start one per set of flags and share
    /// it across their steps (under TCG each start costs 10–40 s).
    pub fn shared(extra: &[&str]) -> Self {
        let var = |i: usize| std::env::var(SHARED_EXPORTER_ENV[i]).ok();
        match (var(0), var(1), var(2), var(3)) {
            (Some(addr), Some(pid), Some(log), Some(args))
                if args.split_whitespace().eq(extra.iter().copied()) =>
            {
                let pid: u32 = pid
                    .parse()
                    .unwrap_or_else(|e| panic!("{}={pid:?}: {e}", SHARED_EXPORTER_ENV[1]));
                eprintln!("using the shared bufscope at {addr} (pid {pid}, flags {args:?})");
                Self {
                    addr,
                    logs: Arc::default(),
                    inner: None,
                    shared: Some((pid, PathBuf::from(log))),
                }
            }
            _ => Self::start(extra),
        }
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

    /// Per-process detail: the rows of `/api/v1/status`, one per tracked process with its pid
    /// and every signal's counters. `/metrics` keys its series by program and place (a forked
    /// child shares its parent's), so which process of a program an event went to is read here.
    pub fn processes(&self) -> Vec<bufscope_api::status::ProcessRow> {
        let (status, body) = self.get(bufscope_api::status::PATH);
        assert_eq!(status, 200, "GET {}: {body}", bufscope_api::status::PATH);
        let doc: bufscope_api::status::StatusDocument = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("{}: {e}: {body}", bufscope_api::status::PATH));
        doc.processes
    }

    /// Raw `/metrics` text.
    pub fn scrape_text(&self) -> String {
        self.get("/metrics").1
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        match (&self.inner, &self.shared) {
            (Some(e), _) => e.pid(),
            (None, Some((pid, _))) => *pid,
            (None, None) => unreachable!("an exporter is started or shared"),
        }
    }

    /// The log so far.
    pub fn log(&self) -> String {
        match (&self.inner, &self.shared) {
            (Some(e), _) => e.log(),
            (None, Some((_, log))) => std::fs::read_to_string(log).unwrap_or_default(),
            (None, None) => String::new(),
        }
    }

    /// The exporter this test started (a shared one is not the test's to stop).
    fn own(self) -> bufscope_testkit::Exporter {
        self.inner
            .expect("a shared exporter is not the test's to stop: use Exporter::start")
    }

    /// Stops it with SIGTERM and returns its exit status (graceful shutdown).
    pub fn stop(self) -> std::process::ExitStatus {
        ok(self.own().stop())
    }

    /// Sends SIGKILL and reaps (for restart tests).
    pub fn kill9(self) {
        self.own().kill9();
    }
}

/// BPF object ids held open by `pid`: the `key` lines (`prog_id:`, `link_id:`, `map_id:`) of
/// `/proc/<pid>/fdinfo`.
pub fn held_bpf_ids(pid: u32, key: &str) -> std::collections::BTreeSet<u32> {
    ok(bufscope_testkit::held_bpf_ids(pid, key))
}

/// True while the kernel still has BPF object `kind` (`prog`, `link`) `id` (per `bpftool`).
pub fn bpf_exists(kind: &str, id: u32) -> bool {
    let id = id.to_string();
    bufscope_testkit::cmd_output(Command::new("bpftool").args([kind, "show", "id", &id])).is_ok()
}

/// Runs `cmd` with `stdin` on its stdin: (success, stdout, stderr). Panics when it cannot start
/// (`cargo xtask setup` installs the tools the tests run).
pub fn output(cmd: &mut Command, stdin: &str) -> (bool, String, String) {
    cmd.stderr(Stdio::piped());
    let out = bufscope_testkit::output_with_input(cmd, stdin.as_bytes())
        .unwrap_or_else(|e| panic!("{e:#} (cargo xtask setup installs the tools)"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A new, empty directory `bufscope-<tag>-<pid>-<nanos>` under the temporary directory,
/// removed with everything in it on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates it.
    pub fn new(tag: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let p = std::env::temp_dir().join(format!("bufscope-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("creating {}: {e}", p.display()));
        Self(p)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `promtool check metrics` on `text`; returns (success, output).
pub fn promtool_check_metrics(text: &str) -> (bool, String) {
    let mut cmd = Command::new("promtool");
    cmd.args(["check", "metrics"]).stderr(Stdio::piped());
    let out = bufscope_testkit::output_with_input(&mut cmd, text.as_bytes()).unwrap_or_else(|e| {
        panic!("promtool (Debian package prometheus; cargo xtask setup installs it): {e:#}")
    });
    let msg = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), msg)
}

/// Minimal HTTP/1.0 GET (no client dependency needed for tests).
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    ok(bufscope_testkit::http_get(addr, path))
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
mod spawned_tests {
    use super::*;

    /// Whether `pid` is still a process (a zombie counts: it was not reaped).
    fn exists(pid: u32) -> bool {
        Path::new(&format!("/proc/{pid}")).exists()
    }

    #[test]
    fn a_panicking_test_still_kills_and_reaps_a_stopped_helper() {
        let mut pid = 0;
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let s = Spawned::new(Command::new("sleep").arg("600"));
            pid = s.pid();
            s.signal(libc::SIGSTOP);
            panic!("an assertion fails while the helper is stopped");
        }));
        assert!(r.is_err());
        assert!(pid > 0);
        assert!(!exists(pid), "sleep {pid} outlived the panic");
    }

    #[test]
    fn a_finished_helper_is_left_alone() {
        let s = Spawned::new(&mut Command::new("true"));
        let pid = s.pid();
        s.wait_success();
        assert!(!exists(pid));
    }
}
