//! `cargo xtask run [-- ARGS]`: set up, build and run `bufscope run` as root.

use std::process::Command;

use anyhow::Context as _;

use crate::util::{is_root, run_cmd, workspace_root};

/// Arguments of `cargo xtask run`.
#[derive(clap::Args)]
pub struct Args {
    /// Build in debug mode instead of release.
    #[arg(long)]
    pub debug: bool,
    /// Arguments passed to `bufscope run` (after `--`).
    #[arg(last = true)]
    pub args: Vec<String>,
}

/// Sets up, builds and runs the exporter in the foreground.
pub fn run(a: &Args) -> anyhow::Result<()> {
    crate::setup::run(&crate::setup::Args::default())?;
    // Only the exporter: the tunnel, the lab and the test workloads are not needed to run it.
    crate::build::build_packages(!a.debug, &["bufscope"])?;
    let profile = if a.debug { "debug" } else { "release" };
    let bin = workspace_root()
        .join("target")
        .join(profile)
        .join("bufscope");
    let listen = a
        .args
        .iter()
        .position(|x| x == "--web.listen-address")
        .and_then(|i| a.args.get(i + 1).cloned())
        .or_else(|| {
            a.args
                .iter()
                .find_map(|x| x.strip_prefix("--web.listen-address=").map(String::from))
        })
        .unwrap_or_else(|| ":9477".into());
    let host = if listen.starts_with(':') {
        format!("localhost{listen}")
    } else {
        listen
    };
    eprintln!("xtask run: bufscope will serve http://{host}/metrics (Ctrl-C to stop)");
    let mut cmd = if is_root() {
        Command::new(&bin)
    } else {
        let mut c = Command::new("sudo");
        c.arg("-E").arg(&bin);
        c
    };
    cmd.arg("run").args(&a.args);
    run_cmd(&mut cmd).context("bufscope exited with an error")
}
