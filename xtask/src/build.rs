//! `cargo xtask build`: build every crate, the BPF object included (through exporter/build.rs).

use crate::util::{cargo, run_cmd};

/// Arguments of `cargo xtask build`.
#[derive(clap::Args, Default)]
pub struct Args {
    /// Build with the release profile.
    #[arg(long)]
    pub release: bool,
}

/// Builds the workspace's default members (all binaries and tests' dependencies).
pub fn run(a: &Args) -> anyhow::Result<()> {
    crate::toolchain::ensure()?;
    build(a.release)
}

/// `cargo build --bins`: every binary of the default members (the BPF crate is built by the
/// exporter's build script).
pub fn build(release: bool) -> anyhow::Result<()> {
    build_packages(release, &[])
}

/// Builds the binaries of `packages` only (all default members when empty).
pub fn build_packages(release: bool, packages: &[&str]) -> anyhow::Result<()> {
    run_cmd(&mut build_command(release, packages))
}

/// The daemon as the container image ships it: `target/release/bufscope` without the default
/// features, i.e. without `bufscope top`'s terminal UI (ratatui and crossterm are not
/// compiled; `bufscope top` there says which build has it).
pub fn build_image_binary() -> anyhow::Result<()> {
    let mut c = build_command(true, &["bufscope"]);
    c.arg("--no-default-features");
    run_cmd(&mut c)
}

fn build_command(release: bool, packages: &[&str]) -> std::process::Command {
    let mut c = cargo();
    c.args(["build", "--bins"]);
    for p in packages {
        c.args(["-p", p]);
    }
    if release {
        c.arg("--release");
    }
    c
}
