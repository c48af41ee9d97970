//! `cargo xtask bench tunnel`: the Lightway seed's table (`../shared/seeds/lightway-tcp-buffers.txt`)
//! reproduced in the network lab, for bufscope-tunnel's buffer policies and Debian's
//! wireguard-go, side by side in one run.
//!
//! For each RTT (≈0 over a plain veth pair, then 50 and 190 ms over the emulated WAN link at
//! `--rate-mbit`), each outer transport (UDP, TCP) and each policy (`recommended`,
//! `fixed=64K`, `os-default`), plus wireguard-go on UDP, plus the QUIC transport
//! (datagram mode with `recommended`, stream mode with quinn's default windows (`os-default`)
//! and with the policy's windows (`recommended`), the seed `quic-tunnel-windows.txt`): a tunnel
//! between the lab's two
//! namespaces (client `a`, server `b`), then through it one iperf3 TCP flow down (server →
//! client, `-R`) and one up, each with a ping running alongside (loaded latency), the inner
//! flow's retransmits, and the outer socket's receive-buffer drops: the delta of
//! `Udp:RcvbufErrors` (UDP) or `TcpExt:TCPRcvQDrop` (TCP) in the receiving namespace.
//!
//!
//! Then the loss rows: the transports of `--loss-transports` (QUIC stream mode) with the
//! policy's windows at `--loss-rtts` over a link that also loses `--loss-pct` of the packets,
//! independently and in bursts of `--loss-burst` packets on average, with the connections the
//! transport closed (and the client's reconnects) counted from the tunnels' shutdown logs.
//!
//! SIGINT, SIGTERM and SIGHUP stop the run cleanly (`interrupt`): the tunnels, iperf3 and ping
//! in the lab's namespaces are killed, the namespaces deleted, and the process exits with
//! 128 + the signal.
//!
//! The code: `model` (transports, policies, variants, loss and a row's figures), `setup` (keys
//! and the tunnel between the lab's namespaces), `measure` (one variant: idle latency, then a
//! download and an upload), `report` (the tables and the targets), `doc` (docs/benchmarks.md)
//! and `interrupt` (signals).

mod doc;
mod interrupt;
mod measure;
mod model;
mod report;
mod setup;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, bail};
use bufscope_netlab::{Lab, LabConfig, LinkParams};

