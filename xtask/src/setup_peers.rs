//! The tunnel bench's strongest peers, built by `cargo xtask bench tunnel` itself
//! (or ahead of it by `cargo xtask setup --bench-peers`; the default setup and CI skip them)
//! into `~/.cache/bufscope-peers`, for the bench only (no test uses them):
//!
//! - upstream wireguard-go, built offline from the snapshot in
//!   `xtask/src/bench/tunnel/peers/` (its public repository at [`WIREGUARD_GO_COMMIT`], with
//!   golang.org/x/{crypto,net,sys} vendored at its go.mod versions from their own repositories;
//!   see the README there) with Debian's `golang-1.23-go` from bookworm-backports, fetched
//!   with a private `APT_CONFIG` and unpacked into the cache ([`crate::apt`]; nothing under
//!   the host's `/etc/apt` changes and nothing is installed);
//! - boringtun-cli [`BORINGTUN_CLI_VERSION`] with `cargo install --locked`.
//!
//! Each step checks first whether it is done. A peer that cannot be built is reported and
//! skipped: the bench then leaves its row out and says so.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

use crate::apt::PrivateApt;
use crate::util::{run_cmd, workspace_root};

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
/// Its standard library's sources.
const GO_SRC_PACKAGE: &str = "golang-1.23-src";
const GO_SUITE: &str = "bookworm-backports";
/// Where the two packages are unpacked, under [`cache_dir`] ...
const GO_PREFIX: &str = "golang-1.23";
/// ... and the GOROOT inside.
const GO_ROOT: &str = "usr/lib/go-1.23";

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

/// Debian's Go toolchain, unpacked (not installed) into the cache through the private APT
/// configuration ([`crate::apt`]): the host's `/etc/apt` and its installed packages stay as
/// they are. Returns the `go` binary.
fn ensure_go() -> anyhow::Result<PathBuf> {
    let go = go_root().join("bin/go");
    if Command::new(&go)
        .arg("version")
        .env("GOROOT", go_root())
        .env("GOTOOLCHAIN", "local")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Ok(go);
    }
    let cache = cache_dir();
    let apt = PrivateApt::open(&cache.join("apt"))?;
    let prefix = cache.join(GO_PREFIX);
    let _ = std::fs::remove_dir_all(&prefix);
    // Both from bookworm-backports (the -src package holds the standard library's sources,
    // which /usr/lib/go-1.23/src links to).
    let packages = [GO_PACKAGE, GO_SRC_PACKAGE].map(|p| format!("{p}/{GO_SUITE}"));
    apt.fetch_unpacked(&packages, &cache.join("go-debs"), &prefix)
        .with_context(|| format!("fetching {GO_PACKAGE} from {GO_SUITE}"))?;
    if !go.exists() {
        bail!("{} is not in the unpacked {GO_PACKAGE}", go.display());
    }
    Ok(go)
}

/// The unpacked Go toolchain's GOROOT.
fn go_root() -> PathBuf {
    cache_dir().join(GO_PREFIX).join(GO_ROOT)
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
    let go = ensure_go()?;
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
        Command::new(go)
            .current_dir(build.join("wireguard-go"))
            .env("GOROOT", go_root())
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
