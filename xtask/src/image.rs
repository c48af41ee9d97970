//! `cargo xtask image`: the container image of the DaemonSet (`Dockerfile`, stage `prebuilt`)
//! built by podman from a release build on this host (without the default features: no
//! terminal UI for `bufscope top`, see [`crate::build::build_image_binary`]), tagged
//! `localhost/bufscope:dev` and `localhost/bufscope:<version>`.
//!
//! [`setup`] (part of `cargo xtask setup`) makes a Debian 12 machine able to build and run it,
//! rootful: podman 4.3 with runc (crun 1.8 refuses hybrid cgroup hierarchies: "cgroups in
//! hybrid mode not supported"), mmdebstrap, busybox-static (the stand-in for the seccomp
//! component's init-container image in integration/tests/image.rs), a containers.conf drop-in
//! owned by this project ([`DROP_IN`]; no other containers configuration is touched), and a
//! Debian 12 base image made locally ([`LOCAL_BASE`]), for machines that reach no registry.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

use bufscope_testkit::cmd_output;

use crate::util::{is_root, run_cmd, workspace_root};

/// The development tag.
pub const TAG_DEV: &str = "localhost/bufscope:dev";

/// The Debian 12 base made here: glibc, libgcc_s and CA certificates, nothing else (what
/// distroless/cc-debian12 holds for a Rust binary). integration/tests/image.rs builds on it.
pub const LOCAL_BASE: &str = "localhost/bufscope-base:bookworm";

/// Debian packages of the recipe that the local base image is made with.
const BASE_PACKAGES: &str = "libc6,libgcc-s1,ca-certificates";

/// The containers.conf drop-in this project owns (read after /etc/containers/containers.conf).
pub const DROP_IN: &str = "/etc/containers/containers.conf.d/50-bufscope.conf";

/// Debian packages and one file each installs (how we tell it is installed).
const PACKAGES: &[(&str, &str)] = &[
    ("podman", "/usr/bin/podman"),
    // Installed in the same transaction as podman, so apt takes it for podman's `crun | runc`.
    ("runc", "/usr/sbin/runc"),
    ("mmdebstrap", "/usr/bin/mmdebstrap"),
    ("busybox-static", "/bin/busybox"),
];

/// Arguments of `cargo xtask image`.
#[derive(clap::Args)]
pub struct Args {
    /// Base image of the runtime stage: any image with glibc >= 2.36 and libgcc_s (default: the
    /// Dockerfile's, gcr.io/distroless/cc-debian12).
    #[arg(long, conflicts_with = "local_base")]
    pub base: Option<String>,
    /// Use the Debian 12 base made on this machine (localhost/bufscope-base:bookworm, by
    /// mmdebstrap; `cargo xtask setup` makes it), where no registry is reachable.
    #[arg(long)]
    pub local_base: bool,
}

/// Builds the release binary and the image.
pub fn run(a: &Args) -> anyhow::Result<()> {
    crate::toolchain::ensure()?;
    if !Path::new("/usr/bin/podman").exists() {
        bail!("podman is not installed: run `cargo xtask setup` as root");
    }
    crate::build::build_image_binary()?;
    let base = if a.local_base {
        ensure_local_base()?;
        Some(LOCAL_BASE.to_string())
    } else {
        a.base.clone()
    };
    let version = format!("localhost/bufscope:{}", env!("CARGO_PKG_VERSION"));
    let mut c = Command::new("podman");
    c.current_dir(workspace_root())
        .args(["build", "--target", "prebuilt", "--tag", TAG_DEV, "--tag"])
        .arg(&version);
    if let Some(b) = &base {
        c.arg("--build-arg").arg(format!("BASE={b}"));
    }
    c.arg(".");
    run_cmd(&mut c).context(
        "podman build failed; where the base image cannot be pulled (no registry), use \
         --local-base (a Debian 12 base made here by `cargo xtask setup`)",
    )?;
    let size = cmd_output(Command::new("podman").args([
        "image",
        "inspect",
        "--format",
        "{{.Size}}",
        TAG_DEV,
    ]))?;
    let mb = size.parse::<f64>().map(|b| b / 1e6).unwrap_or(f64::NAN);
    eprintln!(
        "xtask image: {TAG_DEV} and {version} ({mb:.1} MB, base {})",
        base.as_deref().unwrap_or("gcr.io/distroless/cc-debian12")
    );
    Ok(())
}

