//! Key files for both ends and the tunnel between the lab's two namespaces (bufscope-tunnel or
//! wireguard-go), up once a ping crosses it.

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bufscope_netlab::measure;
use bufscope_netlab::{Lab, Process};
use bufscope_testkit::{cmd_output, output_with_input, wait_until};

use super::{INNER_A, INNER_B, TUNNEL_PORT, Transport, Variant, WG_SOCKET_DIR};
use crate::setup::peers;

/// Key files for both ends.
pub(super) struct Keys {
    private_a: PathBuf,
    private_b: PathBuf,
    public_a: String,
    public_b: String,
}

impl Keys {
    pub(super) fn generate(dir: &Path) -> anyhow::Result<Keys> {
        let one = |name: &str| -> anyhow::Result<(PathBuf, String)> {
            let private = cmd_output(Command::new("wg").arg("genkey"))?;
            let out = output_with_input(Command::new("wg").arg("pubkey"), private.as_bytes())?;
            let public = String::from_utf8_lossy(&out.stdout).trim().to_string();
            let path = dir.join(name);
            write_private(&path, &private)?;
            Ok((path, public))
        };
        let (private_a, public_a) = one("a.key")?;
        let (private_b, public_b) = one("b.key")?;
        Ok(Keys {
            private_a,
            private_b,
            public_a,
            public_b,
        })
    }
}

/// Writes a key file readable by root only.
fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    writeln!(f, "{}", text.trim()).with_context(|| format!("writing {}", path.display()))
}

/// A running tunnel (both ends); its processes are stopped on drop.
pub(super) struct Tunnel {
    procs: Vec<Process>,
    wg_sockets: Vec<PathBuf>,
    logs: Vec<PathBuf>,
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        // Server first, so that the client does not log reconnect attempts.
        while let Some(p) = self.procs.pop() {
            p.kill();
        }
        for s in &self.wg_sockets {
            let _ = std::fs::remove_file(s);
        }
    }
}

impl Tunnel {
    /// Stops both ends (SIGTERM, so that they log their shutdown summaries) and returns their
    /// logs: server (b) first, then client (a).
    pub(super) fn stop(&mut self) -> Vec<String> {
        while let Some(p) = self.procs.pop() {
            p.kill();
        }
        self.logs
            .iter()
            .map(|l| std::fs::read_to_string(l).unwrap_or_default())
            .collect()
    }

    /// The process ids of both ends (their CPU time is read from `/proc/<pid>/stat`).
    pub(super) fn pids(&self) -> Vec<u32> {
        self.procs.iter().map(Process::pid).collect()
    }

    /// The last lines of the logs, for error messages.
    pub(super) fn log_tail(&self) -> String {
        let mut s = String::new();
        for l in &self.logs {
            let text = std::fs::read_to_string(l).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(5).collect();
            let _ = write!(
                s,
                "\n  {}: {}",
                l.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            );
        }
        s
    }
}

/// One end of a tunnel: its namespace, keys and addresses.
struct End<'a> {
    ns: &'a bufscope_netlab::Netns,
    private: &'a Path,
    peer_public: &'a str,
    inner: &'a str,
    peer_inner: &'a str,
    peer_outer: std::net::Ipv4Addr,
    /// The connecting side (namespace a).
    client: bool,
    /// `--pin ends`: the CPU this end runs on.
    cpu: Option<usize>,
}

impl End<'_> {
    /// A command for `program` in this end's namespace, on its CPU if pinned (taskset execs
    /// the program, so the pid stays the tunnel's, and every thread it starts inherits the
    /// mask).
    fn command(&self, program: &OsStr) -> Command {
        match self.cpu {
            Some(cpu) => {
                let mut c = self.ns.command("taskset");
                c.args(["-c", &cpu.to_string()]).arg(program);
                c
            }
            None => self.ns.command(program),
        }
    }
}

/// Starts `v` between the lab's namespaces and waits until a ping crosses it.
pub(super) fn start_tunnel(
    lab: &Lab,
    v: Variant,
    bin: Option<&Path>,
    keys: &Keys,
    work: &Path,
    quic_congestion: &str,
    pin: Option<[usize; 2]>,
) -> anyhow::Result<Tunnel> {
    let mut t = Tunnel {
        procs: Vec::new(),
        wg_sockets: Vec::new(),
        logs: Vec::new(),
    };
    let a = End {
        ns: lab.a(),
        private: &keys.private_a,
        peer_public: &keys.public_b,
        inner: INNER_A,
        peer_inner: INNER_B,
        peer_outer: lab.addr_b(),
        client: true,
        cpu: pin.map(|[a, _]| a),
    };
    let b = End {
        ns: lab.b(),
        private: &keys.private_b,
        peer_public: &keys.public_a,
        inner: INNER_B,
        peer_inner: INNER_A,
        peer_outer: lab.addr_a(),
        client: false,
        cpu: pin.map(|[_, b]| b),
    };
    // Server (b) first: with TCP transport the client connects to it.
    for end in [b, a] {
        let ifname = bufscope_netlab::unique_name(bufscope_netlab::PREFIX, "t");
        let log = work.join(format!("{ifname}.log"));
        let log_file = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        t.logs.push(log.clone());
        match v {
            Variant::Bufscope(transport, policy) | Variant::BufscopeOther(transport, policy) => {
                let bin = bin.context("no bufscope-tunnel binary")?;
                let mut c = end.command(bin.as_os_str());
                bufscope_args(&mut c, &end, &ifname, transport, quic_congestion)
                    .args(["--buffer-policy", &policy.flag()])
                    .stdin(Stdio::null())
                    .stdout(log_file.try_clone()?)
                    .stderr(log_file);
                t.procs.push(Process::spawn(&mut c)?);
            }
            Variant::WireguardGo | Variant::WireguardGoUpstream | Variant::BoringtunCli => {
                start_uapi_end(&mut t, v, &end, &ifname, log_file)?;
            }
        }
    }
    wait_for_ping(lab, &mut t)?;
    Ok(t)
}

