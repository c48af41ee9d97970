//! Section 5: the guard on a gateway's send path — an unconnected UDP sender of 64-byte
//! datagrams (`sendto`, and `sendmmsg` of 64 addressed datagrams as wireguard-go sends) in its
//! own network namespace, with bufscope's guard off, in `observe` and in `enforce`; and what
//! one per-socket decision costs.
//!
//! The figure must resolve a few percent on a 2-core VM other people compile on, so it is
//! built to be robust to them rather than to hope for a quiet machine:
//!
//! - **Many short, paired rounds.** A round runs every variant once, back to back, in an order
//!   that rotates round by round; each variant's figure is compared with guard-off *of the same
//!   round*. Slow drift (a build starting) hits both sides of a pair alike; the per-round ratios
//!   are summarised by their geometric mean with a 95% confidence interval (Student's t over
//!   the log-ratios), so the table says how well it resolves, not only what it measured.
//! - **CPU time, not only wall time.** Each blast runs under `perf stat` (software counters:
//!   `task-clock`, `context-switches`, `cpu-migrations`), pinned to one CPU (`taskset`), with
//!   bufscope pinned to the other. Nanoseconds of CPU per datagram barely move when another
//!   process takes the CPU away (the sender is not running then), where datagrams per second
//!   do; the context switches per round say how often that happened.
//!
//! The datagrams go to a loopback port nobody listens on (the kernel drops each as
//! `NO_SOCKET`, a reason bufscope does not track, and rate-limits its ICMP errors), so the
//! whole UDP transmit path runs and no receiver competes for the two cores. Every variant
//! runs bufscope with its default probes: the rows differ by `--guard.mode` alone.
//!
//! The decision cost comes from the kernel's own counters (`kernel.bpf_stats_enabled=1`,
//! measured apart from the rates): the guard's programs' `run_time_ns / run_cnt` while a
//! sender blasts one socket (the lookup every later send pays, where a guard program runs per
//! send at all) and while `udp-fresh` binds and sends from each of 20,000 new sockets (each
//! bind its socket's decision: the floor's `bpf_getsockopt`/`bpf_setsockopt`, the budget, the
//! report).

use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use bufscope_testkit::LineChild;

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
/// The CPU the sender is pinned to; bufscope gets the other one.
const SENDER_CPU: &str = "1";
const EXPORTER_CPU: &str = "0";

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

    /// Whether the row has a ≥ 0.97 target (the default guard).
    fn targeted(self) -> bool {
        matches!(self, Self::Observe | Self::Enforce)
    }
}

/// The senders. Both bind first, as wireguard-go's, an OpenVPN server's and a DNS forwarder's
/// sockets do (so the default guard decides them at bind; `--guard.udp-unbound-senders` adds
/// its hook to every send).
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

/// One blast: datagrams per second (wall) and `perf stat`'s counters for the sender.
#[derive(Clone, Copy, Debug)]
struct Blast {
    rate: f64,
    /// CPU ns of the sender per datagram (`task-clock` / datagrams).
    cpu_ns: f64,
    /// Context switches of the sender during the blast (other work took its CPU).
    switches: f64,
    /// CPU migrations (0 when the pinning held).
    migrations: f64,
}

/// `perf stat -x,` output: the value of `event`.
fn perf_value(text: &str, event: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split(',').collect();
        (f.get(2) == Some(&event)).then(|| f.first()?.parse().ok())?
    })
}

/// One blast of `extra` for `secs`, pinned to [`SENDER_CPU`] under `perf stat`.
fn blast(bins: &Bins, secs: f64, extra: &[&str]) -> anyhow::Result<Blast> {
    let stat = std::env::temp_dir().join(format!("bufscope-guard-perf-{}", std::process::id()));
    let secs_s = format!("{secs}");
    let mut cmd = Command::new("ip");
    cmd.args([
        "netns", "exec", NS, "taskset", "-c", SENDER_CPU, "perf", "stat", "-x,",
    ])
    .args(["-e", "task-clock,context-switches,cpu-migrations", "-o"])
    .arg(&stat)
    .arg("--")
    .arg(bins.workload_path())
    .args([
        "udp-blast",
        "--dest",
        DEST,
        "--seconds",
        &secs_s,
        "--size",
        "64",
    ])
    .args(extra)
    .stderr(Stdio::inherit());
    let mut p = LineChild::spawn(cmd, "udp-blast")?;
    p.wait_ready::<Vec<(String, String)>>(Duration::from_secs(60))?;
    let line = p.wait_line("SENT", Duration::from_secs_f64(secs + 30.0))?;
    p.wait()?;
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
    let text = std::fs::read_to_string(&stat)
        .with_context(|| format!("perf stat output {}", stat.display()))?;
    let _ = std::fs::remove_file(&stat);
    // task-clock in msec.
    let cpu_ms = perf_value(&text, "task-clock")
        .with_context(|| format!("no task-clock in perf stat's output: {text}"))?;
    Ok(Blast {
        rate: sent / took,
        cpu_ns: cpu_ms * 1e6 / sent,
        switches: perf_value(&text, "context-switches").unwrap_or(f64::NAN),
        migrations: perf_value(&text, "cpu-migrations").unwrap_or(f64::NAN),
    })
}

