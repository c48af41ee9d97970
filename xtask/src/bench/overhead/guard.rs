//! Section 5: the guard on a gateway's send path — an unconnected UDP sender of 64-byte
//! datagrams (`sendto`, and `sendmmsg` of 64 addressed datagrams as wireguard-go sends) in its
//! own network namespace, with bufscope's guard off, in `observe` and in `enforce`, rounds
//! alternating in one run; and what one per-socket decision costs.
//!
//! The datagrams go to a loopback port nobody listens on (the kernel drops each as
//! `NO_SOCKET`, a reason bufscope does not track, and rate-limits its ICMP errors), so the
//! whole UDP transmit path runs and no receiver competes for the two cores. Every variant
//! runs bufscope with its default probes: the rows differ by `--guard.mode` alone. The guard's
//! UDP floor runs on `cgroup/sendmsg{4,6}` (among others): every unconnected send pays one
//! socket-storage lookup, and the kernel takes the socket lock around the program.
//!
//! The decision cost comes from the kernel's own counters (`kernel.bpf_stats_enabled=1`,
//! measured apart from the rates): the guard's programs' `run_time_ns / run_cnt` while a
//! sender blasts one socket (the lookup every later send pays) and while `udp-fresh` sends one
//! datagram from each of 20,000 new sockets (each send its socket's decision: the floor's
//! `bpf_getsockopt`/`bpf_setsockopt` and the report).

use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::bail;

use super::Args;
use super::bpf_stats::{BpfStats, delta, snapshot};
use super::datapath::run_quiet;
use super::harness::{Bins, median};
use crate::bench::table;

/// The namespace of the sender.
const NS: &str = "bsp-ovh-guard";
/// A loopback port nobody listens on.
const DEST: &str = "127.0.0.1:9";
/// Sockets of the decision-cost pass.
const FRESH: &str = "20000";

/// The sender's namespace; deleted when dropped.
struct SendLab;

impl SendLab {
    fn create() -> anyhow::Result<Self> {
        Self::cleanup();
        let lab = Self;
        run_quiet(Command::new("ip").args(["netns", "add", NS]))?;
        run_quiet(Command::new("ip").args(["-n", NS, "link", "set", "lo", "up"]))?;
        Ok(lab)
    }

    fn cleanup() {
        let _ = Command::new("ip")
            .args(["netns", "del", NS])
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for SendLab {
    fn drop(&mut self) {
        Self::cleanup();
    }
}

/// What runs while the sender is timed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    None,
    Off,
    Observe,
    Enforce,
    /// `enforce` with `--guard.udp-unbound-senders` (the `sendmsg` hooks attached).
    EnforceUnbound,
}

impl Variant {
    const ALL: [Self; 5] = [
        Self::None,
        Self::Off,
        Self::Observe,
        Self::Enforce,
        Self::EnforceUnbound,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::None => "no bufscope",
            Self::Off => "bufscope, guard off",
            Self::Observe => "bufscope --guard.mode observe",
            Self::Enforce => "bufscope --guard.mode enforce",
            Self::EnforceUnbound => "bufscope --guard.mode enforce --guard.udp-unbound-senders",
        }
    }

    fn flags(self) -> &'static [&'static str] {
        match self {
            Self::None | Self::Off => &[],
            Self::Observe => &["--guard.mode", "observe"],
            Self::Enforce => &["--guard.mode", "enforce"],
            Self::EnforceUnbound => &["--guard.mode", "enforce", "--guard.udp-unbound-senders"],
        }
    }
}

/// The sender: `sendto` one datagram per call, or `sendmmsg` of 64.
/// Both bind first, as wireguard-go's, an OpenVPN server's and a DNS forwarder's sockets do
/// (so the default guard decides them at bind; `--guard.udp-unbound-senders` adds its hook to
/// every send).
const SENDERS: [(&str, &[&str]); 2] = [
    (
        "sendto, 64 B, one bound unconnected socket",
        &["--bind-any"],
    ),
    (
        "sendmmsg x64, 64 B, one bound unconnected socket",
        &["--bind-any", "--mmsg", "64"],
    ),
];

/// One blast of `extra` for `secs`: datagrams per second.
fn blast(bins: &Bins, secs: f64, extra: &[&str]) -> anyhow::Result<f64> {
    let secs_s = format!("{secs}");
    let mut args = vec![
        "udp-blast",
        "--dest",
        DEST,
        "--seconds",
        &secs_s,
        "--size",
        "64",
    ];
    args.extend(extra);
    let (mut p, _) = bins.workload(Some(NS), &args)?;
    let line = p.wait_line("SENT", Duration::from_secs_f64(secs + 30.0))?;
    let f: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let (sent, took) = (
        f.first().copied().unwrap_or(0.0),
        f.get(2).copied().unwrap_or(1.0),
    );
    if sent == 0.0 {
        bail!("udp-blast sent nothing: {line}");
    }
    Ok(sent / took)
}

