//! Section 2: the data path — UDP packets per second and TCP throughput, on loopback and
//! through a veth pair, with and without probes.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use bufscope_testkit::{Exporter, proc_udp_drops};

use super::Args;
use super::harness::{Bins, Bpftrace, median, percentile};
use super::hooks::hooks;
use crate::bench::table;

/// Namespaces and veth devices of the data-path section (all start with `bsp`).
const NS_A: &str = "bsp-ovh-a";
const NS_B: &str = "bsp-ovh-b";
const VETH_A: &str = "bspovha";
const VETH_B: &str = "bspovhb";
const IP_A: &str = "10.203.77.1";
const IP_B: &str = "10.203.77.2";

/// Two namespaces joined by a veth pair; deleted (with the pair) when dropped.
struct VethLab;

impl VethLab {
    fn create() -> anyhow::Result<Self> {
        Self::cleanup();
        let lab = Self;
        let ip = |args: &[&str]| run_quiet(Command::new("ip").args(args));
        ip(&["netns", "add", NS_A])?;
        ip(&["netns", "add", NS_B])?;
        ip(&[
            "link", "add", VETH_A, "netns", NS_A, "type", "veth", "peer", "name", VETH_B, "netns",
            NS_B,
        ])?;
        for (ns, dev, addr) in [(NS_A, VETH_A, IP_A), (NS_B, VETH_B, IP_B)] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(lab)
    }

    fn cleanup() {
        for ns in [NS_A, NS_B] {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Drop for VethLab {
    fn drop(&mut self) {
        Self::cleanup();
    }
}

/// Runs `cmd`, failing with its stderr when it fails.
pub(super) fn run_quiet(cmd: &mut Command) -> anyhow::Result<()> {
    let o = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !o.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(())
}

/// What is attached while the data path is measured.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Variant {
    None,
    Bufscope,
    /// bufscope with `--bpf.run-stats` (the kernel's run-time stats on: its cost).
    RunStats,
    DropsOnly,
    /// The drop probe alone with fentry/fexit refused: its zero-per-packet tracepoint
    /// variant, where the best one runs on every received datagram.
    DropsTracepoint,
    /// bufscope with kernel WireGuard's drop hook attached (`--wireguard.queue-drops on`):
    /// `tp_btf/consume_skb`, which runs for every packet the kernel consumes.
    Wireguard,
    Bpftrace,
}

impl Variant {
    pub(super) fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "none" => Self::None,
            "bufscope" => Self::Bufscope,
            "run-stats" => Self::RunStats,
            "drops-only" => Self::DropsOnly,
            "drops-tracepoint" => Self::DropsTracepoint,
            "wireguard" => Self::Wireguard,
            "bpftrace" => Self::Bpftrace,
            _ => return None,
        })
    }

    pub(super) fn label(self) -> &'static str {
        match self {
            Self::None => "no probes",
            Self::Bufscope => "bufscope (all probes)",
            Self::RunStats => "bufscope --bpf.run-stats",
            Self::DropsOnly => "bufscope, drop probe only",
            Self::DropsTracepoint => "bufscope, drop probe only, fentry/fexit refused",
            Self::Wireguard => "bufscope --wireguard.queue-drops on (consume_skb)",
            Self::Bpftrace => "bpftrace drop counter",
        }
    }
}

/// A data-path case.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Case {
    UdpAllDropped,
    UdpNoneDropped,
    TcpBulk,
}

impl Case {
    /// Its name in `--cases`.
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::UdpAllDropped => "udp-dropped",
            Self::UdpNoneDropped => "udp-read",
            Self::TcpBulk => "tcp-bulk",
        }
    }

    pub(super) fn label(self) -> &'static str {
        match self {
            Self::UdpAllDropped => "UDP 64 B, receiver full: every datagram dropped",
            Self::UdpNoneDropped => "UDP 64 B, receiver reading: nothing dropped",
            Self::TcpBulk => "TCP bulk, one flow",
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Self::TcpBulk => "Gbit/s",
            _ => "kpps",
        }
    }
}

/// Result of one transfer: rate (in the case's unit) and datagrams dropped at the receiver.
struct Transfer {
    rate: f64,
    dropped: u64,
}