/// Geometric mean of `ratios` with its 95% confidence interval (Student's t over the logs):
/// (mean, low, high).
fn ratio_ci(ratios: &[f64]) -> (f64, f64, f64) {
    let logs: Vec<f64> = ratios
        .iter()
        .filter(|r| r.is_finite() && **r > 0.0)
        .map(|r| r.ln())
        .collect();
    let n = logs.len();
    if n == 0 {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let mean = logs.iter().sum::<f64>() / n as f64;
    if n == 1 {
        return (mean.exp(), f64::NAN, f64::NAN);
    }
    let var = logs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let half = t975(n - 1) * (var / n as f64).sqrt();
    (mean.exp(), (mean - half).exp(), (mean + half).exp())
}

/// Median of `ratios` with its distribution-free 95% confidence interval (order statistics:
/// the k-th smallest and largest, k the largest with P(Binomial(n, 1/2) < k) ≤ 2.5%): one
/// round another build spoiled moves it by one rank, not by its size. (median, low, high).
fn median_ci(ratios: &[f64]) -> (f64, f64, f64) {
    let mut x: Vec<f64> = ratios.iter().copied().filter(|r| r.is_finite()).collect();
    x.sort_by(f64::total_cmp);
    let n = x.len();
    if n == 0 {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let med = median(&x);
    // P(Binomial(n, 1/2) <= j), summed exactly in f64.
    let cdf = |j: usize| -> f64 {
        let mut c = 1.0f64;
        let mut sum = 0.0;
        for i in 0..=j {
            if i > 0 {
                c = c * (n - i + 1) as f64 / i as f64;
            }
            sum += c;
        }
        sum / 2f64.powi(n as i32)
    };
    let mut k = 0;
    while k < n / 2 && cdf(k) <= 0.025 {
        k += 1;
    }
    if k == 0 {
        return (med, f64::NAN, f64::NAN);
    }
    (med, x[k - 1], x[n - k])
}

/// The 97.5th percentile of Student's t with `df` degrees of freedom.
fn t975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::NAN,
        1..=30 => T[df - 1],
        31..=60 => 2.000,
        61..=120 => 1.980,
        _ => 1.960,
    }
}

