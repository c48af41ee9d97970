//! `cargo xtask bench …`: benchmarks that print ratios measured side by side in one run.

/// Benchmark selection.
#[derive(clap::Subcommand)]
pub enum Bench {
    /// Tunnel throughput/latency table at several RTTs.
    Tunnel(tunnel::Args),
    /// What bufscope costs: per-event probe cost vs bpftrace, data path with/without probes,
    /// exporter latency/RSS/CPU with 1,000 processes.
    Overhead(overhead::Args),
    /// The guard next to host-wide UDP buffer sysctls (bpftune's test shape): throughput,
    /// loss, receive memory, sysctls changed.
    GuardVsSysctl(guard_vs_sysctl::Args),
}

mod guard_vs_sysctl;
mod overhead;
mod tunnel;

use std::fmt::Write as _;
use std::process::Command;

use anyhow::Context as _;
use bufscope_testkit::cmd_output;

use crate::util::workspace_root;

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
        let root = workspace_root();
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

impl Machine {
    /// "`nproc` = …, `uname -r` = …, CPU: …", as both benchmarks' doc sections say it.
    fn summary(&self) -> String {
        format!(
            "`nproc` = {}, `uname -r` = {}, CPU: {}",
            self.nproc, self.kernel, self.cpu
        )
    }
}

/// `target/release` of this workspace (`$CARGO_TARGET_DIR` honoured).
pub(crate) fn release_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
        .join("release")
}

/// Rewrites docs/benchmarks.md with `edit` (given its text, empty when there is none yet) and
/// says so on stderr as `bench <bench>: updated …`.
fn rewrite_doc(bench: &str, edit: impl FnOnce(String) -> String) -> anyhow::Result<()> {
    let path = workspace_root().join("docs/benchmarks.md");
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    std::fs::write(&path, edit(old)).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("bench {bench}: updated {}", path.display());
    Ok(())
}

/// Renders a Markdown table with aligned columns.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < w.len() {
                w[i] = w[i].max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<String>| {
        let mut s = String::from("|");
        for (i, c) in cells.iter().enumerate() {
            let pad = w[i].saturating_sub(c.chars().count());
            let _ = write!(s, " {c}{} |", " ".repeat(pad));
        }
        s
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    out.push('\n');
    out.push_str(&line(w.iter().map(|n| "-".repeat(*n)).collect()));
    for r in rows {
        out.push('\n');
        out.push_str(&line(r.clone()));
    }
    out
}

pub fn run(b: Bench) -> anyhow::Result<()> {
    match b {
        Bench::Tunnel(a) => tunnel::run(&a),
        Bench::Overhead(a) => overhead::run(&a),
        Bench::GuardVsSysctl(a) => guard_vs_sysctl::run(&a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns() {
        let t = table(&["a", "bb"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(t, "| a   | bb |\n| --- | -- |\n| xyz | 1  |");
    }
}
