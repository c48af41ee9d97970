//! `cargo xtask test`: setup, unit tests, then the privileged integration tests, serially
//! (they share kernel state: BPF programs, namespaces, sysctls).

use crate::util::{cargo, is_root, run_cmd, workspace_root};

/// Arguments of `cargo xtask test`.
#[derive(clap::Args)]
pub struct Args {
    /// Skip the kernel-matrix stage (guest kernels under QEMU; `cargo xtask matrix` runs it
    /// alone).
    #[arg(long)]
    pub no_matrix: bool,
    /// Extra arguments passed to the test binaries (e.g. a test name filter).
    #[arg(last = true)]
    pub args: Vec<String>,
}

/// Runs every test of the workspace, ignored (privileged) ones included.
pub fn run(a: &Args) -> anyhow::Result<()> {
    if !is_root() {
        anyhow::bail!("cargo xtask test runs privileged tests (BPF, namespaces): run it as root");
    }
    crate::setup::run(&crate::setup::Args::default())?;
    crate::build::build(false)?;
    let root = workspace_root();
    let mut c = cargo();
    c.env("BUFSCOPE_BIN", root.join("target/debug/bufscope"))
        .args([
            "test",
            "--no-fail-fast",
            "--workspace",
            "--exclude",
            "bufscope-ebpf",
            "--",
            "--include-ignored",
        ])
        .args(["--test-threads=1"])
        .args(&a.args);
    let host = run_cmd(&mut c);
    let matrix = if a.no_matrix {
        Ok(())
    } else {
        crate::matrix::stage(&[])
    };
    host.and(matrix)
}
