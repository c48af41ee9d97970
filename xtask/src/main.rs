//! `cargo xtask`: everything that is not a library — toolchain setup, building, running the
//! exporter, the test runner, the lab and the benchmarks.

use clap::{Parser, Subcommand};

mod apt;
mod bench;
mod build;
mod dist;
mod generate;
mod image;
mod junit;
mod lab;
mod libtest;
mod matrix;
mod packages;
mod run;
mod setup;
mod test;
mod toolchain;
mod util;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "bufscope developer tasks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what a fresh machine lacks (nightly rust-src, bpf-linker, Debian packages). Idempotent.
    Setup(setup::Args),
    /// Build the whole workspace, including the BPF object.
    Build(build::Args),
    /// Write the generated files anew (the PrometheusRule from dashboards/alerts.yaml).
    Gen(generate::Args),
    /// Build the container image with podman (release binary, `localhost/bufscope:dev`).
    Image(image::Args),
    /// Build the release artifacts for gateways without Kubernetes: static binaries, .deb,
    /// .rpm, SBOMs, SHA256SUMS (target/dist; docs/packages.md).
    Dist(dist::Args),
    /// Set up, build and run the exporter (`bufscope run`), printing the metrics URL.
    Run(run::Args),
    /// Set up, build, then run the unit tests and the privileged integration tests (cargo
    /// nextest: `.config/nextest.toml` says which run alone) and the kernel matrix.
    Test(test::Args),
    /// Open a shell-ready network lab (two namespaces joined by an emulated WAN link).
    Lab(lab::Args),
    /// The kernel-matrix stage of `test` alone: boot each pinned guest kernel (QEMU) and run
    /// the integration subset inside it; `--bump` updates the pinned kernels.
    Matrix(matrix::Args),
    /// Benchmarks that print side-by-side ratios.
    #[command(subcommand)]
    Bench(bench::Bench),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Setup(a) => setup::run(&a),
        Cmd::Build(a) => build::run(&a),
        Cmd::Gen(a) => generate::run(&a),
        Cmd::Image(a) => image::run(&a),
        Cmd::Dist(a) => dist::run(&a),
        Cmd::Run(a) => run::run(&a),
        Cmd::Test(a) => test::run(&a),
        Cmd::Lab(a) => lab::run(&a),
        Cmd::Matrix(a) => matrix::run(&a),
        Cmd::Bench(b) => bench::run(b),
    }
}
