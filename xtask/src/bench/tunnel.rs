//! `cargo xtask bench tunnel`: the Lightway seed's table (`../shared/seeds/lightway-tcp-buffers.txt`)
//! reproduced in the network lab, for bufscope-tunnel's buffer policies and Debian's
//! wireguard-go, side by side in one run.
//!
//! For each RTT (≈0 over a plain veth pair, then 50 and 190 ms over the emulated WAN link at
//! `--rate-mbit`), each outer transport (UDP, TCP) and each policy (`recommended`,
//! `fixed=64K`, `os-default`), plus wireguard-go on UDP: a tunnel between the lab's two
//! namespaces (client `a`, server `b`), then through it one iperf3 TCP flow down (server →
//! client, `-R`) and one up, each with a ping running alongside (loaded latency), the inner
//! flow's retransmits, and the outer socket's receive-buffer drops: the delta of
//! `Udp:RcvbufErrors` (UDP) or `TcpExt:TCPRcvQDrop` (TCP) in the receiving namespace.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bufscope_netlab::measure::{self, BackgroundPing};
use bufscope_netlab::{Lab, LabConfig, LinkParams, Netns, Process};

use super::{Machine, cmd_output, loadavg};
use crate::util::{cargo, is_root, run_cmd, workspace_root};

/// Arguments of `cargo xtask bench tunnel`.
#[derive(clap::Args)]
pub struct Args {
    /// Emulated link rate in Mbit/s for the rows with RTT > 0 (the ≈0 rows use a plain veth
    /// pair, where the host is the bottleneck).
    #[arg(long, default_value_t = 200)]
    pub rate_mbit: u64,
    /// Round-trip times in ms; 0 means a plain veth pair.
    #[arg(long, value_delimiter = ',', default_value = "0,50,190")]
    pub rtts: Vec<u64>,
    /// Outer transports of bufscope-tunnel to measure.
    #[arg(long, value_delimiter = ',', default_value = "udp,tcp")]
    pub transports: Vec<String>,
    /// Buffer size of the `fixed` policy (the anti-pattern), bytes.
    #[arg(long, default_value_t = 65536)]
    pub fixed_bytes: u64,
    /// Length of each iperf3 transfer in seconds.
    #[arg(long, default_value_t = 8)]
    pub seconds: u32,
    /// Seconds at the start of each transfer left out of the result (slow start).
    #[arg(long, default_value_t = 2)]
    pub omit: u32,
    /// Transfers per direction on the RTT ≈0 rows, where the CPU is the bottleneck and other
    /// tenants of the machine add noise; the row shows the median one.
    #[arg(long, default_value_t = 3)]
    pub veth_repeats: u32,
    /// Length of each transfer on the RTT ≈0 rows (1 s of it omitted).
    #[arg(long, default_value_t = 5)]
    pub veth_seconds: u32,
    /// The bufscope-tunnel binary (default: build it with `cargo build --release`).
    #[arg(long)]
    pub tunnel_bin: Option<PathBuf>,
    /// Skip bufscope-tunnel (only the wireguard-go rows).
    #[arg(long)]
    pub no_bufscope: bool,
    /// Skip the wireguard-go rows.
    #[arg(long)]
    pub no_wireguard_go: bool,
    /// Rewrite the "Tunnel" section of docs/benchmarks.md with this run's results.
    #[arg(long)]
    pub update_doc: bool,
}

/// Inner (tunnel) addresses of the client (namespace a) and server (namespace b).
const INNER_A: &str = "10.99.0.1";
const INNER_B: &str = "10.99.0.2";
/// Outer UDP/TCP port of the tunnel on both sides.
const TUNNEL_PORT: u16 = 51820;
/// Port of the inner iperf3 server.
const IPERF_PORT: u16 = 5201;
/// Where wireguard-go keeps its UAPI sockets.
const WG_SOCKET_DIR: &str = "/run/wireguard";

/// Outer transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Udp,
    Tcp,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
        }
    }
}

/// Buffer policy of bufscope-tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    Recommended,
    Fixed(u64),
    OsDefault,
}