/// Pins every thread of `pid` to `cpu`.
fn pin(pid: u32, cpu: &str) {
    let _ = Command::new("taskset")
        .args(["-a", "-p", "-c", cpu, &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
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
    let rounds = a.guard_rounds;
    let secs = a.guard_seconds;
    let load_before = super::loadavg();
    // [variant][sender] → one Blast per round
    let mut runs = vec![vec![Vec::new(); SENDERS.len()]; Variant::ALL.len()];
    for round in 0..rounds {
        for k in 0..Variant::ALL.len() {
            let i = (k + round) % Variant::ALL.len();
            let v = Variant::ALL[i];
            let exporter = match v {
                Variant::None => None,
                _ => Some(bins.exporter(v.flags())?),
            };
            if let Some(e) = &exporter {
                pin(e.pid(), EXPORTER_CPU);
            }
            for (si, (_, extra)) in SENDERS.iter().enumerate() {
                runs[i][si].push(blast(bins, secs, extra)?);
            }
            drop(exporter);
        }
        let off = &runs[1];
        eprintln!(
            "bench overhead: guard round {}/{rounds}: guard off {:.0} sendto/s ({:.1} ns CPU each)",
            round + 1,
            off[0].last().map_or(f64::NAN, |b| b.rate),
            off[0].last().map_or(f64::NAN, |b| b.cpu_ns),
        );
    }
    let load_after = super::loadavg();
    let off = Variant::ALL
        .iter()
        .position(|v| *v == Variant::Off)
        .unwrap_or(1);
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for (si, (sender, _)) in SENDERS.iter().enumerate() {
        let base = &runs[off][si];
        for (i, v) in Variant::ALL.iter().enumerate() {
            let mine = &runs[i][si];
            let rate: Vec<f64> = mine
                .iter()
                .zip(base)
                .map(|(m, b)| m.rate / b.rate)
                .collect();
            let cpu: Vec<f64> = mine
                .iter()
                .zip(base)
                .map(|(m, b)| b.cpu_ns / m.cpu_ns)
                .collect();
            let (r, rlo, rhi) = ratio_ci(&rate);
            let (c, clo, chi) = median_ci(&cpu);
            let med = |f: fn(&Blast) -> f64| median(&mine.iter().map(f).collect::<Vec<_>>());
            rows.push(vec![
                sender.to_string(),
                v.label().to_string(),
                format!("{:.0}", med(|b| b.rate) / 1000.0),
                format!("{:.1}", med(|b| b.cpu_ns)),
                format!("{r:.3} [{rlo:.3}, {rhi:.3}]"),
                format!("{c:.3} [{clo:.3}, {chi:.3}]"),
                format!("{:.0} / {:.0}", med(|b| b.switches), med(|b| b.migrations)),
            ]);
            if v.targeted() {
                let ok = clo >= 0.97;
                let resolved = chi - clo <= 0.03;
                notes.push(format!(
                    "- {sender}: {} {c:.3} of guard off per CPU-second (median of the rounds, \
                     95% CI {clo:.3}–{chi:.3}; wall rate {r:.3}, {rlo:.3}–{rhi:.3}); target ≥ 0.97 \
                     {}{}",
                    v.label(),
                    if ok { "✓" } else { "✗" },
                    if resolved {
                        ""
                    } else {
                        " (the interval is wider than 3%: not resolved)"
                    }
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
         (datagrams to a closed loopback port), pinned to CPU {SENDER_CPU} under `perf stat` \
         (bufscope on CPU {EXPORTER_CPU}); {rounds} rounds of {secs} s, every variant once per \
         round in a rotating order; ratios are per round against guard off in the same round, \
         shown as geometric means with 95% confidence intervals. Load average before / after: \
         {load_before} / {load_after}. The guard's UDP hooks in enforce on this kernel: \
         `{hooks}`.\n\n"
    );
    out.push_str(&table(
        &[
            "sender",
            "attached",
            "median k datagrams/s",
            "median CPU ns / datagram",
            "wall rate vs guard off, geometric mean [95% CI]",
            "datagrams per CPU-second vs guard off, median [95% CI]",
            "median context switches / migrations per round",
        ],
        &rows,
    ));
    out.push_str("\n\nTargets:\n");
    out.push_str(&notes.join("\n"));
    out.push_str(&format!(
        "\n\nThe guard's programs per run (`kernel.bpf_stats_enabled=1`; every later send of a \
         decided socket, where a guard program runs on sends at all, vs each of {FRESH} new \
         sockets' life: its bind (the decision), in enforce its close (`cgroup/sock_release`, \
         the budget's release) and, with the sendmsg hooks, its one send):\n\n"
    ));
    out.push_str(&table(
        &[
            "mode",
            "ns per send (decided socket)",
            "runs",
            "ns per run over a new socket's life",
            "runs",
        ],
        &cost_rows,
    ));
    out.push('\n');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confidence_intervals_of_ratios() {
        let (m, lo, hi) = ratio_ci(&[1.0, 1.0, 1.0]);
        assert_eq!((m, lo, hi), (1.0, 1.0, 1.0));
        let (m, lo, hi) = ratio_ci(&[0.98, 1.02, 0.99, 1.01]);
        assert!((m - 1.0).abs() < 0.001, "{m}");
        assert!(
            lo < 0.99 && hi > 1.01 && lo > 0.95 && hi < 1.05,
            "{lo} {hi}"
        );
        assert!(ratio_ci(&[]).0.is_nan());
    }

    #[test]
    fn median_confidence_interval_is_robust_to_one_outlier() {
        let mut r: Vec<f64> = (0..20).map(|i| 0.99 + 0.001 * i as f64).collect();
        let (m, lo, hi) = median_ci(&r);
        assert!((m - 0.9995).abs() < 1e-9, "{m}");
        // n = 20: the 6th smallest and the 6th largest.
        assert!(
            (lo - 0.995).abs() < 1e-9 && (hi - 1.004).abs() < 1e-9,
            "{lo} {hi}"
        );
        r[0] = 0.5;
        assert_eq!(median_ci(&r).1, lo, "one spoiled round moves nothing");
        assert!(
            median_ci(&[1.0, 1.0]).1.is_nan(),
            "two rounds give no interval"
        );
    }

    #[test]
    fn perf_stat_csv() {
        let t = "# started on x\n\n1003.31,msec,task-clock,1003,100.00,0.998,CPUs utilized\n\
                 12,,context-switches,1003,100.00,11.9,/sec\n0,,cpu-migrations,1003,100.00,0,/sec\n";
        assert_eq!(perf_value(t, "task-clock"), Some(1003.31));
        assert_eq!(perf_value(t, "context-switches"), Some(12.0));
        assert_eq!(perf_value(t, "cpu-migrations"), Some(0.0));
        assert_eq!(perf_value(t, "cycles"), None);
    }
}
