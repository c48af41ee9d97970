//! Section 3: the exporter itself — `/metrics` latency, RSS and CPU with many processes
//! holding many dropping sockets, under load and idle.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bufscope_testkit::{Exporter, cmd_output};

use super::Args;
use super::harness::{Bins, percentile};
use crate::bench::table;

/// utime + stime of `pid`, in seconds.
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat
        .rfind(')')
        .map(|i| &stat[i + 2..])
        .context("malformed /proc/<pid>/stat")?;
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let hz = cmd_output(Command::new("getconf").arg("CLK_TCK"))
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100.0);
    Ok(ticks / hz)
}

/// `VmRSS` and `VmHWM` of `pid`, MiB.
fn rss_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    (kb("VmRSS:") / 1024.0, kb("VmHWM:") / 1024.0)
}

/// CPU share of one core used by `pid` over `window`.
fn cpu_share(pid: u32, window: Duration) -> anyhow::Result<f64> {
    let c0 = cpu_seconds(pid)?;
    let t0 = Instant::now();
    std::thread::sleep(window);
    let c1 = cpu_seconds(pid)?;
    Ok((c1 - c0) / t0.elapsed().as_secs_f64())
}

/// Scrape latencies (ms), one scrape every 200 ms so that each one also reads the maps.
fn scrape_latencies(e: &Exporter, n: usize) -> anyhow::Result<(Vec<f64>, usize, usize)> {
    let mut lat = Vec::with_capacity(n);
    let (mut bytes, mut series) = (0, 0);
    for _ in 0..n {
        std::thread::sleep(Duration::from_millis(200));
        let t = Instant::now();
        let body = e.metrics_text()?;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
        bytes = body.len();
        series = body.lines().filter(|l| !l.starts_with('#')).count();
    }
    Ok((lat, bytes, series))
}

