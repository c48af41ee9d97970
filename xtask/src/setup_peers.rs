//! The tunnel bench's strongest peers (issue 17), built by `cargo xtask bench tunnel` itself
//! (or ahead of it by `cargo xtask setup --bench-peers`; the default setup and CI skip them)
//! into `~/.cache/bufscope-peers`, for the bench only (no test uses them):
//!
//! - upstream wireguard-go, built offline from the snapshot in
//!   `xtask/src/bench/tunnel/peers/` (its public repository at [`WIREGUARD_GO_COMMIT`], with
//!   golang.org/x/{crypto,net,sys} vendored at its go.mod versions from their own repositories;
//!   see the README there) with Debian's `golang-1.23-go` from bookworm-backports;
//! - boringtun-cli [`BORINGTUN_CLI_VERSION`] with `cargo install --locked`.
//!
//! Each step checks first whether it is done. A peer that cannot be built is reported and
//! skipped: the bench then leaves its row out and says so.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

use crate::util::{is_root, run_cmd, workspace_root};

/// wireguard-go's version (its `version.go`) at [`WIREGUARD_GO_COMMIT`].
pub const WIREGUARD_GO_VERSION: &str = "0.0.20250522";
/// The commit of github.com/WireGuard/wireguard-go the snapshot was taken from.
pub const WIREGUARD_GO_COMMIT: &str = "f333402bd9cbe0f3eeb02507bd14e23d7d639280";
/// boringtun-cli from crates.io.
pub const BORINGTUN_CLI_VERSION: &str = "0.7.1";

/// The snapshot (source and vendored modules), relative to the workspace root.
const SNAPSHOT: &str = "xtask/src/bench/tunnel/peers/wireguard-go-0.0.20250522-vendored.tar.gz";
/// Debian's Go toolchain for it, from bookworm-backports (wireguard-go's go.mod says go 1.23.1).
const GO_PACKAGE: &str = "golang-1.23-go";
const GO: &str = "/usr/lib/go-1.23/bin/go";
/// apt source added for [`GO_PACKAGE`] when bookworm-backports is not configured.
const BACKPORTS_SOURCE: &str = "/etc/apt/sources.list.d/bufscope-bookworm-backports.sources";

/// Where the peers are cached.
pub fn cache_dir() -> PathBuf {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    Path::new(&home).join(".cache/bufscope-peers")
}

/// The upstream wireguard-go binary.
pub fn wireguard_go() -> PathBuf {
    cache_dir().join(format!("wireguard-go-{WIREGUARD_GO_VERSION}/wireguard-go"))
}

/// The boringtun-cli binary.
pub fn boringtun_cli() -> PathBuf {
    cache_dir().join(format!(
        "boringtun-cli-{BORINGTUN_CLI_VERSION}/bin/boringtun-cli"
    ))
}

/// Builds whichever peer is missing; failures are reported, not returned (bench-only).
pub fn ensure() {
    if let Err(e) = ensure_boringtun_cli() {
        eprintln!("xtask setup: boringtun-cli (tunnel bench only) not built: {e:#}");
    }
    if let Err(e) = ensure_wireguard_go() {
        eprintln!("xtask setup: upstream wireguard-go (tunnel bench only) not built: {e:#}");
    }
}

fn version_of(bin: &Path) -> Option<String> {
    let out = Command::new(bin).arg("--version").output().ok()?;
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ensure_boringtun_cli() -> anyhow::Result<()> {
    if version_of(&boringtun_cli()).is_some_and(|v| v.contains(BORINGTUN_CLI_VERSION)) {
        return Ok(());
    }
    let root = cache_dir().join(format!("boringtun-cli-{BORINGTUN_CLI_VERSION}"));
    run_cmd(
        Command::new("cargo")
            .args(["install", "boringtun-cli", "--locked", "--version"])
            .arg(BORINGTUN_CLI_VERSION)
            .arg("--root")
            .arg(&root),
    )
    .context("cargo install boringtun-cli")
}

fn ensure_go() -> anyhow::Result<()> {
    if Path::new(GO).exists() {
        return Ok(());
    }
    if !is_root() {
        bail!("{GO_PACKAGE} is missing: run `cargo xtask setup` as root");
    }
    let sources = std::fs::read_dir("/etc/apt/sources.list.d")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                .any(|t| t.contains("bookworm-backports"))
        })
        .unwrap_or(false)
        || std::fs::read_to_string("/etc/apt/sources.list")
            .is_ok_and(|t| t.contains("bookworm-backports"));
    if !sources {
        std::fs::write(
            BACKPORTS_SOURCE,
            "# Added by `cargo xtask setup` (xtask/src/setup_peers.rs): golang-1.23-go for the\n\
             # tunnel bench's upstream wireguard-go build.\n\
             Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\n\
             Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
        )
        .with_context(|| format!("writing {BACKPORTS_SOURCE}"))?;
    }
    run_cmd(Command::new("apt-get").args(["update", "-qq"]))?;
    run_cmd(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(["-t", "bookworm-backports", GO_PACKAGE]),
    )
}

fn ensure_wireguard_go() -> anyhow::Result<()> {
    let bin = wireguard_go();
    if version_of(&bin).is_some_and(|v| v.contains(WIREGUARD_GO_VERSION)) {
        return Ok(());
    }
    let snapshot = workspace_root().join(SNAPSHOT);
    if !snapshot.exists() {
        bail!("the source snapshot {} is missing", snapshot.display());
    }
    ensure_go()?;
    let cache = cache_dir();
    let build = cache.join("build");
    let _ = std::fs::remove_dir_all(&build);
    std::fs::create_dir_all(&build).with_context(|| format!("creating {}", build.display()))?;
    run_cmd(
        Command::new("tar")
            .arg("-xzf")
            .arg(&snapshot)
            .arg("-C")
            .arg(&build),
    )?;
    let dir = bin.parent().context("binary path has no parent")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // Offline: the vendored modules only, no proxy, no toolchain download.
    run_cmd(
        Command::new(GO)
            .current_dir(build.join("wireguard-go"))
            .env("GOTOOLCHAIN", "local")
            .env("GOFLAGS", "-mod=vendor")
            .env("GOPROXY", "off")
            .env("GOCACHE", cache.join("go-build"))
            .env("GOPATH", cache.join("gopath"))
            .args(["build", "-trimpath", "-o"])
            .arg(&bin)
            .arg("."),
    )
    .context("go build of wireguard-go")?;
    let _ = std::fs::remove_dir_all(&build);
    match version_of(&bin) {
        Some(v) if v.contains(WIREGUARD_GO_VERSION) => Ok(()),
        v => bail!("{} --version says {v:?}", bin.display()),
    }
}
