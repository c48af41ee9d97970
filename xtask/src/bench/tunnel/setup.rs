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
    let ends = [
        (
            lab.a(),
            &keys.private_a,
            &keys.public_b,
            INNER_A,
            INNER_B,
            lab.addr_b(),
        ),
        (
            lab.b(),
            &keys.private_b,
            &keys.public_a,
            INNER_B,
            INNER_A,
            lab.addr_a(),
        ),
    ];
    // Server (b) first: with TCP transport the client connects to it.
    for (ns, private, peer_public, inner, peer_inner, peer_outer) in ends.into_iter().rev() {
        let is_client = inner == INNER_A;
        // With `--pin ends`, each end runs on its own CPU (taskset execs the program, so the
        // pid stays the tunnel's, and every thread it starts inherits the mask).
        let cpu = pin.map(|[a, b]| if is_client { a } else { b });
        let command = |program: &OsStr| match cpu {
            Some(cpu) => {
                let mut c = ns.command("taskset");
                c.args(["-c", &cpu.to_string()]).arg(program);
                c
            }
            None => ns.command(program),
        };
        let ifname = bufscope_netlab::unique_name(bufscope_netlab::PREFIX, "t");
        let log = work.join(format!("{ifname}.log"));
        let log_file = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        t.logs.push(log.clone());
        match v {
            Variant::Bufscope(transport, policy) | Variant::BufscopeOther(transport, policy) => {
                let bin = bin.context("no bufscope-tunnel binary")?;
                let mut c = command(bin.as_os_str());
                c.args(["--interface", &ifname, "--address", &format!("{inner}/24")])
                    .arg("--private-key-file")
                    .arg(private)
                    .args(["--peer-public-key", peer_public])
                    .args(["--allowed-ips", &format!("{peer_inner}/32")])
                    .args(["--listen-port", &TUNNEL_PORT.to_string()])
                    .args(transport.flags())
                    .args(["--buffer-policy", &policy.flag()]);
                if transport.is_quic() && quic_congestion != "default" {
                    c.args(["--congestion", quic_congestion]);
                }
                // UDP: both ends know each other; TCP and QUIC: the client connects, the
                // server listens.
                if transport == Transport::Udp || is_client {
                    c.args(["--endpoint", &format!("{peer_outer}:{TUNNEL_PORT}")]);
                }
                // BUFSCOPE_TUNNEL_LOG: another filter for investigations (e.g.
                // `info,bufscope_tunnel=debug` logs quinn's path state every second).
                let filter = std::env::var("BUFSCOPE_TUNNEL_LOG").unwrap_or_else(|_| "info".into());
                c.env("RUST_LOG", filter)
                    .stdin(Stdio::null())
                    .stdout(log_file.try_clone()?)
                    .stderr(log_file);
                t.procs.push(Process::spawn(&mut c)?);
            }
            Variant::WireguardGo | Variant::WireguardGoUpstream | Variant::BoringtunCli => {
                // All three speak wireguard-go's UAPI: a socket in WG_SOCKET_DIR, set with `wg`.
                let mut c = match v {
                    Variant::WireguardGoUpstream => command(peers::wireguard_go().as_os_str()),
                    Variant::BoringtunCli => {
                        let mut c = command(peers::boringtun_cli().as_os_str());
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
                    _ => command(OsStr::new("wireguard-go")),
                };
                c.args(["-f", &ifname])
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
                ns.exec(
                    "wg",
                    [
                        "set",
                        &ifname,
                        "listen-port",
                        &TUNNEL_PORT.to_string(),
                        "private-key",
                        &private.to_string_lossy(),
                        "peer",
                        peer_public,
                        "endpoint",
                        &format!("{peer_outer}:{TUNNEL_PORT}"),
                        "allowed-ips",
                        &format!("{peer_inner}/32"),
                    ],
                )?;
                ns.add_addr(&ifname, &format!("{inner}/24"))?;
                ns.link_up(&ifname)?;
            }
        }
    }
    // The tunnel is up when a ping crosses it (the first one triggers the handshake).
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let p = measure::ping(lab.a(), INNER_B, 1, Duration::from_millis(200));
        if p.is_ok_and(|p| p.received == 1) {
            return Ok(t);
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
