//! `cargo xtask bench overhead`: what bufscope costs, measured side by side in one run.
//!
//! Six sections, each printed as a table (and written into the "Overhead" section of
//! `docs/benchmarks.md` with `--update-doc`):
//!
//! 1. **probes** — cost per event of each BPF program (`run_time_ns / run_cnt` with
//!    `kernel.bpf_stats_enabled=1`, restored afterwards) under a workload that fires it, next to
//!    a bpftrace one-liner that counts the same events by the same key. bufscope and bpftrace
//!    run in separate, alternating phases (ABBA…) — never attached together, so neither warms
//!    the cache lines the other then reads — and each row is the median of `--runs` phases.
//! 2. **datapath** — UDP packets per second (every datagram dropped; nothing dropped) and TCP
//!    bulk throughput, on loopback and through a veth pair between two namespaces, without
//!    probes, with bufscope, with bufscope and `--bpf.run-stats` (what the kernel's run-time
//!    stats cost, next to bufscope without them), with bufscope's drop probe alone, and with a
//!    bpftrace drop counter;
//!    variants alternate round by round (`--runs` rounds), the table shows medians and each
//!    variant relative to "no probes".
//! 3. **syscalls** — the syscall tax: an unrelated syscall (getppid) and a buffer
//!    `setsockopt` with no bufscope, bufscope's default hooks, bufscope without setsockopt and
//!    owners, and bufscope on the syscall tracepoints it falls back to without cgroup2.
//! 4. **exporter** — the daemon itself with `--procs` processes holding `--socks-per-proc`
//!    UDP sockets each, with drops and setsockopt activity: `/metrics` latency p50/p99, RSS and
//!    CPU at a 1 s poll interval, under load and idle.
//! 5. **guard** — the guard on a gateway's send path: an unconnected UDP sender (`sendto` and
//!    `sendmmsg`) in its own network namespace with the guard off, in `observe` and in
//!    `enforce`, in `--guard-rounds` short paired rounds under `perf stat` with confidence
//!    intervals, and what a per-socket decision costs.
//! 6. **churn** — a `socket()`/`close()` loop that evicts owners from the `OWNERS` LRU while
//!    `--churn-conns` TCP connections open over a 190 ms WAN, without and with bufscope
//!    (alternating): the loop's rate and the connections' set-up times side by side, the
//!    collector lock's hold p99 from bufscope's own histogram, and established counts against
//!    `ss -tnp`.
//!
//! The machine is shared (other agents build and test on the same two cores): alternating A/B
//! phases cancel slow drift; medians cancel short bursts. Nothing here asserts a time: the
//! numbers are reported, with their targets next to them.
//!
//! The code: `harness` (the binaries, child processes, the exporter, bpftrace, statistics),
//! `bpf_stats` (per-program run time and count), `hooks` (what is compared per probe), one
//! module per section (`probes`, `datapath`, `syscalls`, `exporter`, `guard`, `churn`) and `doc`
//! (docs/benchmarks.md).

mod bpf_stats;
mod churn;
mod datapath;
mod doc;
mod exporter;
mod guard;
mod harness;
mod hooks;
mod loads;
mod probes;
mod syscalls;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

pub(super) use super::loadavg;
use crate::util::is_root;
use datapath::Variant;
use harness::Bins;
use loads::Load;

/// The sections, in the order they run.
const SECTIONS: [&str; 6] = [
    "probes", "datapath", "syscalls", "exporter", "guard", "churn",
];

/// Arguments of `cargo xtask bench overhead`.
#[derive(clap::Args)]
pub struct Args {
    /// Sections to run: probes, datapath, syscalls, exporter, guard, churn.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "probes,datapath,syscalls,exporter,guard,churn"
    )]
    pub sections: Vec<String>,
    /// Workloads of the probes section: udp-drops, setsockopt, tcp-connect, tcp-bulk.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "udp-drops,setsockopt,tcp-connect,tcp-bulk"
    )]
    pub loads: Vec<String>,
    /// Alternating A/B rounds; every figure is the median over them.
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Length of each data-path transfer, seconds.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Paired rounds of the guard section (every variant once per round).
    #[arg(long, default_value_t = 20)]
    pub guard_rounds: usize,
    /// Length of each blast of the guard section, seconds.
    #[arg(long, default_value_t = 1.0)]
    pub guard_seconds: f64,
    /// Data-path traffic: udp-dropped (receiver full), udp-read (receiver reading), tcp-bulk.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "udp-dropped,udp-read,tcp-bulk"
    )]
    pub cases: Vec<String>,
    /// Data-path variants: none, bufscope, run-stats (bufscope --bpf.run-stats), drops-only, drops-tracepoint (the drop probe with
    /// fentry/fexit refused), wireguard (bufscope --wireguard.queue-drops on), bpftrace.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "none,bufscope,run-stats,drops-only,bpftrace"
    )]
    pub variants: Vec<String>,
    /// Processes of the exporter-cost population.
    #[arg(long, default_value_t = 1000)]
    pub procs: usize,
    /// UDP sockets held by each of those processes.
    #[arg(long, default_value_t = 10)]
    pub socks_per_proc: usize,
    /// Datagrams per second sprayed over all those sockets (drops) during the load phase.
    #[arg(long, default_value_t = 20_000)]
    pub spray_pps: u64,
    /// Length of each CPU measurement window of the exporter section, seconds (60: one full
    /// GC period of the exporter at its default retention, so the window sees its average).
    #[arg(long, default_value_t = 60)]
    pub cpu_window: u64,
    /// TCP connections opened over the 190 ms WAN in each phase of the churn section.
    #[arg(long, default_value_t = 1000)]
    pub churn_conns: usize,
    /// Connections started per second in the churn section (all in their handshake at once).
    #[arg(long, default_value_t = 200.0)]
    pub churn_rate: f64,
    /// Scrapes per latency measurement.
    #[arg(long, default_value_t = 100)]
    pub scrapes: usize,
    /// Directory holding release builds of `bufscope` and `bufscope-workload` (default: build
    /// them with `cargo build --release`).
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Run the benchmark inside this pinned guest kernel of the matrix (`kernels.pin` name,
    /// e.g. `6.1`) under QEMU instead of on this kernel: ratios only (TCG inflates absolute
    /// costs). Release binaries are built on the host first.
    #[arg(long)]
    pub kernel: Option<String>,
    /// Rewrite the "Overhead" section of docs/benchmarks.md with this run's results.
    #[arg(long)]
    pub update_doc: bool,
}

