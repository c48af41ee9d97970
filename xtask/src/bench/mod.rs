//! `cargo xtask bench …`: benchmarks that print ratios measured side by side in one run.

/// Benchmark selection.
#[derive(clap::Subcommand)]
pub enum Bench {
    /// Tunnel throughput/latency table at several RTTs (issue 5).
    Tunnel(tunnel::Args),
    /// What bufscope costs: per-event probe cost vs bpftrace, data path with/without probes,
    /// exporter latency/RSS/CPU with 1,000 processes (issue 4).
    Overhead(overhead::Args),
}

mod overhead;
mod tunnel;

use std::process::Command;

use anyhow::{Context as _, bail};

/// Runs `cmd`; its trimmed stdout, or an error with its stderr.
fn cmd_output(cmd: &mut Command) -> anyhow::Result<String> {
    let o = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !o.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

/// The 1/5/15-minute load averages ("?" when unreadable).
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// What a benchmark's doc section says about the machine and the run.
struct Machine {
    /// CPU model name.
    cpu: String,
    /// CPUs available.
    nproc: usize,
    /// `uname -r`.
    kernel: String,
    /// Now, UTC, to the minute.
    date: String,
    /// Short commit of the workspace's HEAD ("?" outside git).
    commit: String,
}

impl Machine {
    fn describe() -> Self {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|c| {
                c.lines().find_map(|l| {
                    l.strip_prefix("model name")
                        .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
                })
            })
            .unwrap_or_else(|| "?".into());
        let root = crate::util::workspace_root();
        Self {
            cpu,
            nproc: std::thread::available_parallelism().map_or(0, usize::from),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
            date: cmd_output(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]))
                .unwrap_or_default(),
            commit: cmd_output(Command::new("git").arg("-C").arg(&root).args([
                "rev-parse",
                "--short",
                "HEAD",
            ]))
            .unwrap_or_else(|_| "?".into()),
        }
    }
}

pub fn run(b: Bench) -> anyhow::Result<()> {
    match b {
        Bench::Tunnel(a) => tunnel::run(&a),
        Bench::Overhead(a) => overhead::run(&a),
    }
}
