//! `cargo xtask setup`: make a fresh machine able to build and test bufscope. Idempotent: every
//! step first checks whether it is already done.
//!
//! Steps (see `docs/toolchain.md`): rustup self-update off, nightly `rust-src` (for
//! `-Z build-std=core`), `bpf-linker` linked against nightly's own libLLVM, and the Debian
//! packages the tests and benchmarks drive.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

use crate::util::{is_root, run_cmd};

#[path = "setup_peers.rs"]
pub mod peers;

/// Version of bpf-linker known to work with aya 0.14 and nightly's LLVM 22.
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Debian packages and one binary each provides (the binary is how we tell it is installed).
pub const DEBIAN_PACKAGES: &[(&str, &str)] = &[
    ("iproute2", "/usr/sbin/ip"),
    ("iputils-ping", "/usr/bin/ping"),
    ("iperf3", "/usr/bin/iperf3"),
    ("wireguard-go", "/usr/bin/wireguard-go"),
    ("wireguard-tools", "/usr/bin/wg"),
    ("openvpn", "/usr/sbin/openvpn"),
    ("socat", "/usr/bin/socat"),
    ("prometheus", "/usr/bin/promtool"),
    ("bpftool", "/usr/sbin/bpftool"),
    ("bpftrace", "/usr/bin/bpftrace"),
    ("libcap2-bin", "/usr/sbin/capsh"),
    ("procps", "/usr/bin/pgrep"),
    ("chromium", "/usr/bin/chromium"),
    ("openssl", "/usr/bin/openssl"),
    ("curl", "/usr/bin/curl"),
    // `bufscope top` is tested in a real terminal (integration/tests/top.rs).
    ("tmux", "/usr/bin/tmux"),
    // `kubectl kustomize` renders deploy/kustomize (integration/tests/deploy.rs); the package
    // comes from the cloud SDK apt repository of these machines' image.
    ("kubectl", "/usr/bin/kubectl"),
];

/// PyPI packages the deploy tests' offline validator (deploy/validate.py) imports: Kubernetes
/// OpenAPI schemas per release, and the Prometheus Operator's PodMonitor/ServiceMonitor models.
pub const PIP_PACKAGES: &[(&str, &str)] = &[
    ("kubernetes-validate==1.37.0", "kubernetes_validate"),
    (
        "cloudcoil-models-prometheus-operator==0.80.1.0",
        "cloudcoil.models.prometheus_operator",
    ),
    // The OpenMetrics parser the scrape-truth test checks /metrics with.
    (
        "prometheus-client==0.26.0",
        "prometheus_client.openmetrics.parser",
    ),
];

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
    rustup_no_self_update();
    ensure_nightly()?;
    ensure_rust_src()?;
    ensure_bpf_linker()?;
    if !a.no_packages {
        ensure_debian_packages()?;
        ensure_pip_packages()?;
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

fn rustup_no_self_update() {
    // Best effort: never let rustup replace itself while installing components.
    let _ = Command::new("rustup")
        .args(["set", "auto-self-update", "disable"])
        .output();
}

fn output_of(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn ensure_nightly() -> anyhow::Result<()> {
    if output_of(Command::new("rustc").args(["+nightly", "-vV"])).is_some() {
        return Ok(());
    }
    run_cmd(Command::new("rustup").args([
        "toolchain",
        "install",
        "nightly",
        "--profile",
        "minimal",
    ]))
    .context("no nightly toolchain and `rustup toolchain install nightly` failed")
}

fn nightly_sysroot() -> anyhow::Result<PathBuf> {
    output_of(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))
        .map(PathBuf::from)
        .context("`rustc +nightly --print sysroot` failed")
}

fn ensure_rust_src() -> anyhow::Result<()> {
    let sysroot = nightly_sysroot()?;
    let lib = sysroot.join("lib/rustlib");
    if lib.join("src/rust/library/core").is_dir() {
        return Ok(());
    }
    if run_cmd(Command::new("rustup").args([
        "component",
        "add",
        "rust-src",
        "--toolchain",
        "nightly",
    ]))
    .is_ok()
    {
        return Ok(());
    }
    // Offline fallback shipped beside the project (../shared/toolchain), see TOOLCHAIN.md.
    let tarball = crate::util::workspace_root()
        .join("../shared/toolchain")
        .read_dir()
        .ok()
        .and_then(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path())
                .find(|p| p.to_string_lossy().contains("rust-src-nightly"))
        });
    match tarball {
        Some(t) => run_cmd(Command::new("tar").arg("-xzf").arg(&t).arg("-C").arg(&lib))
            .context("unpacking the offline rust-src tarball"),
        None => bail!(
            "nightly rust-src is missing and `rustup component add rust-src --toolchain nightly` failed"
        ),
    }
}