/// bufscope-tunnel's flags for `end`.
fn bufscope_args<'c>(
    c: &'c mut Command,
    end: &End,
    ifname: &str,
    transport: Transport,
    quic_congestion: &str,
) -> &'c mut Command {
    c.args([
        "--interface",
        ifname,
        "--address",
        &format!("{}/24", end.inner),
    ])
    .arg("--private-key-file")
    .arg(end.private)
    .args(["--peer-public-key", end.peer_public])
    .args(["--allowed-ips", &format!("{}/32", end.peer_inner)])
    .args(["--listen-port", &TUNNEL_PORT.to_string()])
    .args(transport.flags());
    if transport.is_quic() && quic_congestion != "default" {
        c.args(["--congestion", quic_congestion]);
    }
    // UDP: both ends know each other; TCP and QUIC: the client connects, the server listens.
    if transport == Transport::Udp || end.client {
        c.args(["--endpoint", &format!("{}:{TUNNEL_PORT}", end.peer_outer)]);
    }
    // BUFSCOPE_TUNNEL_LOG: another filter for investigations (e.g.
    // `info,bufscope_tunnel=debug` logs quinn's path state every second).
    let filter = std::env::var("BUFSCOPE_TUNNEL_LOG").unwrap_or_else(|_| "info".into());
    c.env("RUST_LOG", filter)
}

/// One end of a tunnel that speaks wireguard-go's UAPI (wireguard-go, upstream or Debian, and
/// boringtun-cli): started, then configured with `wg` through its socket in WG_SOCKET_DIR.
fn start_uapi_end(
    t: &mut Tunnel,
    v: Variant,
    end: &End,
    ifname: &str,
    log_file: File,
) -> anyhow::Result<()> {
    let mut c = match v {
        Variant::WireguardGoUpstream => end.command(peers::wireguard_go().as_os_str()),
        Variant::BoringtunCli => {
            let mut c = end.command(peers::boringtun_cli().as_os_str());
            // Root in the lab: keep the privileges `wg` needs on the UAPI socket.
            c.args([
                "--disable-drop-privileges",
                "--verbosity",
                "error",
                "--log",
                "/dev/stderr",
            ]);
            c
        }
        _ => end.command(OsStr::new("wireguard-go")),
    };
    c.args(["-f", ifname])
        .env("LOG_LEVEL", "error")
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file);
    t.procs.push(Process::spawn(&mut c)?);
    let sock = Path::new(WG_SOCKET_DIR).join(format!("{ifname}.sock"));
    t.wg_sockets.push(sock.clone());
    let every = Duration::from_millis(20);
    wait_until(Duration::from_secs(5), every, "its UAPI socket", || {
        sock.exists().then_some(())
    })
    .with_context(|| format!("wireguard-go did not create {}", sock.display()))?;
    end.ns.exec(
        "wg",
        [
            "set",
            ifname,
            "listen-port",
            &TUNNEL_PORT.to_string(),
            "private-key",
            &end.private.to_string_lossy(),
            "peer",
            end.peer_public,
            "endpoint",
            &format!("{}:{TUNNEL_PORT}", end.peer_outer),
            "allowed-ips",
            &format!("{}/32", end.peer_inner),
        ],
    )?;
    end.ns.add_addr(ifname, &format!("{}/24", end.inner))?;
    end.ns.link_up(ifname)?;
    Ok(())
}

/// Waits until a ping crosses the tunnel (the first one triggers the handshake).
fn wait_for_ping(lab: &Lab, t: &mut Tunnel) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let p = measure::ping(lab.a(), INNER_B, 1, Duration::from_millis(200));
        if p.is_ok_and(|p| p.received == 1) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the tunnel did not carry a ping within 15 s{}",
                t.log_tail()
            );
        }
        for p in &mut t.procs {
            if !p.is_running() {
                bail!("a tunnel process exited{}", t.log_tail());
            }
        }
    }
}
