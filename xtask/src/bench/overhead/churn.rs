//! Section 6: owner churn at a long RTT — a `socket()`/`close()` loop on the node (every new
//! socket evicts an older owner from the `OWNERS` LRU) while `--churn-conns` TCP connections are
//! opened over a 190 ms WAN (netlab), their ESTABLISHED events arriving a round trip after the
//! loop evicted their owners. Without bufscope and with it, alternating phase by phase: the
//! loop's rate and the connections' set-up times side by side (what bufscope costs the node),
//! and with bufscope the collector lock's hold times over the phase (its own histogram),
//! `/metrics` latency during the phase, and whether the established counts equal `ss -tnp`'s.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bufscope_netlab::{Lab, LabConfig, LinkParams};
use bufscope_testkit::{LineChild, Metrics, cmd_output, http_get};

use super::Args;
use super::harness::{Bins, median, percentile};
use crate::bench::table;

/// Round-trip time of the WAN.
const RTT_MS: u64 = 190;
/// The histogram of the collector lock's hold times.
const LOCK_HOLD: &str = "bufscope_collector_lock_hold_seconds";

/// What one phase measured.
#[derive(Default)]
struct Phase {
    /// `socket()`+`close()` per second while the connections opened.
    churn_rate: f64,
    /// Connection set-up (connect → writable), ms.
    connect_p50: f64,
    connect_p99: f64,
    /// Seconds to open them all.
    open_secs: f64,
    /// With bufscope: lock hold p99 over the phase (ms), the worst hold (ms), `/metrics`
    /// latencies during the phase (ms), owner look-ups, and (bufscope, ss) established counts
    /// of the connecting process, with the seconds bufscope took to equal ss.
    lock_p99: Option<f64>,
    lock_worst: Option<f64>,
    scrapes: Vec<f64>,
    lookups: f64,
    established: Option<(usize, usize, f64)>,
}

/// Established TCP connections `ss -tnp` shows held by `pid` in network namespace `ns`.
fn ss_established(ns: &str, pid: u32) -> anyhow::Result<usize> {
    let out = cmd_output(std::process::Command::new("ip").args([
        "netns",
        "exec",
        ns,
        "ss",
        "-Htnp",
        "state",
        "established",
    ]))?;
    let needle = format!("pid={pid},");
    Ok(out.lines().filter(|l| l.contains(&needle)).count())
}

/// The churn loop's `COUNT <sockets> <secs>`.
fn churned(w: &mut LineChild) -> anyhow::Result<(f64, f64)> {
    w.send("count")?;
    let line = w.wait_line("COUNT ", Duration::from_secs(10))?;
    let f: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    match f[..] {
        [n, secs] => Ok((n, secs)),
        _ => bail!("socket-churn answered {line:?}"),
    }
}

/// `key=value` of an `OPENED …` line.
fn field(line: &str, key: &str) -> anyhow::Result<f64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no {key} in {line:?}"))
}