pub(super) fn section(a: &Args, bins: &Bins) -> anyhow::Result<String> {
    let e = bins.exporter(&["--poll-interval", "1s"])?;
    let dir = std::env::temp_dir().join(format!("bsp-overhead-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let _cleanup = RemoveDir(dir.clone());
    let ports = dir.join("ports");
    let activity = dir.join("activity");
    std::fs::write(&activity, "on")?;
    let procs = a.procs.to_string();
    let socks = a.socks_per_proc.to_string();
    eprintln!(
        "bench overhead: exporter: starting {} processes × {} sockets",
        a.procs, a.socks_per_proc
    );
    let (_pop, _) = bins.workload(
        None,
        &[
            "many-procs",
            "--procs",
            &procs,
            "--socks",
            &socks,
            "--rcvbuf",
            "4096",
            "--ports-file",
            &ports.display().to_string(),
            "--activity-file",
            &activity.display().to_string(),
            "--every-ms",
            "1000",
        ],
    )?;
    let spray_secs = (2 * a.cpu_window + 60 + a.scrapes as u64 / 4).to_string();
    let pps = a.spray_pps.to_string();
    let spray = bins.workload(
        None,
        &[
            "udp-spray",
            "--ports-file",
            &ports.display().to_string(),
            "--pps",
            &pps,
            "--seconds",
            &spray_secs,
        ],
    )?;
    // Warm-up: every socket has dropped and been attributed.
    let want = (a.procs * a.socks_per_proc) as f64;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        std::thread::sleep(Duration::from_secs(2));
        let m = e.scrape()?;
        let entries = m.sum("bufscope_bpf_map_entries", &[("map", "DROPS")]);
        let tracked = m.sum("bufscope_tracked_processes", &[]);
        if entries >= want && tracked >= a.procs as f64 {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "warm-up: {entries} DROPS entries and {tracked} tracked processes after 120 s (want {want} and {})",
                a.procs
            );
        }
    }
    eprintln!("bench overhead: exporter: load phase");
    let load_cpu = cpu_share(e.pid(), Duration::from_secs(a.cpu_window))?;
    let (load_lat, load_bytes, load_series) = scrape_latencies(&e, a.scrapes)?;
    let load = e.scrape()?;
    drop(spray);
    std::fs::remove_file(&activity)?;
    eprintln!("bench overhead: exporter: idle phase (after 60 s of quiet: steady state)");
    // Past the last poll that saw changes and the first GC passes over the now idle entries.
    std::thread::sleep(Duration::from_secs(60));
    let idle_cpu = cpu_share(e.pid(), Duration::from_secs(a.cpu_window))?;
    let c0 = cpu_seconds(e.pid())?;
    let (idle_lat, idle_bytes, idle_series) = scrape_latencies(&e, a.scrapes)?;
    let idle_cpu_ms = (cpu_seconds(e.pid())? - c0) * 1000.0 / a.scrapes as f64;
    let (rss, hwm) = rss_mib(e.pid());
    eprintln!("bench overhead: exporter: its peers scraped on the same node");
    let mut peer_rows = vec![vec![
        "bufscope (idle phase above)".to_string(),
        "per process: socket drops, buffer calls, locks; findings".to_string(),
        format!("{idle_series} ({:.0} KiB)", idle_bytes as f64 / 1024.0),
        format!("{:.1}", percentile(&idle_lat, 50.0)),
        format!("{:.1}", percentile(&idle_lat, 99.0)),
        format!("{idle_cpu_ms:.2}"),
    ]];
    for peer in PEERS {
        match peer_scrapes(peer, &dir, a.scrapes) {
            Ok(r) => peer_rows.push(vec![
                peer.name.to_string(),
                peer.covers.to_string(),
                format!("{} ({:.0} KiB)", r.series, r.bytes as f64 / 1024.0),
                format!("{:.1}", percentile(&r.lat, 50.0)),
                format!("{:.1}", percentile(&r.lat, 99.0)),
                format!("{:.2}", r.cpu_ms),
            ]),
            Err(e) => {
                eprintln!("bench overhead: exporter: {} left out: {e:#}", peer.name);
            }
        }
    }
    let lost_causes: Vec<String> = load
        .find("bufscope_bpf_events_lost_total", &[])
        .filter(|s| s.value > 0.0)
        .filter_map(|s| Some(format!("{} {:.0}", s.labels.get("cause")?, s.value)))
        .collect();
    let lost = if lost_causes.is_empty() {
        "0".to_string()
    } else {
        lost_causes.join(", ")
    };
    let drops = load.sum("bufscope_socket_drops_total", &[]);
    let calls = load.sum("bufscope_setsockopt_total", &[]);
    let tracked = load.sum("bufscope_tracked_processes", &[]);
    let entries = load.sum("bufscope_bpf_map_entries", &[("map", "DROPS")]);
    let p = |v: &[f64], q: f64| format!("{:.1}", percentile(v, q));
    let rows = vec![
        vec![
            format!(
                "load: {} datagrams/s sprayed over all sockets (drops), {} SO_RCVBUF calls/s",
                a.spray_pps, a.procs
            ),
            p(&load_lat, 50.0),
            p(&load_lat, 99.0),
            format!("{:.2}%", load_cpu * 100.0),
        ],
        vec![
            "idle: same processes and sockets, no traffic".to_string(),
            p(&idle_lat, 50.0),
            p(&idle_lat, 99.0),
            format!("{:.2}%", idle_cpu * 100.0),
        ],
    ];
    let mut out = format!(
        "### Exporter\n\n{} processes holding {} UDP sockets ({} each, never read, SO_RCVBUF 4096); \
         bufscope `--poll-interval 1s`, release build; {} scrapes per phase, one every 200 ms \
         (each also reads the maps); CPU over {} s without scrapes.\n\n",
        a.procs,
        a.procs * a.socks_per_proc,
        a.socks_per_proc,
        a.scrapes,
        a.cpu_window
    );
    out.push_str(&table(
        &[
            "phase",
            "/metrics p50 ms",
            "/metrics p99 ms",
            "CPU (one core)",
        ],
        &rows,
    ));
    let _ = write!(
        out,
        "\n\nAt the end: RSS {rss:.1} MiB (peak {hwm:.1} MiB); {tracked:.0} tracked processes, \
         {entries:.0} `DROPS` map entries, /metrics {load_series} samples ({:.0} KiB) under load; \
         counted {drops:.0} drops and {calls:.0} setsockopt calls; BPF-side losses \
         (`bufscope_bpf_events_lost_total`): {lost}.\n\n\
         Targets (exporter at 1,000 processes):\n\
         - /metrics p99 < 50 ms under load: {} ms {}\n\
         - /metrics p99 < 15 ms idle: {} ms {}\n\
         - RSS < 64 MiB: {rss:.1} MiB at the end (peak {hwm:.1} MiB, while start-up parses the kernel BTF) {}\n\
         - CPU < 1% of a core idle: {:.2}% {} (under load: {:.2}%)\n\n\
         Its peers on the same node, with the same 1,000 processes (Debian's packages, default \
         flags; process-exporter configured to follow every process, one group per command \
         name), scraped {} times each, one every 200 ms; CPU is the exporter's own (utime + \
         stime) over its scrapes, per scrape (bufscope's includes its own 1 s poll meanwhile):\n\n{}\n",
        load_bytes as f64 / 1024.0,
        p(&load_lat, 99.0),
        if percentile(&load_lat, 99.0) < 50.0 {
            "✓"
        } else {
            "✗"
        },
        p(&idle_lat, 99.0),
        if percentile(&idle_lat, 99.0) < 15.0 {
            "✓"
        } else {
            "✗"
        },
        if rss < 64.0 { "✓" } else { "✗" },
        idle_cpu * 100.0,
        if idle_cpu < 0.01 { "✓" } else { "✗" },
        load_cpu * 100.0,
        a.scrapes,
        table(
            &[
                "exporter",
                "what it exposes",
                "samples per scrape",
                "p50 ms",
                "p99 ms",
                "CPU ms per scrape",
            ],
            &peer_rows,
        ),
    );
    Ok(out)
}

