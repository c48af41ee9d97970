//! The Rust side of a fresh machine: rustup self-update off, nightly `rust-src` (for
//! `-Z build-std=core`), `bpf-linker` linked against nightly's own libLLVM, and `cargo-nextest`
//! (the host stage of `cargo xtask test`). Every step first checks whether it is done.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

use crate::util::run_cmd;

/// Version of bpf-linker known to work with aya 0.14 and nightly's LLVM 22.
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Runs every toolchain step.
pub fn ensure() -> anyhow::Result<()> {
    rustup_no_self_update();
    ensure_nightly()?;
    ensure_rust_src()?;
    ensure_bpf_linker()?;
    ensure_nextest()
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

/// The cargo-nextest the host stage of `cargo xtask test` is measured with; an older one (at
/// least [`NEXTEST_MIN`]) is used as found.
const NEXTEST_VERSION: &str = "0.9.143";

/// The oldest cargo-nextest with everything `.config/nextest.toml` uses (test groups,
/// `threads-required`, per-test `priority`, JUnit).
const NEXTEST_MIN: (u32, u32, u32) = (0, 9, 91);

/// `cargo nextest --version`'s version (`cargo-nextest 0.9.143 (…)`), if it runs.
fn nextest_version() -> Option<(u32, u32, u32)> {
    let v = output_of(Command::new("cargo").args(["nextest", "--version"]))?;
    let word = v.lines().next()?.split_whitespace().nth(1)?;
    let mut n = word.split('.').map(|x| x.parse::<u32>().ok());
    Some((n.next()??, n.next()??, n.next()??))
}

/// Installs cargo-nextest when it is missing or too old: the project's prebuilt binary for
/// this version (seconds), else `cargo install --locked` (minutes: it compiles).
fn ensure_nextest() -> anyhow::Result<()> {
    if nextest_version().is_some_and(|v| v >= NEXTEST_MIN) {
        return Ok(());
    }
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(&std::env::var("HOME").unwrap_or_else(|_| "/root".into())).join(".cargo")
        });
    let bin = home.join("bin");
    std::fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;
    let url = format!("https://get.nexte.st/{NEXTEST_VERSION}/linux");
    let prebuilt = run_cmd(Command::new("sh").arg("-c").arg(format!(
        "set -o pipefail 2>/dev/null; curl -fsSL {url} | tar -xzf - -C {}",
        crate::util::shell_word(&bin.to_string_lossy())
    )));
    if prebuilt.is_err() || nextest_version().is_none() {
        run_cmd(Command::new("cargo").args([
            "install",
            "cargo-nextest",
            "--locked",
            "--version",
            NEXTEST_VERSION,
        ]))
        .context("installing cargo-nextest")?;
    }
    match nextest_version() {
        Some(v) if v >= NEXTEST_MIN => Ok(()),
        _ => bail!(
            "cargo-nextest was installed but `cargo nextest` does not run: add {} to PATH",
            bin.display()
        ),
    }
}
