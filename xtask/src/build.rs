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
    crate::setup::run(&crate::setup::Args {
        no_packages: true,
        ..Default::default()
    })?;
    build(a.release)
}

/// `cargo build --bins`: every binary of the default members (the BPF crate is built by the
/// exporter's build script).
pub fn build(release: bool) -> anyhow::Result<()> {
    build_packages(release, &[])
}

/// Builds the binaries of `packages` only (all default members when empty).
pub fn build_packages(release: bool, packages: &[&str]) -> anyhow::Result<()> {
    let mut c = cargo();
    c.args(["build", "--bins"]);
    for p in packages {
        c.args(["-p", p]);
    }
    if release {
        c.arg("--release");
    }
    run_cmd(&mut c)
}