fn bpf_linker_ok() -> bool {
    output_of(Command::new("bpf-linker").arg("--version"))
        .is_some_and(|v| v.contains(BPF_LINKER_VERSION))
}

fn ensure_bpf_linker() -> anyhow::Result<()> {
    if bpf_linker_ok() {
        return Ok(());
    }
    // `cargo install bpf-linker` alone links Debian's LLVM 14 and fails; link it against
    // nightly rustc's own libLLVM instead (TOOLCHAIN.md).
    let sysroot = nightly_sysroot()?;
    let nl = sysroot.join("lib");
    let so = std::fs::read_dir(&nl)
        .with_context(|| format!("reading {}", nl.display()))?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("libLLVM.so.") && n.contains("-rust-"))
        .context("nightly sysroot has no libLLVM.so.*-rust-*")?;
    let vv = output_of(Command::new("rustc").args(["+nightly", "-vV"])).unwrap_or_default();
    let major = vv
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .context("cannot read nightly's LLVM version")?
        .to_string();
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let prefix = Path::new(&home).join(".cache/bpf-linker-llvm");
    let plib = prefix.join("lib");
    std::fs::create_dir_all(&plib).with_context(|| format!("creating {}", plib.display()))?;
    for name in ["libLLVM.so".to_string(), so.clone()] {
        let link = plib.join(&name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(nl.join(&so), &link)
            .with_context(|| format!("symlinking {}", link.display()))?;
    }
    run_cmd(
        Command::new("cargo")
            .env("LLVM_PREFIX", &prefix)
            .args(["install", "bpf-linker", "--version", BPF_LINKER_VERSION])
            .args(["--no-default-features", "--features"])
            .arg(format!("llvm-{major}")),
    )?;
    if !bpf_linker_ok() {
        bail!("bpf-linker was installed but is not on PATH: add ~/.cargo/bin to PATH");
    }
    Ok(())
}

fn ensure_debian_packages() -> anyhow::Result<()> {
    apt_install(
        &missing_packages(DEBIAN_PACKAGES),
        "run `cargo xtask setup` as root or apt-get install them",
    )
}

/// The packages of `packages` (a Debian package and one file it installs) whose file is
/// missing.
pub(crate) fn missing_packages<'a>(packages: &[(&'a str, &str)]) -> Vec<&'a str> {
    packages
        .iter()
        .filter(|(_, file)| !Path::new(file).exists())
        .map(|(pkg, _)| *pkg)
        .collect()
}

/// Installs the Debian packages `missing` with apt-get (nothing when it is empty); not being
/// root is an error that names them and says `what_to_do`.
pub(crate) fn apt_install(missing: &[&str], what_to_do: &str) -> anyhow::Result<()> {
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        bail!("missing Debian packages {missing:?}: {what_to_do}");
    }
    run_cmd(Command::new("apt-get").args(["update", "-qq"]))?;
    run_cmd(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(missing),
    )
}

fn ensure_pip_packages() -> anyhow::Result<()> {
    let missing: Vec<&str> = PIP_PACKAGES
        .iter()
        .filter(|(_, module)| {
            !Command::new("python3")
                .args(["-c", &format!("import {module}")])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(|(req, _)| *req)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    run_cmd(
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(&missing),
    )
    .context("pip install of the deploy validator's packages failed")
}
