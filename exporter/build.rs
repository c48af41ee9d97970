//! Builds the BPF object (`bufscope-ebpf`, with nightly + bpf-linker) into `OUT_DIR`, where
//! `src/probes/mod.rs` embeds it. `AYA_BUILD_SKIP=1` skips it for fast `cargo check`/clippy runs.
use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let cargo_metadata::Metadata { packages, .. } = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = packages
        .into_iter()
        .find(|p| p.name.as_str() == "bufscope-ebpf")
        .ok_or_else(|| anyhow!("bufscope-ebpf package not found in the workspace"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("bufscope-ebpf manifest has no parent directory"))?
        .as_str()
        .to_owned();
    let package = Package {
        name: ebpf.name.as_str(),
        root_dir: &root_dir,
        ..Default::default()
    };
    aya_build::build_ebpf([package], Toolchain::Nightly).context(
        "building the BPF programs failed: run `cargo xtask setup` (nightly rust-src, bpf-linker)",
    )
}
