//! `cargo xtask lab`: a shell-ready network lab for people. Two namespaces joined by an
//! emulated WAN link (50 ms RTT, 200 Mbit/s by default); prints how to enter each side and
//! tears everything down on Ctrl-C. Same flags as `netlab up`.

use anyhow::Context as _;

/// Arguments of `cargo xtask lab`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub up: bufscope_netlab::cli::UpArgs,
}

/// Builds the lab, waits for Ctrl-C, tears it down.
pub fn run(a: &Args) -> anyhow::Result<()> {
    if !crate::util::is_root() {
        anyhow::bail!("cargo xtask lab creates network namespaces: run it as root");
    }
    bufscope_netlab::cli::up(&a.up).context("cargo xtask lab")
}