use super::{loadavg, release_dir};
use crate::setup::peers;
use crate::util::{cargo, is_root, run_cmd};
use measure::{measure_variant, merge_rounds};
use model::{Loss, Measured, Policy, QuicFigures, Row, Transfer, Transport, Variant};
use report::human_bytes;
use setup::Keys;

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
    /// Outer transports of bufscope-tunnel to measure: udp, tcp, quic (= quic-dgram and
    /// quic-stream), quic-dgram, quic-stream.
    #[arg(long, value_delimiter = ',', default_value = "udp,tcp,quic")]
    pub transports: Vec<String>,
    /// TCP congestion control of the inner iperf3 flow (`iperf3 -C`; both ends), whatever the
    /// machine's default: cubic (Linux's default) or bbr.
    #[arg(long, default_value = "cubic")]
    pub inner_cc: String,
    /// Congestion controller of the QUIC rows (tunnel, cubic, bbr), or `default`:
    /// the tunnel's own choice.
    #[arg(long, default_value = "default")]
    pub quic_congestion: String,
    /// bufscope-tunnel's buffer policies to measure: recommended, fixed, os-default (each
    /// transport has its own set; this keeps only the named ones).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "recommended,fixed,os-default"
    )]
    pub policies: Vec<String>,
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
    /// tenants of the machine add noise: as many rounds over all variants, each with a fresh
    /// tunnel; the row shows the median transfer and the range.
    #[arg(long, default_value_t = 3)]
    pub veth_repeats: u32,
    /// Length of each transfer on the RTT ≈0 rows (1 s of it omitted).
    #[arg(long, default_value_t = 5)]
    pub veth_seconds: u32,
    /// CPU placement on the RTT ≈0 rows: `none` (the scheduler's choice) or `ends` (each
    /// namespace a machine of one CPU: a's tunnel end and iperf3 on CPU 0, b's on CPU 1; the
    /// same for every tunnel).
    #[arg(long, value_enum, default_value = "none")]
    pub pin: Pin,
    /// The bufscope-tunnel binary (default: build it with `cargo build --release`).
    #[arg(long)]
    pub tunnel_bin: Option<PathBuf>,
    /// Another bufscope-tunnel binary (e.g. a build of another commit), measured next to the
    /// first on every transport and policy, in the same rounds: an A/B in one run.
    #[arg(long)]
    pub compare_bin: Option<PathBuf>,
    /// Skip bufscope-tunnel (only the wireguard-go rows).
    #[arg(long)]
    pub no_bufscope: bool,
    /// Skip the wireguard-go (Debian) rows.
    #[arg(long)]
    pub no_wireguard_go: bool,
    /// Skip the upstream wireguard-go and boringtun-cli rows (built by `cargo xtask setup`;
    /// left out with a note when they are not).
    #[arg(long)]
    pub no_peers: bool,
    /// Skip the boringtun-cli row (keep upstream wireguard-go's).
    #[arg(long)]
    pub no_boringtun: bool,
    /// Loss rows: loss in percent on the emulated link (each direction), each measured with
    /// independent losses and in bursts (`--loss-burst`); `--loss-pct ''` for none.
    #[arg(long, value_delimiter = ',', default_value = "1,5,10")]
    pub loss_pct: Vec<String>,
    /// Mean length in packets of a loss burst in the bursty loss rows.
    #[arg(long, default_value_t = 8.0)]
    pub loss_burst: f64,
    /// Round-trip times (ms) of the loss rows.
    #[arg(long, value_delimiter = ',', default_value = "50,190")]
    pub loss_rtts: Vec<u64>,
    /// Transports of the loss rows (with the `recommended` policy).
    #[arg(long, value_delimiter = ',', default_value = "quic-stream")]
    pub loss_transports: Vec<String>,
    /// Only the loss rows (skip the `--rtts` rows): a loss series run by run.
    #[arg(long)]
    pub loss_only: bool,
    /// Rewrite the "Tunnel" section of docs/benchmarks.md with this run's results.
    #[arg(long)]
    pub update_doc: bool,
}

/// CPU placement of the RTT ≈0 rows (`--pin`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Pin {
    /// No affinity: the scheduler places every process.
    None,
    /// Namespace a's tunnel end and iperf3 on CPU 0, b's on CPU 1.
    Ends,
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