/// An exporter a gateway operator runs beside bufscope (or instead of it), from Debian.
struct Peer {
    name: &'static str,
    package: &'static str,
    bin: &'static str,
    covers: &'static str,
    /// Its arguments; `{addr}` is its listen address, `{config}` a config file of [`Peer::config`].
    args: &'static [&'static str],
    config: Option<&'static str>,
    port: u16,
}

const PEERS: &[Peer] = &[
    Peer {
        name: "prometheus-node-exporter 1.5",
        package: "prometheus-node-exporter",
        bin: "/usr/bin/prometheus-node-exporter",
        covers: "per node (default collectors)",
        args: &["--web.listen-address={addr}"],
        config: None,
        port: 19100,
    },
    Peer {
        name: "prometheus-process-exporter 0.7",
        package: "prometheus-process-exporter",
        bin: "/usr/bin/prometheus-process-exporter",
        covers: "per process group (CPU, memory, fds, threads)",
        args: &["-web.listen-address", "{addr}", "-config.path", "{config}"],
        config: Some("process_names:\n  - name: \"{{.Comm}}\"\n    cmdline:\n    - '.+'\n"),
        port: 19256,
    },
];

/// What scraping a peer measured.
struct PeerRun {
    lat: Vec<f64>,
    bytes: usize,
    series: usize,
    cpu_ms: f64,
}

/// Installs `peer` when missing, starts it, scrapes it `n` times (one every 200 ms) and stops
/// it.
fn peer_scrapes(peer: &Peer, dir: &std::path::Path, n: usize) -> anyhow::Result<PeerRun> {
    crate::packages::apt_install(
        &crate::packages::missing_packages(&[(peer.package, peer.bin)]),
        "run the bench as root, or apt-get install it",
    )?;
    let addr = format!("127.0.0.1:{}", peer.port);
    let config = dir.join(format!("{}.yml", peer.package));
    if let Some(c) = peer.config {
        std::fs::write(&config, c)?;
    }
    let args: Vec<String> = peer
        .args
        .iter()
        .map(|a| {
            a.replace("{addr}", &addr)
                .replace("{config}", &config.display().to_string())
        })
        .collect();
    let child = Command::new(peer.bin)
        .args(&args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", peer.bin))?;
    let child = Killed(child);
    let pid = child.0.id();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !matches!(bufscope_testkit::http_get(&addr, "/metrics"), Ok((200, _))) {
        if Instant::now() > deadline {
            bail!("{} did not serve /metrics on {addr} within 20 s", peer.bin);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let c0 = cpu_seconds(pid)?;
    let mut lat = Vec::with_capacity(n);
    let (mut bytes, mut series) = (0, 0);
    for _ in 0..n {
        std::thread::sleep(Duration::from_millis(200));
        let t = Instant::now();
        let (status, body) = bufscope_testkit::http_get(&addr, "/metrics")?;
        if status != 200 {
            bail!("{}: GET /metrics: HTTP {status}", peer.bin);
        }
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
        bytes = body.len();
        series = body.lines().filter(|l| !l.starts_with('#')).count();
    }
    let cpu_ms = (cpu_seconds(pid)? - c0) * 1000.0 / n as f64;
    Ok(PeerRun {
        lat,
        bytes,
        series,
        cpu_ms,
    })
}

/// A child killed and reaped when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Removes a directory tree when dropped.
struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
