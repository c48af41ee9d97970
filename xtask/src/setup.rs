//! `cargo xtask setup`: make a fresh machine able to build and test bufscope. Idempotent: every
//! step first checks whether it is already done.
//!
//! Steps: the toolchain (`toolchain.rs`: nightly `rust-src`, `bpf-linker`, `cargo-nextest`), the
//! Debian and PyPI packages the tests and benchmarks drive (`packages.rs`), the container
//! engine (`image.rs`) and the kernel matrix's QEMU, virtme-ng and guest kernels (`matrix/`).

#[path = "setup_peers.rs"]
pub mod peers;

/// Arguments of `cargo xtask setup`.
#[derive(clap::Args, Default)]
pub struct Args {
    /// Skip the Debian packages (toolchain only).
    #[arg(long)]
    pub no_packages: bool,
    /// Also build the tunnel bench's peers (upstream wireguard-go, boringtun-cli): no test
    /// needs them, so the default setup (and CI) skips them; `cargo xtask bench tunnel`
    /// builds them itself when they are missing.
    #[arg(long)]
    pub bench_peers: bool,
}

/// Runs every setup step.
pub fn run(a: &Args) -> anyhow::Result<()> {
    crate::toolchain::ensure()?;
    if !a.no_packages {
        crate::packages::ensure()?;
        // podman + runc, mmdebstrap, the containers.conf drop-in, the local base image.
        crate::image::setup()?;
        // The static (musl) target, cargo-deb, cargo-generate-rpm, cargo-cyclonedx (pinned),
        // musl-tools, rpm, and the Debian 12 image with systemd the package tests install into.
        crate::dist::setup()?;
        // QEMU, virtme-ng and the pinned guest kernels of the kernel matrix (cached).
        crate::matrix::setup()?;
        if a.bench_peers {
            peers::ensure(); // the tunnel bench's upstream wireguard-go and boringtun-cli
        }
    }
    eprintln!("xtask setup: done");
    Ok(())
}
