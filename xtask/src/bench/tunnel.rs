//! `cargo xtask bench tunnel` (owned by the netlab/tunnel work, issue 5).

/// Arguments of `cargo xtask bench tunnel`.
#[derive(clap::Args)]
pub struct Args {}

pub fn run(_a: &Args) -> anyhow::Result<()> {
    anyhow::bail!("cargo xtask bench tunnel is not implemented yet")
}