/// `cargo xtask setup`'s part: packages, the drop-in, the local base image. Idempotent.
pub fn setup() -> anyhow::Result<()> {
    ensure_packages()?;
    ensure_drop_in()?;
    let runtime =
        cmd_output(Command::new("podman").args(["info", "--format", "{{.Host.OCIRuntime.Name}}"]))?;
    if runtime != "runc" {
        bail!(
            "podman uses the OCI runtime {runtime:?}, not runc ({DROP_IN} sets runc; a \
             containers.conf read after it overrides it)"
        );
    }
    ensure_local_base()
}

fn ensure_packages() -> anyhow::Result<()> {
    crate::packages::apt_install(
        &crate::packages::missing_packages(PACKAGES),
        "run `cargo xtask setup` as root",
    )
}

/// The hard limit of resource `res` of this process (what a container may be given).
fn hard_limit(res: libc::__rlimit_resource_t) -> anyhow::Result<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct it is handed.
    if unsafe { libc::getrlimit(res, &mut r) } != 0 {
        return Err(std::io::Error::last_os_error()).context("getrlimit");
    }
    Ok(r.rlim_max)
}

/// The drop-in's text for this machine.
fn drop_in_text() -> anyhow::Result<String> {
    // podman's default ulimits (nofile 1048576) are above the hard limits of these machines
    // (nofile 20000): runc then fails with "error setting rlimits for ready process".
    let nofile = hard_limit(libc::RLIMIT_NOFILE)?.min(1_048_576);
    let nproc = hard_limit(libc::RLIMIT_NPROC)?.min(32_768);
    Ok(format!(
        "# Written by bufscope's `cargo xtask setup` (xtask/src/image.rs), which rewrites it when it\n\
         # differs; other containers configuration is left alone.\n\
         [containers]\n\
         # podman's defaults are above this machine's hard limits: runc refuses to start containers.\n\
         default_ulimits = [\"nofile={nofile}:{nofile}\", \"nproc={nproc}:{nproc}\"]\n\
         \n\
         [engine]\n\
         # crun 1.8 refuses hybrid cgroup hierarchies (\"cgroups in hybrid mode not supported\").\n\
         runtime = \"runc\"\n"
    ))
}

fn ensure_drop_in() -> anyhow::Result<()> {
    let want = drop_in_text()?;
    if std::fs::read_to_string(DROP_IN).is_ok_and(|t| t == want) {
        return Ok(());
    }
    if !is_root() {
        bail!("{DROP_IN} is missing or out of date: run `cargo xtask setup` as root");
    }
    let path = Path::new(DROP_IN);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, want).with_context(|| format!("writing {DROP_IN}"))?;
    eprintln!("xtask setup: wrote {DROP_IN}");
    Ok(())
}

/// Makes [`LOCAL_BASE`] unless podman has it: mmdebstrap (Debian's packages, no registry)
/// into a tarball, `podman import`.
pub fn ensure_local_base() -> anyhow::Result<()> {
    if Command::new("podman")
        .args(["image", "exists", LOCAL_BASE])
        .status()
        .is_ok_and(|s| s.success())
    {
        return Ok(());
    }
    let dir = TempDir::new("bufscope-base")?;
    let tar = dir.0.join("base.tar");
    run_cmd(
        Command::new("mmdebstrap")
            .args(["--mode=chrootless", "--variant=custom", "--quiet"])
            .arg(format!("--include={BASE_PACKAGES}"))
            .arg("bookworm")
            .arg(&tar),
    )
    .context("mmdebstrap of the local base image failed (it needs Debian's package mirror)")?;
    run_cmd(
        Command::new("podman")
            .arg("import")
            .arg("--change")
            .arg(format!(
                "LABEL org.opencontainers.image.description=\"Debian 12: {BASE_PACKAGES} (mmdebstrap, cargo xtask setup)\""
            ))
            .arg(&tar)
            .arg(LOCAL_BASE),
    )
}

/// A directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(prefix: &str) -> anyhow::Result<Self> {
        let p = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
        Ok(Self(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