/// One phase: the loop, the connections, and (with an exporter) what bufscope saw.
fn phase(a: &Args, bins: &Bins, lab: &Lab, dest: &str, bufscope: bool) -> anyhow::Result<Phase> {
    let e = if bufscope {
        Some(bins.exporter(&["--poll-interval", "1s"])?)
    } else {
        None
    };
    let before = e.as_ref().map(|e| e.scrape()).transpose()?;
    let (mut churn, _) = bins.workload(None, &["socket-churn"])?;
    std::thread::sleep(Duration::from_secs(1));
    let c0 = churned(&mut churn)?;
    // /metrics every 200 ms during the phase (each scrape also polls the maps).
    let stop = Arc::new(AtomicBool::new(false));
    let scraper = e.as_ref().map(|e| {
        let (stop, addr) = (stop.clone(), e.addr().to_string());
        std::thread::spawn(move || {
            let mut lat = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                if http_get(&addr, "/metrics").is_ok_and(|(s, _)| s == 200) {
                    lat.push(t.elapsed().as_secs_f64() * 1000.0);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            lat
        })
    });
    let conns = a.churn_conns.to_string();
    let rate = a.churn_rate.to_string();
    let ns_a = lab.a().name();
    let (mut opener, ready) = bins.workload(
        Some(ns_a),
        &[
            "tcp-open", "--dest", dest, "--count", &conns, "--rate", &rate,
        ],
    )?;
    let opened = opener.wait_line("OPENED ", Duration::from_secs(180))?;
    let c1 = churned(&mut churn)?;
    let ok = field(&opened, "ok")? as usize;
    if ok != a.churn_conns {
        bail!(
            "only {ok} of {} connections opened: {opened}",
            a.churn_conns
        );
    }
    let mut p = Phase {
        churn_rate: (c1.0 - c0.0) / (c1.1 - c0.1),
        connect_p50: field(&opened, "p50_ms")?,
        connect_p99: field(&opened, "p99_ms")?,
        open_secs: field(&opened, "secs")?,
        ..Phase::default()
    };
    if let (Some(e), Some(before)) = (&e, &before) {
        let pid: u32 = ready
            .get("pid")
            .and_then(|v| v.parse().ok())
            .context("tcp-open's READY has no pid")?;
        let want = ss_established(ns_a, pid)?;
        let t = Instant::now();
        let mut got = 0;
        // While the loop still runs: until bufscope's count equals the kernel's (30 s at most).
        while t.elapsed() < Duration::from_secs(30) {
            let m = e.scrape()?;
            got = m.sum(
                "bufscope_tcp_established_total",
                &[("pid", &pid.to_string())],
            ) as usize;
            if got == want {
                break;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        p.established = Some((got, want, t.elapsed().as_secs_f64()));
        stop.store(true, Ordering::Relaxed);
        p.scrapes = scraper
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        let after: Metrics = e.scrape()?;
        p.lock_p99 = after
            .histogram_quantile(Some(before), LOCK_HOLD, &[], 0.99)
            .map(|s| s * 1000.0);
        p.lock_worst = after
            .find("bufscope_collector_lock_hold_max_seconds", &[])
            .map(|s| s.value * 1000.0)
            .reduce(f64::max);
        p.lookups = after.sum("bufscope_attribution_lookups_total", &[])
            - before.sum("bufscope_attribution_lookups_total", &[]);
    }
    drop(opener);
    drop(churn);
    drop(e);
    // Let the connections' RSTs and the exporter's detach settle before the next phase.
    std::thread::sleep(Duration::from_secs(2));
    Ok(p)
}

pub(super) fn section(a: &Args, bins: &Bins) -> anyhow::Result<String> {
    if a.churn_conns == 0 || a.churn_rate.is_nan() || a.churn_rate <= 0.0 {
        bail!("--churn-conns and --churn-rate must be above 0");
    }
    let lab = Lab::new(LabConfig::wan(
        "bsovc",
        LinkParams::mbit(100).rtt_ms(RTT_MS),
    ))
    .context("the 190 ms WAN lab (netlab)")?;
    let (_listener, ready) = bins.workload(
        Some(lab.b().name()),
        &["tcp-accept-hold", "--bind", &lab.addr_b().to_string()],
    )?;
    let dest = format!(
        "{}:{}",
        lab.addr_b(),
        ready
            .get("port")
            .context("tcp-accept-hold's READY has no port")?
    );
    let (mut none, mut with) = (Vec::new(), Vec::new());
    for round in 0..a.runs {
        // ABBA: each variant goes first in every other round.
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for bufscope in order {
            eprintln!(
                "bench overhead: churn: round {}/{}, {}",
                round + 1,
                a.runs,
                if bufscope { "bufscope" } else { "no bufscope" }
            );
            let p = phase(a, bins, &lab, &dest, bufscope)?;
            let into = if bufscope { &mut with } else { &mut none };
            into.push(p);
        }
    }
    let med = |v: &[Phase], f: fn(&Phase) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
    let row = |name: &str, v: &[Phase]| {
        let lock = |f: fn(&Phase) -> Option<f64>| {
            let x: Vec<f64> = v.iter().filter_map(f).collect();
            if x.is_empty() {
                "–".to_string()
            } else {
                format!("{:.1}", median(&x))
            }
        };
        let scrapes: Vec<f64> = v.iter().flat_map(|p| p.scrapes.iter().copied()).collect();
        vec![
            name.to_string(),
            format!("{:.0}", med(v, |p| p.churn_rate)),
            format!("{:.1}", med(v, |p| p.connect_p50)),
            format!("{:.1}", med(v, |p| p.connect_p99)),
            format!("{:.2}", med(v, |p| p.open_secs)),
            lock(|p| p.lock_p99),
            lock(|p| p.lock_worst),
            if scrapes.is_empty() {
                "–".into()
            } else {
                format!("{:.1}", percentile(&scrapes, 99.0))
            },
        ]
    };
    let ratio = |f: fn(&Phase) -> f64| med(&with, f) / med(&none, f);
    let rows = vec![
        row("no bufscope", &none),
        row("bufscope", &with),
        vec![
            "bufscope vs none".into(),
            format!("{:.3}×", ratio(|p| p.churn_rate)),
            format!("{:.3}×", ratio(|p| p.connect_p50)),
            format!("{:.3}×", ratio(|p| p.connect_p99)),
            format!("{:.3}×", ratio(|p| p.open_secs)),
            String::new(),
            String::new(),
            String::new(),
        ],
    ];
    let mut out = format!(
        "### Owner churn at {RTT_MS} ms\n\n\
         A `socket()`/`close()` loop on the node (`bufscope-workload socket-churn`: TCP sockets, one \
         core as fast as it goes) while {} TCP connections are opened through a 100 Mbit/s, \
         {RTT_MS} ms WAN (netlab; {} started per second, all in their handshake at once, held \
         by a listener in the other namespace); {} rounds, the variants alternating (ABBA), \
         medians. bufscope: release build, `--poll-interval 1s`, `/metrics` scraped every 200 ms \
         during the phase; lock hold = `{LOCK_HOLD}` (every holder) over the phase, p99 as \
         Prometheus's `histogram_quantile` estimates it; worst = `bufscope_collector_lock_hold_max_seconds`.\n\n",
        a.churn_conns, a.churn_rate, a.runs
    );
    out.push_str(&table(
        &[
            "variant",
            "socket()+close()/s",
            "connect p50 ms",
            "connect p99 ms",
            "open all, s",
            "lock hold p99 ms",
            "worst hold ms",
            "/metrics p99 ms",
        ],
        &rows,
    ));
    let exact: Vec<String> = with
        .iter()
        .filter_map(|p| p.established)
        .map(|(got, want, secs)| format!("{got}/{want} ({secs:.1} s)"))
        .collect();
    let all_exact = with.iter().all(|p| {
        p.established
            .is_some_and(|(g, w, _)| g == w && w == a.churn_conns)
    });
    let lock_p99 = median(&with.iter().filter_map(|p| p.lock_p99).collect::<Vec<_>>());
    let _ = write!(
        out,
        "\n\nEstablished connections of the connecting process, bufscope / `ss -tnp` (time from \
         the last connection up to equal), per round: {}; owner look-ups per phase: {:.0} \
         (median).\n\n\
         Targets:\n\
         - collector lock hold p99 < 20 ms during the phase: {lock_p99:.1} ms {}\n\
         - established counts = the kernel's while the loop runs, every round: {}\n",
        exact.join(", "),
        med(&with, |p| p.lookups),
        if lock_p99 < 20.0 { "✓" } else { "✗" },
        if all_exact { "✓" } else { "✗" },
    );
    Ok(out)
}
