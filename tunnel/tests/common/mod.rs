//! Helpers for the tunnel's privileged tests: two namespaces joined by a veth pair (from
//! `bufscope-netlab`), keys from `wg genkey`, config files, tunnel processes with their logs.
//! Everything is named with the `bst` prefix and removed on drop, also when a test fails.
#![allow(dead_code, clippy::unwrap_used)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub use bufscope_netlab::measure;
use bufscope_netlab::{Netns, Process, VethPair, unique_name};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_bufscope-tunnel");
/// Name prefix of everything these tests create.
pub const PREFIX: &str = "bst";

/// A temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        let p = std::env::temp_dir().join(unique_name(PREFIX, "d"));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A WireGuard key pair, base64 (from `wg genkey` / `wg pubkey`).
pub struct Keys {
    pub private: String,
    pub public: String,
}

pub fn genkey() -> Keys {
    let out = Command::new("wg").arg("genkey").output().unwrap();
    assert!(out.status.success(), "wg genkey failed");
    let private = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let mut child = Command::new("wg")
        .arg("pubkey")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(private.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let public = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert_eq!(public.len(), 44, "wg pubkey output {public:?}");
    Keys { private, public }
}

/// Two namespaces `a` and `b` joined by a veth pair: a = 192.168.79.1/24, b = 192.168.79.2/24.
/// Dropped in field order: veth, then namespaces (which kills what still runs inside).
pub struct Net {
    _veth: VethPair,
    pub a: Netns,
    pub b: Netns,
}

pub const OUTER_A: &str = "192.168.79.1";
pub const OUTER_B: &str = "192.168.79.2";
pub const INNER_A: &str = "10.79.0.1";
pub const INNER_B: &str = "10.79.0.2";

impl Net {
    pub fn new() -> Net {
        let a = Netns::create(unique_name(PREFIX, "a")).unwrap();
        let b = Netns::create(unique_name(PREFIX, "b")).unwrap();
        let veth = VethPair::create(&a, "bstva", &b, "bstvb").unwrap();
        a.add_addr("bstva", &format!("{OUTER_A}/24")).unwrap();
        b.add_addr("bstvb", &format!("{OUTER_B}/24")).unwrap();
        // High-BDP inner flows need room (LAB-FACTS §2); per-namespace sysctls only.
        a.set_big_tcp_buffers().unwrap();
        b.set_big_tcp_buffers().unwrap();
        Net { _veth: veth, a, b }
    }
}

/// One side's settings for [`config`].
pub struct Side<'a> {
    pub keys: &'a Keys,
    pub inner: &'a str,
    pub listen_port: Option<u16>,
    pub interface: &'a str,
}

impl<'a> Side<'a> {
    /// Side a: inner address [`INNER_A`], interface `bsttun`.
    pub fn a(keys: &'a Keys, listen_port: Option<u16>) -> Self {
        Side {
            keys,
            inner: INNER_A,
            listen_port,
            interface: "bsttun",
        }
    }

    /// Side b: inner address [`INNER_B`], interface `bsttun`.
    pub fn b(keys: &'a Keys, listen_port: Option<u16>) -> Self {
        Side {
            keys,
            inner: INNER_B,
            listen_port,
            interface: "bsttun",
        }
    }
}

/// A bufscope-tunnel config file for `me` talking to `peer` (its public key and inner
/// address), optionally with an endpoint, plus extra `[Bufscope]` lines.
pub fn config(
    me: &Side,
    peer_public: &str,
    peer_inner: &str,
    endpoint: Option<&str>,
    bufscope: &[&str],
) -> String {
    let mut s = format!(
        "[Interface]\nPrivateKey = {}\nAddress = {}/24\n",
        me.keys.private, me.inner
    );
    if let Some(p) = me.listen_port {
        s += &format!("ListenPort = {p}\n");
    }
    s += &format!("\n[Peer]\nPublicKey = {peer_public}\nAllowedIPs = {peer_inner}/32\n");
    if let Some(e) = endpoint {
        s += &format!("Endpoint = {e}\n");
    }
    s += &format!("\n[Bufscope]\nInterface = {}\n", me.interface);
    for l in bufscope {
        s += l;
        s += "\n";
    }
    s
}

/// A running bufscope-tunnel, killed on drop; its stderr goes to a log file.
pub struct Tunnel {
    pub proc: Option<Process>,
    pub log: PathBuf,
}