/// ns per run of the guard's programs while `run` runs (bufscope's own counters), with the
/// number of runs.
fn guard_prog_cost(
    pid: u32,
    run: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<(f64, u64)> {
    let before = snapshot(pid)?;
    run()?;
    let after = snapshot(pid)?;
    let (ns, cnt) = delta(&before, &after, |p| p.name.starts_with("guard_"));
    Ok((
        if cnt == 0 {
            f64::NAN
        } else {
            ns as f64 / cnt as f64
        },
        cnt,
    ))
}

/// Runs the section and returns its tables.
pub(super) fn section(a: &Args, bins: &Bins) -> anyhow::Result<String> {
    let _lab = SendLab::create()?;
    // [variant][sender] → rates
    let mut rates = vec![vec![Vec::new(); SENDERS.len()]; Variant::ALL.len()];
    for round in 0..a.runs {
        for k in 0..Variant::ALL.len() {
            let i = (k + round) % Variant::ALL.len();
            let v = Variant::ALL[i];
            let exporter = match v {
                Variant::None => None,
                _ => Some(bins.exporter(v.flags())?),
            };
            for (si, (_, extra)) in SENDERS.iter().enumerate() {
                rates[i][si].push(blast(bins, a.seconds, extra)?);
            }
            drop(exporter);
            eprintln!(
                "bench overhead: guard round {}/{}: {}: {:.0} sendto/s, {:.0} sendmmsg datagrams/s",
                round + 1,
                a.runs,
                v.label(),
                rates[i][0].last().copied().unwrap_or(f64::NAN),
                rates[i][1].last().copied().unwrap_or(f64::NAN)
            );
        }
    }
    let off = Variant::ALL
        .iter()
        .position(|v| *v == Variant::Off)
        .unwrap_or(1);
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for (si, (sender, _)) in SENDERS.iter().enumerate() {
        let base = median(&rates[off][si]);
        for (i, v) in Variant::ALL.iter().enumerate() {
            let r = median(&rates[i][si]);
            let each: Vec<String> = rates[i][si]
                .iter()
                .map(|x| format!("{:.0}", x / 1000.0))
                .collect();
            rows.push(vec![
                sender.to_string(),
                v.label().to_string(),
                format!("{:.0}", r / 1000.0),
                format!("{:.3}", r / base),
                each.join(" "),
            ]);
            if matches!(v, Variant::Observe | Variant::Enforce) {
                notes.push(format!(
                    "- {sender}: {} {:.3} of guard off (target ≥ 0.97) {}",
                    v.label(),
                    r / base,
                    if r / base >= 0.97 { "✓" } else { "✗" }
                ));
            }
        }
    }
    // The guard's own programs, per run, with the kernel's counters on.
    let mut cost_rows = Vec::new();
    {
        let stats = BpfStats::enable()?;
        for v in [Variant::Observe, Variant::Enforce, Variant::EnforceUnbound] {
            let e = bins.exporter(v.flags())?;
            let pid = e.pid();
            let (per_send, sends) =
                guard_prog_cost(pid, || blast(bins, 1.0, &["--bind-any"]).map(|_| ()))?;
            let (per_socket, sockets) = guard_prog_cost(pid, || {
                let (mut p, _) = bins.workload(
                    Some(NS),
                    &["udp-fresh", "--dest", DEST, "--count", FRESH, "--bind-any"],
                )?;
                p.wait_line("DONE", Duration::from_secs(120))?;
                Ok(())
            })?;
            cost_rows.push(vec![
                v.label().to_string(),
                format!("{per_send:.1}"),
                sends.to_string(),
                format!("{per_socket:.1}"),
                sockets.to_string(),
            ]);
            drop(e);
        }
        drop(stats);
    }
    let hooks = {
        let e = bins.exporter(Variant::Enforce.flags())?;
        let m = bufscope_testkit::Metrics::parse(&e.metrics_text()?);
        m.find("bufscope_probe_attached", &[("probe", "guard")])
            .filter(|s| s.value == 1.0)
            .filter_map(|s| s.labels.get("hook").cloned())
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut out = format!(
        "### Guard on the send path\n\nUnconnected UDP sender in its own network namespace \
         (datagrams to a closed loopback port), median of {} alternating rounds of {} s; the guard's \
         UDP hooks on this kernel: `{hooks}`.\n\n",
        a.runs, a.seconds
    );
    out.push_str(&table(
        &[
            "sender",
            "attached",
            "median k datagrams/s",
            "vs guard off",
            "each run (k/s)",
        ],
        &rows,
    ));
    out.push_str("\n\nTargets:\n");
    out.push_str(&notes.join("\n"));
    out.push_str(&format!(
        "\n\nThe guard's programs per run (`kernel.bpf_stats_enabled=1`; every later send of a \
         decided socket, where a guard program runs on sends at all, vs each of {FRESH} new sockets' \
         bind, its decision):\n\n"
    ));
    out.push_str(&table(
        &[
            "mode",
            "ns per send (decided socket)",
            "runs",
            "ns per decision (a new socket's bind)",
            "runs",
        ],
        &cost_rows,
    ));
    out.push('\n');
    Ok(out)
}