impl Policy {
    fn flag(self) -> String {
        match self {
            Policy::Recommended => "recommended".into(),
            Policy::Fixed(n) => format!("fixed={n}"),
            Policy::OsDefault => "os-default".into(),
        }
    }
}

/// What carries the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Bufscope(Transport, Policy),
    WireguardGo,
}

impl Variant {
    fn transport(self) -> Transport {
        match self {
            Variant::Bufscope(t, _) => t,
            Variant::WireguardGo => Transport::Udp,
        }
    }

    fn label(self) -> String {
        match self {
            Variant::Bufscope(_, Policy::Fixed(n)) => format!("bufscope fixed={}", human_bytes(n)),
            Variant::Bufscope(_, p) => format!("bufscope {}", p.flag()),
            Variant::WireguardGo => "wireguard-go (Debian)".into(),
        }
    }
}

/// One transfer's figures.
#[derive(Debug, Clone, Copy, Default)]
struct Transfer {
    mbit: f64,
    latency_ms: Option<f64>,
    retransmits: u64,
    drops: u64,
}

/// One table row.
#[derive(Debug, Clone)]
struct Row {
    rtt_ms: u64,
    variant: Variant,
    result: Result<Measured, String>,
}

#[derive(Debug, Clone)]
struct Measured {
    rcvbuf: Option<u64>,
    idle_ms: Option<f64>,
    down: Transfer,
    up: Transfer,
}