/// Runs the benchmark and prints the table.
pub fn run(a: &Args) -> anyhow::Result<()> {
    if !is_root() {
        bail!("cargo xtask bench tunnel creates namespaces and tunnels: run it as root");
    }
    check_tools(a)?;
    let transports = parse_transports(&a.transports)?;
    let loss_transports = parse_transports(&a.loss_transports)?;
    let losses = parse_losses(a)?;
    validate(a)?;
    let tunnel_bin = if a.no_bufscope {
        None
    } else {
        Some(tunnel_binary(a)?)
    };
    // From here on a signal stops the run cleanly (no thread exists yet).
    interrupt::install()?;

    let started = Instant::now();
    let load_before = loadavg();
    let source = doc::source();
    let work = std::env::temp_dir().join(format!("bsl-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let keys = Keys::generate(&work)?;
    let ctx = Run {
        a,
        bin: tunnel_bin.as_deref(),
        keys: &keys,
        work: &work,
    };
    let mut rows = Vec::new();
    if !a.loss_only {
        let variants = variants(a, &transports, tunnel_bin.is_some());
        for &rtt in &a.rtts {
            rows.extend(ctx.rtt_rows(rtt, &variants)?);
        }
    }
    if tunnel_bin.is_some() {
        let variants: Vec<Variant> = loss_transports
            .iter()
            .map(|&t| Variant::Bufscope(t, Policy::Recommended))
            .collect();
        for &rtt in &a.loss_rtts {
            for &loss in &losses {
                rows.extend(ctx.loss_rows(rtt, loss, &variants)?);
            }
        }
    }
    if let Some(sig) = interrupt::signal() {
        let _ = std::fs::remove_dir_all(&work);
        interrupt::exit(sig);
    }
    let elapsed = started.elapsed();
    let load_after = loadavg();
    let _ = std::fs::remove_dir_all(&work);
    let (table, summary) = report::render(&rows, a);
    println!("{table}\n{summary}");
    println!(
        "elapsed {:.0} s; load average before {load_before}, after {load_after}",
        elapsed.as_secs_f64()
    );
    if a.update_doc {
        doc::update(
            a,
            &source,
            &table,
            &summary,
            elapsed,
            &load_before,
            &load_after,
        )?;
    }
    Ok(())
}

/// The tools the run needs.
fn check_tools(a: &Args) -> anyhow::Result<()> {
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
    Ok(())
}

/// `--transports` / `--loss-transports`, without repeats.
fn parse_transports(names: &[String]) -> anyhow::Result<Vec<Transport>> {
    let mut transports = Vec::new();
    for t in names.iter().filter(|t| !t.is_empty()) {
        let ts: &[Transport] = match t.as_str() {
            "udp" => &[Transport::Udp],
            "tcp" => &[Transport::Tcp],
            "quic" => &[Transport::QuicDatagram, Transport::QuicStream],
            "quic-dgram" | "quic-datagram" => &[Transport::QuicDatagram],
            "quic-stream" => &[Transport::QuicStream],
            other => bail!("unknown transport {other:?} (udp, tcp, quic, quic-dgram, quic-stream)"),
        };
        for &t in ts {
            if !transports.contains(&t) {
                transports.push(t);
            }
        }
    }
    Ok(transports)
}

/// The loss rows' link losses: each `--loss-pct`, independent and in bursts.
fn parse_losses(a: &Args) -> anyhow::Result<Vec<Loss>> {
    if !a.loss_burst.is_finite() || a.loss_burst <= 1.0 {
        bail!(
            "--loss-burst {} must be a mean burst length above 1 packet",
            a.loss_burst
        );
    }
    let mut losses = Vec::new();
    for p in a.loss_pct.iter().filter(|p| !p.is_empty()) {
        let pct: f64 = p
            .parse()
            .ok()
            .filter(|v: &f64| *v > 0.0 && *v < 100.0)
            .with_context(|| format!("--loss-pct {p:?} is not a percentage between 0 and 100"))?;
        for burst in [1.0, a.loss_burst] {
            losses.push(Loss {
                rate: pct / 100.0,
                burst,
            });
        }
    }
    Ok(losses)
}

/// The other flags with a fixed set of values.
fn validate(a: &Args) -> anyhow::Result<()> {
    if !matches!(
        a.quic_congestion.as_str(),
        "default" | "tunnel" | "cubic" | "bbr"
    ) {
        bail!(
            "unknown --quic-congestion {:?} (default, tunnel, cubic, bbr)",
            a.quic_congestion
        );
    }
    if !matches!(a.inner_cc.as_str(), "cubic" | "bbr" | "reno") {
        bail!("unknown --inner-cc {:?} (cubic, bbr, reno)", a.inner_cc);
    }
    for p in &a.policies {
        if !matches!(p.as_str(), "recommended" | "fixed" | "os-default") {
            bail!("unknown policy {p:?} (recommended, fixed, os-default)");
        }
    }
    Ok(())
}

/// The variants of the `--rtts` rows, in table order.
fn variants(a: &Args, transports: &[Transport], bufscope: bool) -> Vec<Variant> {
    let mut variants = Vec::new();
    if bufscope {
        for &t in transports {
            for p in t.policies(a.fixed_bytes) {
                if !a.policies.iter().any(|n| *n == p.name()) {
                    continue;
                }
                variants.push(Variant::Bufscope(t, p));
                if a.compare_bin.is_some() {
                    variants.push(Variant::BufscopeOther(t, p));
                }
            }
        }
    }
    if !a.no_wireguard_go {
        variants.push(Variant::WireguardGo);
    }
    if !a.no_peers {
        // Bench-only peers: built (and cached) here, not by the default setup.
        peers::ensure();
        for (v, bin) in [
            (Variant::WireguardGoUpstream, peers::wireguard_go()),
            (Variant::BoringtunCli, peers::boringtun_cli()),
        ] {
            if v == Variant::BoringtunCli && a.no_boringtun {
                continue;
            }
            if bin.exists() {
                variants.push(v);
            } else {
                eprintln!(
                    "bench tunnel: leaving out {}: {} is not built (`cargo xtask setup --bench-peers` builds it)",
                    v.label(),
                    bin.display()
                );
            }
        }
    }
    // wireguard-go next to bufscope's UDP rows (the sort is stable).
    variants.sort_by_key(|v| v.transport().rank());
    variants
}

/// What every row of a run shares.
struct Run<'a> {
    a: &'a Args,
    bin: Option<&'a Path>,
    keys: &'a Keys,
    work: &'a Path,
}

impl Run<'_> {
    /// The rows of one `--rtts` RTT. RTT ≈0: `--veth-repeats` rounds, each measuring every
    /// variant once with a fresh tunnel, so that what else runs on the machine falls on all
    /// variants alike instead of on whichever one it overlaps. Other RTTs: one round, the link
    /// is the bottleneck.
    fn rtt_rows(&self, rtt: u64, variants: &[Variant]) -> anyhow::Result<Vec<Row>> {
        let config = if rtt == 0 {
            LabConfig::veth(bufscope_netlab::PREFIX)
        } else {
            LabConfig::wan(
                bufscope_netlab::PREFIX,
                LinkParams::mbit(self.a.rate_mbit).rtt_ms(rtt),
            )
        };
        let rounds = if rtt == 0 {
            self.a.veth_repeats.max(1)
        } else {
            1
        };
        self.rows(config, rtt, None, rounds, variants)
    }

    /// The rows of one RTT and loss.
    fn loss_rows(&self, rtt: u64, loss: Loss, variants: &[Variant]) -> anyhow::Result<Vec<Row>> {
        let link = LinkParams::mbit(self.a.rate_mbit)
            .rtt_ms(rtt)
            .loss(loss.rate)
            .loss_burst(loss.burst);
        self.rows(
            LabConfig::wan(bufscope_netlab::PREFIX, link),
            rtt,
            Some(loss),
            1,
            variants,
        )
    }

    /// `rounds` rounds over `variants` in one lab; a row per variant.
    fn rows(
        &self,
        config: LabConfig,
        rtt: u64,
        loss: Option<Loss>,
        rounds: u32,
        variants: &[Variant],
    ) -> anyhow::Result<Vec<Row>> {
        if interrupt::signal().is_some() || variants.is_empty() {
            return Ok(Vec::new());
        }
        let lab = Lab::new(config).context("building the lab")?;
        let mut results: Vec<Result<Vec<Measured>, String>> = vec![Ok(Vec::new()); variants.len()];
        for round in 0..rounds {
            for (&v, result) in variants.iter().zip(&mut results) {
                let Ok(done) = result else { continue };
                if interrupt::signal().is_some() {
                    return Ok(Vec::new());
                }
                eprintln!(
                    "bench tunnel: RTT {rtt} ms{}, {} {}{} …",
                    loss.map_or_else(String::new, |l| format!(", {}", l.label())),
                    v.transport().name(),
                    v.label(),
                    if rounds > 1 {
                        format!(", round {}/{rounds}", round + 1)
                    } else {
                        String::new()
                    }
                );
                match measure_variant(&lab, rtt, v, self.a, self.bin, self.keys, self.work) {
                    Ok(m) => done.push(m),
                    Err(e) => {
                        let e = format!("{e:#}");
                        eprintln!("bench tunnel:   failed: {e}");
                        *result = Err(e);
                    }
                }
            }
        }
        Ok(variants
            .iter()
            .zip(results)
            .map(|(&v, result)| Row {
                rtt_ms: rtt,
                loss,
                variant: v,
                result: result.and_then(|r| merge_rounds(r).ok_or_else(|| "no transfer".into())),
            })
            .collect())
    }
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
    let bin = release_dir().join("bufscope-tunnel");
    if !bin.exists() {
        bail!("{} was not built", bin.display());
    }
    Ok(bin)
}

fn which(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_string_lossy()
        .split(':')
        .map(|d| Path::new(d).join(bin))
        .find(|p| p.exists())
}

#[cfg(test)]
mod tests;
