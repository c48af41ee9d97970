//! `cargo xtask bench …`: benchmarks that print ratios measured side by side in one run.

/// Benchmark selection.
#[derive(clap::Subcommand)]
pub enum Bench {
    /// Tunnel throughput/latency table at several RTTs (issue 5).
    Tunnel(tunnel::Args),
}

mod tunnel;

pub fn run(b: Bench) -> anyhow::Result<()> {
    match b {
        Bench::Tunnel(a) => tunnel::run(&a),
    }
}
