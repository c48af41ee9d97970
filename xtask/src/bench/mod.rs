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

pub fn run(b: Bench) -> anyhow::Result<()> {
    match b {
        Bench::Tunnel(a) => tunnel::run(&a),
        Bench::Overhead(a) => overhead::run(&a),
    }
}