/// Runs the benchmark and prints the table.
pub fn run(a: &Args) -> anyhow::Result<()> {
    if !is_root() {
        bail!("cargo xtask bench tunnel creates namespaces and tunnels: run it as root");
    }
    for (bin, pkg) in [
        ("iperf3", "iperf3"),
        ("ping", "iputils-ping"),
        ("wg", "wireguard-tools"),
    ] {
        if which(bin).is_none() {
            bail!("{bin} is missing: `cargo xtask setup` or apt-get install {pkg}");
        }
    }
    if !a.no_wireguard_go && which("wireguard-go").is_none() {
        bail!(
            "wireguard-go is missing: `cargo xtask setup` or apt-get install wireguard-go (or --no-wireguard-go)"
        );
    }
    let transports = a
        .transports
        .iter()
        .map(|t| match t.as_str() {
            "udp" => Ok(Transport::Udp),
            "tcp" => Ok(Transport::Tcp),
            other => bail!("unknown transport {other:?} (udp, tcp)"),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let tunnel_bin = if a.no_bufscope {
        None
    } else {
        Some(tunnel_binary(a)?)
    };

    let started = Instant::now();
    let load_before = loadavg();
    let work = std::env::temp_dir().join(format!("bsl-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let keys = Keys::generate(&work)?;

    let mut variants = Vec::new();
    if tunnel_bin.is_some() {
        for &t in &transports {
            for p in [
                Policy::Recommended,
                Policy::Fixed(a.fixed_bytes),
                Policy::OsDefault,
            ] {
                variants.push(Variant::Bufscope(t, p));
            }
        }
    }
    if !a.no_wireguard_go {
        variants.push(Variant::WireguardGo);
    }
    // wireguard-go next to bufscope's UDP rows.
    variants.sort_by_key(|v| {
        (
            v.transport() == Transport::Tcp,
            matches!(v, Variant::Bufscope(Transport::Tcp, _)),
        )
    });

    let mut rows = Vec::new();
    for &rtt in &a.rtts {
        let config = if rtt == 0 {
            LabConfig::veth(bufscope_netlab::PREFIX)
        } else {
            LabConfig::wan(
                bufscope_netlab::PREFIX,
                LinkParams::mbit(a.rate_mbit).rtt_ms(rtt),
            )
        };
        let lab = Lab::new(config).context("building the lab")?;
        for &v in &variants {
            eprintln!(
                "bench tunnel: RTT {rtt} ms, {} {} …",
                v.transport().name(),
                v.label()
            );
            let result = measure_variant(&lab, rtt, v, a, tunnel_bin.as_deref(), &keys, &work)
                .map_err(|e| format!("{e:#}"));
            if let Err(e) = &result {
                eprintln!("bench tunnel:   failed: {e}");
            }
            rows.push(Row {
                rtt_ms: rtt,
                variant: v,
                result,
            });
        }
    }
    let elapsed = started.elapsed();
    let load_after = loadavg();

    let table = render_table(&rows);
    let summary = render_summary(&rows, a);
    println!("{table}\n{summary}");
    println!(
        "elapsed {:.0} s; load average before {load_before}, after {load_after}",
        elapsed.as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&work);
    if a.update_doc {
        update_doc(a, &table, &summary, elapsed, &load_before, &load_after)?;
    }
    Ok(())
}

/// Builds (or takes) the bufscope-tunnel binary.
fn tunnel_binary(a: &Args) -> anyhow::Result<PathBuf> {
    if let Some(p) = &a.tunnel_bin {
        return Ok(p.clone());
    }
    run_cmd(cargo().args([
        "build",
        "--release",
        "-p",
        "bufscope-tunnel",
        "--bin",
        "bufscope-tunnel",
    ]))
    .context("building bufscope-tunnel (or pass --tunnel-bin / --no-bufscope)")?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let bin = target.join("release/bufscope-tunnel");
    if !bin.exists() {
        bail!("{} was not built", bin.display());
    }
    Ok(bin)
}

/// Key files for both ends.
struct Keys {
    private_a: PathBuf,
    private_b: PathBuf,
    public_a: String,
    public_b: String,
}

impl Keys {
    fn generate(dir: &Path) -> anyhow::Result<Keys> {
        let one = |name: &str| -> anyhow::Result<(PathBuf, String)> {
            let private = cmd_output(Command::new("wg").arg("genkey"))?;
            let mut child = Command::new("wg")
                .arg("pubkey")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .context("starting wg pubkey")?;
            child
                .stdin
                .take()
                .context("wg pubkey stdin")?
                .write_all(private.as_bytes())
                .context("writing to wg pubkey")?;
            let out = child.wait_with_output().context("wg pubkey")?;
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
struct Tunnel {
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
    /// The last lines of the logs, for error messages.
    fn log_tail(&self) -> String {
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
fn start_tunnel(
    lab: &Lab,
    v: Variant,
    bin: Option<&Path>,
    keys: &Keys,
    work: &Path,
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
        let ifname = bufscope_netlab::unique_name(bufscope_netlab::PREFIX, "t");
        let log = work.join(format!("{ifname}.log"));
        let log_file = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        t.logs.push(log.clone());
        let is_client = inner == INNER_A;
        match v {
            Variant::Bufscope(transport, policy) => {
                let bin = bin.context("no bufscope-tunnel binary")?;
                let mut c = ns.command(bin);
                c.args(["--interface", &ifname, "--address", &format!("{inner}/24")])
                    .arg("--private-key-file")
                    .arg(private)
                    .args(["--peer-public-key", peer_public])
                    .args(["--allowed-ips", &format!("{peer_inner}/32")])
                    .args(["--listen-port", &TUNNEL_PORT.to_string()])
                    .args([
                        "--transport",
                        transport.name(),
                        "--buffer-policy",
                        &policy.flag(),
                    ]);
                // UDP: both ends know each other; TCP: the client connects, the server listens.
                if transport == Transport::Udp || is_client {
                    c.args(["--endpoint", &format!("{peer_outer}:{TUNNEL_PORT}")]);
                }
                c.env("RUST_LOG", "info")
                    .stdin(Stdio::null())
                    .stdout(log_file.try_clone()?)
                    .stderr(log_file);
                t.procs.push(Process::spawn(&mut c)?);
            }
            Variant::WireguardGo => {
                let mut c = ns.command("wireguard-go");
                c.args(["-f", &ifname])
                    .env("LOG_LEVEL", "error")
                    .stdin(Stdio::null())
                    .stdout(log_file.try_clone()?)
                    .stderr(log_file);
                t.procs.push(Process::spawn(&mut c)?);
                let sock = Path::new(WG_SOCKET_DIR).join(format!("{ifname}.sock"));
                t.wg_sockets.push(sock.clone());
                wait_for(Duration::from_secs(5), || sock.exists())
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

/// Sets up `v`, measures idle latency, download and upload.
fn measure_variant(
    lab: &Lab,
    rtt: u64,
    v: Variant,
    a: &Args,
    bin: Option<&Path>,
    keys: &Keys,
    work: &Path,
) -> anyhow::Result<Measured> {
    let tunnel = start_tunnel(lab, v, bin, keys, work)?;
    let idle = measure::ping(lab.a(), INNER_B, 5, Duration::from_millis(200))?;
    let _server = measure::iperf3_server(lab.b(), INNER_B, IPERF_PORT)?;
    let drop_key = match v.transport() {
        Transport::Udp => "Udp:RcvbufErrors",
        Transport::Tcp => "TcpExt:TCPRcvQDrop",
    };
    let (secs, omit, repeats) = if rtt == 0 {
        (a.veth_seconds, 1, a.veth_repeats.max(1))
    } else {
        (a.seconds, a.omit, 1)
    };
    let transfer = |reverse: bool| -> anyhow::Result<Transfer> {
        // The outer receiver: the client for a download, the server for an upload.
        let receiver = if reverse { lab.a() } else { lab.b() };
        let before = counter(receiver, drop_key)?;
        let ping = BackgroundPing::start(lab.a(), INNER_B, Duration::from_millis(200))?;
        let r = measure::iperf3_client(lab.a(), INNER_B, IPERF_PORT, secs, omit, reverse, &[])
            .with_context(|| {
                format!(
                    "iperf3 {}{}",
                    if reverse { "download" } else { "upload" },
                    tunnel.log_tail()
                )
            })?;
        let latency = ping.finish().ok().and_then(|p| p.avg_ms);
        let after = counter(receiver, drop_key)?;
        Ok(Transfer {
            mbit: r.received_mbit,
            latency_ms: latency,
            retransmits: r.retransmits,
            drops: after.saturating_sub(before),
        })
    };
    // The median of `repeats` transfers (by throughput), with that transfer's other figures.
    let median = |reverse: bool| -> anyhow::Result<Transfer> {
        let mut runs = Vec::new();
        for _ in 0..repeats {
            let t = transfer(reverse)?;
            eprintln!(
                "bench tunnel:   {} {:.1} Mbit/s, latency {} ms, {} retransmits, {} outer rcvbuf drops",
                if reverse { "down" } else { "up" },
                t.mbit,
                opt_ms(t.latency_ms),
                t.retransmits,
                t.drops
            );
            runs.push(t);
        }
        runs.sort_by(|x, y| x.mbit.total_cmp(&y.mbit));
        runs.get(runs.len() / 2).copied().context("no transfer")
    };
    let down = median(true)?;
    let rcvbuf = outer_rcvbuf(lab.a(), v.transport());
    let up = median(false)?;
    drop(tunnel);
    Ok(Measured {
        rcvbuf,
        idle_ms: idle.avg_ms,
        down,
        up,
    })
}

/// One `/proc/net` counter inside `ns`.
fn counter(ns: &Netns, key: &str) -> anyhow::Result<u64> {
    let all: HashMap<String, u64> = measure::net_counters(ns)?;
    all.get(key)
        .copied()
        .with_context(|| format!("no {key} in /proc/net of {}", ns.name()))
}

/// The outer socket's receive buffer (`rb` of `ss -m`) inside `ns`.
fn outer_rcvbuf(ns: &Netns, t: Transport) -> Option<u64> {
    let flag = match t {
        Transport::Udp => "-Huamn",
        Transport::Tcp => "-Htmn",
    };
    let out = ns.exec("ss", [flag]).ok()?;
    // Records span two lines: the socket, then `skmem:(r0,rb212992,…)`.
    let port = format!(":{TUNNEL_PORT}");
    let mut hit = false;
    for line in out.lines() {
        if line.contains(&port) {
            hit = true;
        }
        if hit && let Some(rest) = line.split("skmem:(").nth(1) {
            return rest
                .split(',')
                .find_map(|f| f.strip_prefix("rb"))
                .and_then(|n| n.trim_end_matches(')').parse().ok());
        }
    }
    None
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes.
fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !cond() {
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn which(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_string_lossy()
        .split(':')
        .map(|d| Path::new(d).join(bin))
        .find(|p| p.exists())
}

fn human_bytes(n: u64) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{}M", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{}K", n >> 10)
    } else if n >= 1 << 20 {
        format!("{:.1}M", n as f64 / f64::from(1 << 20))
    } else {
        n.to_string()
    }
}

fn opt_ms(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v:.1}"))
}

fn rtt_label(rtt: u64) -> String {
    if rtt == 0 {
        "≈0 (veth)".into()
    } else {
        format!("{rtt} ms")
    }
}

/// The recommended row of the same RTT and transport.
fn reference(rows: &[Row], rtt: u64, t: Transport) -> Option<&Measured> {
    rows.iter()
        .find(|r| r.rtt_ms == rtt && r.variant == Variant::Bufscope(t, Policy::Recommended))
        .and_then(|r| r.result.as_ref().ok())
}

fn ratio(x: f64, of: Option<f64>) -> String {
    match of {
        Some(o) if o > 0.0 => format!("{:.2}×", x / o),
        _ => "–".into(),
    }
}

/// Inner MTU over UDP (bufscope-tunnel's and wireguard-go's default).
const INNER_MTU: f64 = 1420.0;
/// bufscope-tunnel's default inner MTU over the TCP transport (`DEFAULT_TCP_MTU`).
const INNER_MTU_TCP: f64 = 8920.0;

/// The largest fraction of the emulated link rate (which counts outer IP bytes) that one
/// inner TCP flow can carry: inner TCP payload (MTU − 20 IP − 32 TCP with timestamps) over
/// what crosses the link per inner packet. UDP: + 32 WireGuard + 8 UDP + 20 IP. TCP: the
/// WireGuard packet + 2-byte length prefix rides in outer TCP segments of 1448/1500 bytes.
fn payload_ceiling(t: Transport) -> f64 {
    match t {
        Transport::Udp => (INNER_MTU - 52.0) / (INNER_MTU + 60.0),
        Transport::Tcp => (INNER_MTU_TCP - 52.0) / (INNER_MTU_TCP + 34.0) * 1448.0 / 1500.0,
    }
}

/// The table, as Markdown (readable as plain text too).
fn render_table(rows: &[Row]) -> String {
    let header = [
        "RTT",
        "outer",
        "tunnel / buffer policy",
        "outer rcvbuf",
        "idle ms",
        "down Mbit/s",
        "down ms",
        "down retr",
        "down rcvbuf drops",
        "up Mbit/s",
        "up ms",
        "up retr",
        "up rcvbuf drops",
        "down vs rec.",
        "up vs rec.",
    ];
    let mut lines: Vec<Vec<String>> = Vec::new();
    for r in rows {
        let mut cells = vec![
            rtt_label(r.rtt_ms),
            r.variant.transport().name().into(),
            r.variant.label(),
        ];
        match &r.result {
            Ok(m) => {
                let refm = reference(rows, r.rtt_ms, r.variant.transport());
                cells.extend([
                    m.rcvbuf.map_or("–".into(), human_bytes),
                    opt_ms(m.idle_ms),
                    format!("{:.1}", m.down.mbit),
                    opt_ms(m.down.latency_ms),
                    m.down.retransmits.to_string(),
                    m.down.drops.to_string(),
                    format!("{:.1}", m.up.mbit),
                    opt_ms(m.up.latency_ms),
                    m.up.retransmits.to_string(),
                    m.up.drops.to_string(),
                    ratio(m.down.mbit, refm.map(|x| x.down.mbit)),
                    ratio(m.up.mbit, refm.map(|x| x.up.mbit)),
                ]);
            }
            Err(e) => {
                let short: String = e
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .chars()
                    .take(80)
                    .collect();
                cells.push(format!("failed: {short}"));
                cells.resize(header.len(), String::new());
            }
        }
        lines.push(cells);
    }
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for l in &lines {
        for (w, c) in widths.iter_mut().zip(l) {
            *w = (*w).max(c.chars().count());
        }
    }
    let fmt_line = |cells: &[String]| -> String {
        let mut s = String::from("|");
        for (c, w) in cells.iter().zip(&widths) {
            let _ = write!(s, " {c}{} |", " ".repeat(w - c.chars().count()));
        }
        s
    };
    let mut out = fmt_line(&header.map(String::from));
    out.push('\n');
    out.push_str(&fmt_line(
        &widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>(),
    ));
    for l in &lines {
        out.push('\n');
        out.push_str(&fmt_line(l));
    }
    out
}

/// The targets, checked against this run.
fn render_summary(rows: &[Row], a: &Args) -> String {
    let get = |rtt: u64, v: Variant| {
        rows.iter()
            .find(|r| r.rtt_ms == rtt && r.variant == v)
            .and_then(|r| r.result.as_ref().ok())
    };
    let mark = |ok: bool| if ok { "✓" } else { "✗" };
    let mut s = String::from("Targets (issue 5):\n");
    for t in [Transport::Udp, Transport::Tcp] {
        if let Some(m) = get(50, Variant::Bufscope(t, Policy::Recommended)) {
            let rate = a.rate_mbit as f64;
            let (d, u) = (m.down.mbit / rate, m.up.mbit / rate);
            let _ = writeln!(
                s,
                "- {} recommended at 50 ms: down {:.1}%, up {:.1}% of the {} Mbit/s link (target ≥ 90%; \
                 header overhead caps one flow at {:.1}% here) {}",
                t.name(),
                d * 100.0,
                u * 100.0,
                a.rate_mbit,
                payload_ceiling(t) * 100.0,
                mark(d >= 0.9 && u >= 0.9)
            );
        }
    }
    if let (Some(f), Some(r)) = (
        get(
            190,
            Variant::Bufscope(Transport::Tcp, Policy::Fixed(a.fixed_bytes)),
        ),
        get(190, Variant::Bufscope(Transport::Tcp, Policy::Recommended)),
    ) {
        let (d, u) = (
            r.down.mbit / f.down.mbit.max(1e-9),
            r.up.mbit / f.up.mbit.max(1e-9),
        );
        let _ = writeln!(
            s,
            "- tcp fixed={} → recommended at 190 ms: down {:.1} → {:.1} Mbit/s ({d:.1}×), up {:.1} → {:.1} Mbit/s ({u:.1}×); \
             seed (Lightway, Linux): down 11.2 → 160.9 (14.3×), up 8.6 → 59.3 (6.9×); target: same order {}",
            human_bytes(a.fixed_bytes),
            f.down.mbit,
            r.down.mbit,
            f.up.mbit,
            r.up.mbit,
            mark(d >= 5.0 && u >= 5.0)
        );
    }
    for &rtt in &a.rtts {
        if let (Some(r), Some(w)) = (
            get(rtt, Variant::Bufscope(Transport::Udp, Policy::Recommended)),
            get(rtt, Variant::WireguardGo),
        ) {
            let (d, u) = (
                r.down.mbit / w.down.mbit.max(1e-9),
                r.up.mbit / w.up.mbit.max(1e-9),
            );
            let wg_drops = w.down.drops + w.up.drops;
            let verdict = if wg_drops < 1000 {
                "(wireguard-go has no thousands of drops here: not a target row)".to_string()
            } else if rtt > 0 {
                // The link caps both: the ratio cannot exceed ceiling × rate / wireguard-go.
                let cap = payload_ceiling(Transport::Udp) * a.rate_mbit as f64;
                format!(
                    "(link-bound: at most {:.2}× / {:.2}× is possible at {} Mbit/s; bufscope drops {})",
                    cap / w.down.mbit.max(1e-9),
                    cap / w.up.mbit.max(1e-9),
                    a.rate_mbit,
                    mark(r.down.drops + r.up.drops == 0)
                )
            } else {
                mark(d.min(u) >= 1.5 && r.down.drops + r.up.drops == 0).to_string()
            };
            let _ = writeln!(
                s,
                "- udp recommended vs wireguard-go at {}: down {d:.2}×, up {u:.2}×; outer rcvbuf drops {}+{} vs {}+{} \
                 (target ≥ 1.5× with zero drops where wireguard-go has thousands) {verdict}",
                rtt_label(rtt),
                r.down.drops,
                r.up.drops,
                w.down.drops,
                w.up.drops,
            );
        }
    }
    s
}

/// Markers of the generated part of the Tunnel section in docs/benchmarks.md.
const DOC_BEGIN: &str =
    "<!-- bench-tunnel:begin (generated by `cargo xtask bench tunnel --update-doc`) -->";
const DOC_END: &str = "<!-- bench-tunnel:end -->";

/// Replaces the generated part of the Tunnel section (creating the file/section if needed).
fn update_doc(
    a: &Args,
    table: &str,
    summary: &str,
    elapsed: Duration,
    load_before: &str,
    load_after: &str,
) -> anyhow::Result<()> {
    let path = workspace_root().join("docs/benchmarks.md");
    let Machine {
        cpu,
        nproc,
        kernel,
        date,
        commit,
    } = Machine::describe();
    let root = workspace_root();
    let dirty = cmd_output(Command::new("git").arg("-C").arg(&root).args([
        "status",
        "--porcelain",
        "--",
        "tunnel",
        "policy",
    ]))
    .map(|s| !s.is_empty())
    .unwrap_or(false);
    let source = if dirty {
        format!("commit {commit} plus uncommitted changes in tunnel/ or policy/")
    } else {
        format!("commit {commit}")
    };
    let mut args = String::new();
    if a.rate_mbit != 200 {
        let _ = write!(args, " --rate-mbit {}", a.rate_mbit);
    }
    if a.seconds != 8 || a.omit != 2 {
        let _ = write!(args, " --seconds {} --omit {}", a.seconds, a.omit);
    }
    if a.veth_repeats != 3 || a.veth_seconds != 5 {
        let _ = write!(
            args,
            " --veth-repeats {} --veth-seconds {}",
            a.veth_repeats, a.veth_seconds
        );
    }
    if a.fixed_bytes != 65536 {
        let _ = write!(args, " --fixed-bytes {}", a.fixed_bytes);
    }
    let generated = format!(
        "{DOC_BEGIN}\n\
         Command: `cargo xtask bench tunnel{args} --update-doc` (as root), run {date}, {:.0} s, \
         bufscope-tunnel built from {source}.\n\n\
         Machine: `nproc` = {nproc}, `uname -r` = {}, CPU: {cpu}; shared with other builds and tests \
         (load average {load_before} before, {load_after} after).\n\n\
         Link: RTT ≈0 rows over a plain veth pair (no emulation: the host is the bottleneck); 50 and 190 ms rows \
         over the netlab WAN link at {} Mbit/s with a one-BDP bottleneck buffer. One iperf3 TCP flow per cell, \
         {} s with the first {} s left out (RTT ≈0 rows: median of {} transfers of {} s, 1 s left out); latency = average of a 5/s ping during the transfer; drops = \
         `Udp:RcvbufErrors` (UDP) or `TcpExt:TCPRcvQDrop` (TCP) delta in the receiving namespace; outer rcvbuf = \
         `ss -m` `rb` of the client's outer socket after the download.\n\n\
         {table}\n\n{summary}{DOC_END}\n",
        elapsed.as_secs_f64(),
        kernel,
        a.rate_mbit,
        a.seconds,
        a.omit,
        a.veth_repeats,
        a.veth_seconds,
    );
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    let new = match (old.find(DOC_BEGIN), old.find(DOC_END)) {
        (Some(b), Some(e)) if e > b => format!(
            "{}{generated}{}",
            &old[..b],
            &old[e + DOC_END.len()..].trim_start_matches('\n')
        ),
        _ => {
            let mut s = if old.is_empty() {
                "# Benchmarks\n".to_string()
            } else {
                old
            };
            if !s.contains("\n## Tunnel") {
                s.push_str("\n## Tunnel\n\n");
            }
            s.push_str(&generated);
            s
        }
    };
    std::fs::write(&path, new).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("bench tunnel: updated {}", path.display());
    Ok(())
}