impl Tunnel {
    pub fn start(ns: &Netns, conf: &Path, log: PathBuf, extra: &[&str]) -> Tunnel {
        let mut cmd = ns.command(BIN);
        cmd.arg("-c")
            .arg(conf)
            .args(extra)
            // BUFSCOPE_TUNNEL_LOG: another filter for investigations (e.g.
            // `info,bufscope_tunnel=debug` logs quinn's path state every second).
            .env(
                "RUST_LOG",
                std::env::var("BUFSCOPE_TUNNEL_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap());
        Tunnel {
            proc: Some(Process::spawn(&mut cmd).unwrap()),
            log,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `needle`; panics with the log after `timeout`.
    pub fn wait_log(&self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.log().contains(needle) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "{needle:?} not logged within {timeout:?}; log:\n{}",
            self.log()
        );
    }

    pub fn is_running(&mut self) -> bool {
        self.proc.as_mut().is_some_and(Process::is_running)
    }
}

/// Pings `dest` from `ns` once per 200 ms until one reply comes back; panics after `timeout`.
pub fn wait_ping(ns: &Netns, dest: &str, timeout: Duration, logs: &[&Tunnel]) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let ok = ns
            .command("ping")
            .args(["-n", "-q", "-c", "1", "-W", "1", dest])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let logs: Vec<String> = logs.iter().map(|t| t.log()).collect();
    panic!(
        "no ping reply from {dest} within {timeout:?}; logs:\n{}",
        logs.join("\n----\n")
    );
}

/// `ss -H -n <args>` inside `ns`.
pub fn ss(ns: &Netns, args: &[&str]) -> String {
    ns.exec("ss", [&["-H", "-n"][..], args].concat()).unwrap()
}

/// The `rb`/`tb` (receive/send buffer) of the first socket in `ss -m` output.
pub fn skmem_buffers(ss_output: &str) -> (u64, u64) {
    let field = |k: &str| -> u64 {
        let start = ss_output
            .find(&format!(",{k}"))
            .unwrap_or_else(|| panic!("no {k} in ss output: {ss_output}"))
            + k.len()
            + 1;
        ss_output[start..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap()
    };
    (field("rb"), field("tb"))
}

/// Runs an iperf3 transfer over the tunnel (a → b's inner address, or b → a with `reverse`)
/// and returns the receiver's Mbit/s. Prints the figure for the test log.
pub fn iperf3(net: &Net, label: &str, reverse: bool, secs: u32) -> measure::Iperf3Result {
    let _server = measure::iperf3_server(&net.b, INNER_B, 5201).unwrap();
    let r = measure::iperf3_client(&net.a, INNER_B, 5201, secs, 1, reverse, &[]).unwrap();
    println!(
        "{label} {}: {:.0} Mbit/s received, {} retransmits",
        if reverse { "b->a" } else { "a->b" },
        r.received_mbit,
        r.retransmits
    );
    r
}

/// Runs `cmd` to completion (at most 20 s) and checks: exit status 1 and exactly one line on
/// stderr, which contains every `needles` item. Returns that line.
/// Starts the tunnel with `conf` in `ns`, which has no route to the config's endpoint
/// `endpoint`, and expects the one-line "unreachable" error; returns that line.
pub fn expect_no_route(ns: &Netns, conf: &Path, endpoint: &str) -> String {
    let mut cmd = ns.command(BIN);
    cmd.arg("-c").arg(conf);
    expect_one_line_error(
        cmd,
        &[
            &format!("endpoint {endpoint} is unreachable"),
            "Network is unreachable",
        ],
    )
}

pub fn expect_one_line_error(mut cmd: Command, needles: &[&str]) -> String {
    let child = cmd
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let start = Instant::now();
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    while !waiter.is_finished() {
        if start.elapsed() > Duration::from_secs(20) {
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("bufscope-tunnel did not exit within 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out: Output = waiter.join().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        out.status.code(),
        Some(1),
        "status {}, stderr:\n{stderr}",
        out.status
    );
    assert_eq!(lines.len(), 1, "expected one line, got:\n{stderr}");
    for n in needles {
        assert!(lines[0].contains(n), "{n:?} missing from {:?}", lines[0]);
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
    println!("{}", lines[0]);
    lines[0].to_string()
}