/// Runs the selected sections and prints (and optionally records) their tables.
pub fn run(a: &Args) -> anyhow::Result<()> {
    if !is_root() {
        bail!(
            "cargo xtask bench overhead loads BPF programs and creates namespaces: run it as root"
        );
    }
    for s in &a.sections {
        if !SECTIONS.contains(&s.as_str()) {
            bail!("unknown section {s:?} (sections: {})", SECTIONS.join(", "));
        }
    }
    for l in &a.loads {
        if Load::parse(l).is_none() {
            bail!("unknown load {l:?} (loads: udp-drops, setsockopt, tcp-connect, tcp-bulk)");
        }
    }
    for v in &a.variants {
        if Variant::parse(v).is_none() {
            bail!(
                "unknown variant {v:?} (variants: none, bufscope, run-stats, drops-only, drops-tracepoint, wireguard, bpftrace)"
            );
        }
    }
    for c in &a.cases {
        if !["udp-dropped", "udp-read", "tcp-bulk"].contains(&c.as_str()) {
            bail!("unknown case {c:?} (cases: udp-dropped, udp-read, tcp-bulk)");
        }
    }
    if a.runs == 0 {
        bail!("--runs must be at least 1");
    }
    if a.guard_rounds < 2 {
        bail!("--guard-rounds must be at least 2 (the confidence intervals need two rounds)");
    }
    if a.guard_seconds.is_nan() || a.guard_seconds <= 0.0 {
        bail!("--guard-seconds must be above 0");
    }
    if let Some(kernel) = &a.kernel {
        return in_guest(a, kernel);
    }
    let bins = Bins::find_or_build(a)?;
    let started = Instant::now();
    let load_before = loadavg();
    let mut out = Report::default();
    if a.sections.iter().any(|s| s == "probes") {
        out.probes = Some(probes::section(a, &bins)?);
        println!("{}", out.probes.as_deref().unwrap_or(""));
    }
    if a.sections.iter().any(|s| s == "datapath") {
        out.datapath = Some(datapath::section(a, &bins)?);
        println!("{}", out.datapath.as_deref().unwrap_or(""));
    }
    if a.sections.iter().any(|s| s == "syscalls") {
        out.syscalls = Some(syscalls::section(a, &bins)?);
        println!("{}", out.syscalls.as_deref().unwrap_or(""));
    }
    if a.sections.iter().any(|s| s == "exporter") {
        out.exporter = Some(exporter::section(a, &bins)?);
        println!("{}", out.exporter.as_deref().unwrap_or(""));
    }
    if a.sections.iter().any(|s| s == "guard") {
        out.guard = Some(guard::section(a, &bins)?);
        println!("{}", out.guard.as_deref().unwrap_or(""));
    }
    if a.sections.iter().any(|s| s == "churn") {
        out.churn = Some(churn::section(a, &bins)?);
        println!("{}", out.churn.as_deref().unwrap_or(""));
    }
    out.elapsed = started.elapsed();
    out.load = (load_before, loadavg());
    if a.update_doc {
        doc::update(a, &out)?;
    }
    Ok(())
}

/// Builds the release binaries here, then runs this same command (without `--kernel` and
/// `--update-doc`) inside the pinned guest `kernel`.
fn in_guest(a: &Args, kernel: &str) -> anyhow::Result<()> {
    if a.update_doc {
        bail!("--update-doc records this machine's kernel: run it without --kernel");
    }
    Bins::find_or_build(a)?;
    let bin_dir = a.bin_dir.clone().unwrap_or_else(super::release_dir);
    let xtask = std::env::current_exe().context("the xtask binary")?;
    let mut words = vec![xtask.to_string_lossy().into_owned()];
    let mut args = std::env::args().skip(1).peekable();
    while let Some(w) = args.next() {
        if w == "--kernel" || w == "--bin-dir" {
            args.next();
        } else if !w.starts_with("--kernel=") && !w.starts_with("--bin-dir=") {
            words.push(w);
        }
    }
    words.extend(["--bin-dir".into(), bin_dir.to_string_lossy().into_owned()]);
    let line: Vec<String> = words
        .iter()
        .map(|w| format!("'{}'", w.replace('\'', "'\\''")))
        .collect();
    // Under TCG an exporter start takes 10–40 s: each round of each variant gets 2 minutes
    // (a timed-out guest loses every round, so err on the long side).
    let per_round = Duration::from_secs(120) * a.variants.len().max(1) as u32;
    let timeout = Duration::from_secs(600) + per_round * a.runs as u32;
    crate::matrix::run_in_guest(kernel, &line.join(" "), timeout)
}

/// What one invocation produced.
#[derive(Default)]
struct Report {
    probes: Option<String>,
    datapath: Option<String>,
    syscalls: Option<String>,
    exporter: Option<String>,
    guard: Option<String>,
    churn: Option<String>,
    elapsed: Duration,
    load: (String, String),
}