/// One transfer of `case` over loopback (`veth` false) or from namespace A to B.
fn transfer(a: &Args, bins: &Bins, case: Case, veth: bool) -> anyhow::Result<Transfer> {
    let (tx_ns, rx_ns, dst) = if veth {
        (Some(NS_A), Some(NS_B), IP_B)
    } else {
        (None, None, "127.0.0.1")
    };
    let secs = format!("{}", a.seconds);
    match case {
        Case::UdpAllDropped | Case::UdpNoneDropped => {
            let mut args = vec!["udp-sink", "--bind", dst];
            if case == Case::UdpAllDropped {
                args.extend(["--no-read", "--rcvbuf", "4096"]);
            } else {
                // SO_RCVBUFFORCE (root): a 256 MiB queue absorbs scheduling hiccups of the reader
                // on this shared machine without touching net.core.rmem_max.
                args.extend(["--rcvbuf-force", "268435456"]);
            }
            let (mut sink, f) = bins.workload(rx_ns, &args)?;
            let port = f.get("port").context("udp-sink port")?.clone();
            let inode = f.get("inode").context("udp-sink inode")?.clone();
            let sink_pid: u32 = f.get("pid").and_then(|p| p.parse().ok()).unwrap_or(0);
            let (mut blast, _) = bins.workload(
                tx_ns,
                &[
                    "udp-blast",
                    "--dest",
                    &format!("{dst}:{port}"),
                    "--seconds",
                    &secs,
                    "--size",
                    "64",
                ],
            )?;
            let line = blast.wait_line("SENT", Duration::from_secs_f64(a.seconds + 30.0))?;
            let f: Vec<f64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|x| x.parse().ok())
                .collect();
            let (sent, took) = (
                f.first().copied().unwrap_or(0.0),
                f.get(2).copied().unwrap_or(1.0),
            );
            if case == Case::UdpNoneDropped {
                // Let the reader drain its queue before reading the drop count.
                let mut last = u64::MAX;
                for _ in 0..100 {
                    sink.send("count")?;
                    let c: u64 = sink
                        .wait_line("COUNT", Duration::from_secs(10))?
                        .split_whitespace()
                        .nth(1)
                        .and_then(|x| x.parse().ok())
                        .unwrap_or(0);
                    if c == last {
                        break;
                    }
                    last = c;
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            let dropped = inode
                .parse()
                .ok()
                .and_then(|i| proc_udp_drops(sink_pid, i))
                .unwrap_or(0);
            Ok(Transfer {
                rate: sent / took / 1000.0,
                dropped,
            })
        }
        Case::TcpBulk => {
            let (mut sink, f) = bins.workload(rx_ns, &["tcp-sink", "--bind", dst])?;
            let port = f.get("port").context("tcp-sink port")?.clone();
            let (blast, _) = bins.workload(
                tx_ns,
                &[
                    "tcp-blast",
                    "--dest",
                    &format!("{dst}:{port}"),
                    "--seconds",
                    &secs,
                ],
            )?;
            let line = sink.wait_line("RECEIVED", Duration::from_secs_f64(a.seconds + 30.0))?;
            blast.finish(Duration::from_secs(30))?;
            let f: Vec<f64> = line
                .split_whitespace()
                .skip(1)
                .filter_map(|x| x.parse().ok())
                .collect();
            let (bytes, took) = (
                f.first().copied().unwrap_or(0.0),
                f.get(1).copied().unwrap_or(1.0),
            );
            Ok(Transfer {
                rate: bytes * 8.0 / took / 1e9,
                dropped: 0,
            })
        }
    }
}

/// Holds whatever a variant attaches for the duration of a round (detached when dropped).
#[derive(Default)]
struct Attached {
    _exporter: Option<Exporter>,
    _bpftrace: Option<Bpftrace>,
}

fn attach(bins: &Bins, v: Variant) -> anyhow::Result<Attached> {
    Ok(match v {
        Variant::None => Attached::default(),
        Variant::Bufscope => Attached {
            _exporter: Some(bins.exporter(&[])?),
            _bpftrace: None,
        },
        Variant::RunStats => Attached {
            _exporter: Some(bins.exporter(&["--bpf.run-stats"])?),
            _bpftrace: None,
        },
        Variant::DropsOnly => Attached {
            _exporter: Some(
                bins.exporter(&["--probe.disable", "setsockopt,tcp_state,autotune,owners"])?,
            ),
            _bpftrace: None,
        },
        Variant::DropsTracepoint => Attached {
            _exporter: Some(bins.exporter_refusing(
                "fentry,fexit",
                &["--probe.disable", "setsockopt,tcp_state,autotune,owners"],
            )?),
            _bpftrace: None,
        },
        Variant::Wireguard => Attached {
            _exporter: Some(bins.exporter(&["--wireguard.queue-drops", "on"])?),
            _bpftrace: None,
        },
        Variant::Bpftrace => Attached {
            _exporter: None,
            _bpftrace: Some(Bpftrace::start(&hooks()?[0].bpftrace)?),
        },
    })
}

pub(super) fn section(a: &Args, bins: &Bins) -> anyhow::Result<String> {
    let _lab = VethLab::create()?;
    let variants: Vec<Variant> = a
        .variants
        .iter()
        .filter_map(|v| Variant::parse(v))
        .collect();
    let cases: Vec<Case> = [Case::UdpAllDropped, Case::UdpNoneDropped, Case::TcpBulk]
        .into_iter()
        .filter(|c| a.cases.iter().any(|n| n == c.name()))
        .collect();
    let paths = [false, true];
    // (path, case, variant) → transfers
    let mut results: BTreeMap<(usize, usize, usize), Vec<Transfer>> = BTreeMap::new();
    for round in 0..a.runs {
        let mut order: Vec<usize> = (0..variants.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for vi in order {
            eprintln!(
                "bench overhead: datapath round {}/{}: {}",
                round + 1,
                a.runs,
                variants[vi].label()
            );
            let attached = attach(bins, variants[vi])?;
            for (pi, veth) in paths.iter().enumerate() {
                for (ci, case) in cases.iter().enumerate() {
                    let t = transfer(a, bins, *case, *veth)?;
                    results.entry((pi, ci, vi)).or_default().push(t);
                }
            }
            drop(attached);
        }
    }
    let base = variants.iter().position(|v| *v == Variant::None);
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for (pi, veth) in paths.iter().enumerate() {
        for (ci, case) in cases.iter().enumerate() {
            let med = |vi: usize| {
                results
                    .get(&(pi, ci, vi))
                    .map(|ts| median(&ts.iter().map(|t| t.rate).collect::<Vec<_>>()))
                    .unwrap_or(f64::NAN)
            };
            let base_rate = base.map(med);
            // The cost of --bpf.run-stats: the same bufscope with and without it.
            let plain = variants.iter().position(|v| *v == Variant::Bufscope);
            let stats = variants.iter().position(|v| *v == Variant::RunStats);
            if let (Some(p), Some(s)) = (plain, stats) {
                notes.push(format!(
                    "- {} / {}: bufscope --bpf.run-stats {:.1}% of bufscope without it",
                    if *veth { "veth" } else { "loopback" },
                    case.label(),
                    med(s) / med(p) * 100.0
                ));
            }
            for (vi, v) in variants.iter().enumerate() {
                let ts = results.get(&(pi, ci, vi)).map(Vec::as_slice).unwrap_or(&[]);
                let rate = med(vi);
                let rel = base_rate.map(|b| rate / b);
                let drops: Vec<String> = ts.iter().map(|t| t.dropped.to_string()).collect();
                let runs: Vec<String> = ts
                    .iter()
                    .map(|t| format!("{:.0}", fmt_rate(*case, t.rate)))
                    .collect();
                rows.push(vec![
                    if *veth { "veth (2 netns)" } else { "loopback" }.to_string(),
                    case.label().to_string(),
                    v.label().to_string(),
                    format!("{} {}", fmt_num(*case, rate), case.unit()),
                    rel.map_or("–".into(), |r| format!("{:.1}%", r * 100.0)),
                    runs.join(" "),
                    if *case == Case::TcpBulk {
                        "–".into()
                    } else {
                        drops.join(" ")
                    },
                ]);
                // Paired: each round's rate over the same round's no-probe rate (the rounds
                // alternate, so slow drift of a shared machine cancels within a round).
                if let Some(b) = base.filter(|b| *b != vi) {
                    let none = results.get(&(pi, ci, b)).map(Vec::as_slice).unwrap_or(&[]);
                    let paired: Vec<f64> = ts
                        .iter()
                        .zip(none)
                        .map(|(t, n)| t.rate / n.rate)
                        .filter(|r| r.is_finite())
                        .collect();
                    if !paired.is_empty() {
                        notes.push(format!(
                            "- {} / {}: {} per round over no probes: median {:.1}%, middle half {:.1}–{:.1}% ({} rounds)",
                            if *veth { "veth" } else { "loopback" },
                            case.label(),
                            v.label(),
                            median(&paired) * 100.0,
                            percentile(&paired, 25.0) * 100.0,
                            percentile(&paired, 75.0) * 100.0,
                            paired.len()
                        ));
                    }
                }
                if *v == Variant::Bufscope
                    && let Some(r) = rel
                {
                    let target = *case != Case::UdpAllDropped;
                    notes.push(format!(
                        "- {} / {}: bufscope {:.1}% of no probes{}",
                        if *veth { "veth" } else { "loopback" },
                        case.label(),
                        r * 100.0,
                        if target {
                            format!(" (target ≥ 98%) {}", if r >= 0.98 { "✓" } else { "✗" })
                        } else {
                            String::new()
                        }
                    ));
                }
            }
        }
    }
    let mut out = String::from("### Data path\n\n");
    out.push_str(&table(
        &[
            "path",
            "traffic",
            "attached",
            "median",
            "vs no probes",
            "each run",
            "receiver drops (kernel, each run)",
        ],
        &rows,
    ));
    out.push_str("\n\nTargets (data path: no-drop rows within noise of no probes):\n");
    out.push_str(&notes.join("\n"));
    out.push('\n');
    Ok(out)
}

fn fmt_rate(case: Case, rate: f64) -> f64 {
    match case {
        Case::TcpBulk => rate * 1000.0,
        _ => rate,
    }
}

fn fmt_num(case: Case, rate: f64) -> String {
    match case {
        Case::TcpBulk => format!("{rate:.2}"),
        _ => format!("{rate:.0}"),
    }
}
