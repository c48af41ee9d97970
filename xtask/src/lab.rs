//! `cargo xtask lab` (owned by the netlab work, issue 5).

/// Arguments of `cargo xtask lab`.
#[derive(clap::Args)]
pub struct Args {}

pub fn run(_a: &Args) -> anyhow::Result<()> {
    anyhow::bail!("cargo xtask lab is not implemented yet")
}
