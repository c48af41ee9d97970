//! `cargo xtask dist`: what an operator of a plain gateway installs (docs/packages.md), for each
//! architecture whose toolchain is here:
//!
//! - `bufscope-<version>-<arch>-linux` and `bufscope-tunnel-<version>-<arch>-linux`: statically
//!   linked (musl, no interpreter, no shared library; the BPF object embedded as in every build),
//!   stripped;
//! - a `.deb` (cargo-deb) and an `.rpm` (cargo-generate-rpm) of each, with the systemd units,
//!   tmpfiles.d, sysusers.d, configuration and scripts of `packaging/`;
//! - a CycloneDX SBOM of each binary (cargo-cyclonedx: every crate of Cargo.lock in its build for
//!   that target), also shipped in its packages under `/usr/share/doc/<name>/`;
//! - `SHA256SUMS` of all of them (`sha256sum -c SHA256SUMS`).
//!
//! Static linking is the musl target of rustup (`x86_64-unknown-linux-musl`): Rust's musl targets
//! link statically by default and carry their own C runtime, so the binary runs on any glibc (or
//! none) of the supported kernels; ring's C and assembly are compiled by Debian's `musl-gcc`.
//! glibc with `+crt-static` was not chosen: glibc's static libc still loads NSS modules of the
//! host's glibc version at run time for name lookups (`--web.listen-address localhost:9477`), the
//! very version coupling a static binary is meant to remove.
//!
//! [`setup`] (part of `cargo xtask setup`) installs what is missing: the pinned packaging tools
//! (`cargo install --locked`), the rustup target, and the Debian packages.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

use crate::util::{cargo, run_cmd, workspace_root};

/// The packaging tools, pinned: crate, version, and the cargo subcommand it provides.
pub const TOOLS: &[(&str, &str, &str)] = &[
    ("cargo-deb", "3.8.0", "deb"),
    ("cargo-generate-rpm", "0.21.1", "generate-rpm"),
    ("cargo-cyclonedx", "0.5.9", "cyclonedx"),
];

/// Debian packages `dist` and its tests use, and one file each installs: `musl-gcc` (ring's C for
/// the musl target), binutils (`strip`, `readelf`), `rpm` (`rpm -qp` checks the `.rpm`s on this
/// Debian host), systemd (`systemd-analyze verify` and `security` of the units), mmdebstrap (the
/// Debian 12 test image with systemd, [`SYSTEMD_IMAGE`]).
const PACKAGES: &[(&str, &str)] = &[
    ("musl-tools", "/usr/bin/musl-gcc"),
    ("binutils", "/usr/bin/readelf"),
    ("rpm", "/usr/bin/rpm"),
    ("systemd", "/usr/bin/systemd-analyze"),
    ("mmdebstrap", "/usr/bin/mmdebstrap"),
];

/// Debian packages of the aarch64 cross toolchain (linker, C compiler for ring, strip) and QEMU's
/// user-mode emulator, which runs the built binaries' `--version` here.
const AARCH64_PACKAGES: &[(&str, &str)] = &[
    ("gcc-aarch64-linux-gnu", "/usr/bin/aarch64-linux-gnu-gcc"),
    // The C headers ring's C includes (stdint.h, string.h: the same types on musl).
    (
        "libc6-dev-arm64-cross",
        "/usr/aarch64-linux-gnu/include/stdint.h",
    ),
    (
        "binutils-aarch64-linux-gnu",
        "/usr/bin/aarch64-linux-gnu-strip",
    ),
    ("qemu-user-static", "/usr/bin/qemu-aarch64-static"),
];

/// A clean Debian 12 with systemd as its init, made here by mmdebstrap (no registry is needed):
/// what the packages are installed into by the tests (xtask/tests/dist.rs).
pub const SYSTEMD_IMAGE: &str = "localhost/bufscope-systemd:bookworm";

/// Debian packages of [`SYSTEMD_IMAGE`] (minbase + these): an init, and what a gateway has.
const SYSTEMD_IMAGE_PACKAGES: &str = "systemd,systemd-sysv,dbus,iproute2,procps";

/// The binaries `dist` ships: Cargo package, binary name.
pub const BINARIES: &[(&str, &str)] = &[
    ("bufscope", "bufscope"),
    ("bufscope-tunnel", "bufscope-tunnel"),
];

/// An architecture `dist` builds for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Arch {
    /// x86_64-unknown-linux-musl (.deb amd64, .rpm x86_64).
    X86_64,
    /// aarch64-unknown-linux-musl (.deb arm64, .rpm aarch64), with Debian's cross gcc.
    Aarch64,
}

impl Arch {
    /// The Rust target.
    pub fn triple(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64-unknown-linux-musl",
            Arch::Aarch64 => "aarch64-unknown-linux-musl",
        }
    }

    /// The name in artifact file names (and the RPM architecture).
    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }

    /// The cross `gcc` that links and compiles C for this target (`None`: the host's tools).
    fn cross_gcc(self) -> Option<&'static str> {
        match self {
            Arch::X86_64 => None,
            Arch::Aarch64 => Some("aarch64-linux-gnu-gcc"),
        }
    }

    fn strip(self) -> &'static str {
        match self {
            Arch::X86_64 => "strip",
            Arch::Aarch64 => "aarch64-linux-gnu-strip",
        }
    }
}

/// Arguments of `cargo xtask dist`.
#[derive(clap::Args)]
pub struct Args {
    /// Where the artifacts go (emptied first; default target/dist).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Architectures to build (default x86_64); repeatable. aarch64 needs Debian's
    /// gcc-aarch64-linux-gnu and rustup's aarch64-unknown-linux-musl (`cargo xtask setup
    /// --aarch64`).
    #[arg(long = "arch", value_enum)]
    pub arches: Vec<Arch>,
    /// Package revision (the .deb's `-N`, the .rpm's release): a rebuild of the same version
    /// that must upgrade an installed one gets a higher revision.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub revision: u32,
    /// Skip `cargo xtask setup` (the tools are known to be there).
    #[arg(long)]
    pub no_setup: bool,
}

/// `cargo xtask dist`.
pub fn run(a: &Args) -> anyhow::Result<()> {
    let arches = if a.arches.is_empty() {
        vec![Arch::X86_64]
    } else {
        a.arches.clone()
    };
    if !a.no_setup {
        crate::toolchain::ensure()?;
        setup_tools(arches.contains(&Arch::Aarch64))?;
    }
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| workspace_root().join("target/dist"));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let out = out
        .canonicalize()
        .with_context(|| format!("resolving {}", out.display()))?;
    let mut artifacts = Vec::new();
    for arch in arches {
        artifacts.extend(build_arch(arch, a.revision, &out)?);
    }
    let sums = sha256sums(&out, &artifacts)?;
    eprintln!("xtask dist: in {}:\n{sums}", out.display());
    Ok(())
}

/// The static binaries of `arch` (built, stripped, checked), then its SBOMs and packages;
/// the file names written into `out`.
fn build_arch(arch: Arch, revision: u32, out: &Path) -> anyhow::Result<Vec<String>> {
    build_static(arch)?;
    let version = env!("CARGO_PKG_VERSION");
    let bin_dir = target_dir(arch);
    for (_, bin) in BINARIES {
        let path = bin_dir.join(bin);
        run_cmd(Command::new(arch.strip()).arg(&path))?;
        check_static(&path)?;
        let mut run = match arch {
            Arch::X86_64 => Command::new(&path),
            Arch::Aarch64 => {
                let mut c = Command::new("qemu-aarch64-static");
                c.arg(&path);
                c
            }
        };
        let v = output_of(run.arg("--version"))
            .with_context(|| format!("{} --version failed", path.display()))?;
        if !v.contains(version) {
            bail!("{} --version says {v:?}, not {version}", path.display());
        }
    }
    // Before the packages: they ship the SBOMs too.
    sboms(arch)?;
    let mut names = Vec::new();
    for (package, bin) in BINARIES {
        let name = format!("{bin}-{version}-{}-linux", arch.name());
        std::fs::copy(bin_dir.join(bin), out.join(&name))
            .with_context(|| format!("copying {bin}"))?;
        std::fs::copy(
            bin_dir.join(format!("{bin}.cdx.json")),
            out.join(format!("{name}.cdx.json")),
        )?;
        names.push(name.clone());
        names.push(format!("{name}.cdx.json"));
        names.push(deb(package, arch, revision, out)?);
        names.push(rpm(package, arch, revision, out)?);
    }
    Ok(names)
}

/// `target/<triple>/release`.
pub fn target_dir(arch: Arch) -> PathBuf {
    workspace_root()
        .join("target")
        .join(arch.triple())
        .join("release")
}

/// `cargo build --release --target <musl>` of the shipped binaries (default features: the
/// package includes `bufscope top` for SSH sessions on the gateway).
pub fn build_static(arch: Arch) -> anyhow::Result<()> {
    let mut c = cargo();
    c.args(["build", "--release", "--locked", "--bins", "--target"])
        .arg(arch.triple());
    for (p, _) in BINARIES {
        c.args(["-p", p]);
    }
    let var = arch.triple().replace('-', "_");
    match arch.cross_gcc() {
        None => {
            c.env(format!("CC_{var}"), "musl-gcc");
        }
        Some(gcc) => {
            c.env(format!("CC_{var}"), gcc)
                .env(format!("CARGO_TARGET_{}_LINKER", var.to_uppercase()), gcc);
        }
    }
    run_cmd(&mut c).with_context(|| {
        format!(
            "the static build for {} failed: `cargo xtask setup` installs its target and tools",
            arch.triple()
        )
    })
}

/// Fails unless `bin` is statically linked: no `PT_INTERP` (the dynamic loader) and no
/// `DT_NEEDED` (a shared library), as `readelf` reads them.
pub fn check_static(bin: &Path) -> anyhow::Result<()> {
    let headers = output_of(Command::new("readelf").args(["-l", "-d", "-W"]).arg(bin))
        .with_context(|| format!("readelf {}", bin.display()))?;
    if let Some(l) = headers
        .lines()
        .find(|l| l.contains("INTERP") || l.contains("(NEEDED)"))
    {
        bail!("{} is not statically linked: {}", bin.display(), l.trim());
    }
    Ok(())
}

/// `cargo cyclonedx` for `arch`'s target: one SBOM per binary of the workspace, each listing
/// every crate of Cargo.lock its build for that target takes (normal dependencies with scope
/// `required`; build dependencies, the BPF object's crates among them, `excluded`). The shipped
/// binaries' are moved to `target/<triple>/release/<bin>.cdx.json` (where the packages take them
/// from); the tool writes one next to every member's Cargo.toml, and the others are removed.
fn sboms(arch: Arch) -> anyhow::Result<()> {
    let root = workspace_root();
    let written = || -> Vec<PathBuf> {
        let mut found = Vec::new();
        for dir in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            for f in std::fs::read_dir(dir.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                if f.file_name().to_string_lossy().ends_with("_bin.cdx.json") {
                    found.push(f.path());
                }
            }
        }
        found
    };
    for f in written() {
        let _ = std::fs::remove_file(f);
    }
    // Writing (and removing) a file in a member's directory changes the directory's mtime, and
    // exporter/build.rs reruns (rebuilding the BPF object and the exporter) when the BPF
    // crate's directory changed: the members' directories get their times back afterwards.
    let times: Vec<(PathBuf, std::time::SystemTime)> = std::fs::read_dir(&root)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join("Cargo.toml").exists())
        .filter_map(|e| Some((e.path(), e.metadata().ok()?.modified().ok()?)))
        .collect();
    let ran = run_cmd(
        cargo()
            .args([
                "cyclonedx",
                "--quiet",
                "--format",
                "json",
                "--spec-version",
                "1.5",
            ])
            .args(["--describe", "binaries", "--all", "--target"])
            .arg(arch.triple())
            .arg("--manifest-path")
            .arg(root.join("exporter/Cargo.toml"))
            // Reproducible: no random serial number.
            .env("SOURCE_DATE_EPOCH", source_date_epoch()),
    );
    let mut moved = Ok(());
    if ran.is_ok() {
        for (package, bin) in BINARIES {
            let from = root
                .join(package_dir(package))
                .join(format!("{bin}_bin.cdx.json"));
            let to = target_dir(arch).join(format!("{bin}.cdx.json"));
            if let Err(e) = keep_built_crates(&from, &to, package, arch) {
                moved = Err(e.context(format!("the SBOM of {bin}")));
            }
        }
    }
    // Nothing of it stays in the source tree.
    for f in written() {
        let _ = std::fs::remove_file(f);
    }
    for (dir, mtime) in times {
        if let Ok(d) = std::fs::File::open(&dir) {
            let _ = d.set_modified(mtime);
        }
    }
    ran.and(moved)
}

/// Writes the SBOM `from` to `to` with only the crates that `package`'s build for `arch` takes.
///
/// cargo-cyclonedx (0.5.9) resolves features as `cargo metadata` does, for the whole workspace
/// at once, so it also lists crates that only another member's features pull in (the tests'
/// and benchmarks'): 19 of the 201 it lists for `bufscope`, 21 of 144 for `bufscope-tunnel`
/// (measured when this was written; the SBOM's properties say how many each time). Cargo itself
/// says what this build takes: `cargo tree -p <package> --target <triple> -e normal,build`.
/// Components outside that set, and their dependency edges, are removed; the rest is the tool's
/// output as it was (its scopes: `required` for linked crates, `excluded` for build-only ones).
fn keep_built_crates(from: &Path, to: &Path, package: &str, arch: Arch) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(from).with_context(|| format!("reading {}", from.display()))?;
    let mut bom: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", from.display()))?;
    let tree = output_of(
        cargo()
            .args(["tree", "--locked", "-p", package, "--target", arch.triple()])
            .args(["-e", "normal,build", "--prefix", "none", "--format", "{p}"]),
    )
    .context("cargo tree")?;
    let built: std::collections::BTreeSet<(String, String)> = tree
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((
                w.next()?.to_string(),
                w.next()?.trim_start_matches('v').to_string(),
            ))
        })
        .collect();
    let mut removed = std::collections::BTreeSet::new();
    if let Some(comps) = bom["components"].as_array_mut() {
        comps.retain(|c| {
            let key = (
                c["name"].as_str().unwrap_or_default().to_string(),
                c["version"].as_str().unwrap_or_default().to_string(),
            );
            let keep = built.contains(&key);
            if !keep {
                removed.insert(c["bom-ref"].as_str().unwrap_or_default().to_string());
            }
            keep
        });
    }
    if let Some(deps) = bom["dependencies"].as_array_mut() {
        deps.retain(|d| !removed.contains(d["ref"].as_str().unwrap_or_default()));
        for d in deps.iter_mut() {
            if let Some(on) = d["dependsOn"].as_array_mut() {
                on.retain(|r| !removed.contains(r.as_str().unwrap_or_default()));
            }
        }
    }
    let note = serde_json::json!({
        "name": "bufscope:components",
        "value": format!(
            "the crates of `cargo tree -p {package} --target {} -e normal,build`; {} that only other workspace members' features pull in were removed",
            arch.triple(),
            removed.len()
        ),
    });
    match bom["metadata"]["properties"].as_array_mut() {
        Some(props) => props.push(note),
        None => bom["metadata"]["properties"] = serde_json::json!([note]),
    }
    let out = serde_json::to_string_pretty(&bom)?;
    std::fs::write(to, out + "\n").with_context(|| format!("writing {}", to.display()))
}

/// The directory of a shipped Cargo package.
fn package_dir(package: &str) -> &'static str {
    if package == "bufscope" {
        "exporter"
    } else {
        "tunnel"
    }
}

/// The time of the last commit (reproducible archives), or 0 outside a git checkout.
fn source_date_epoch() -> String {
    output_of(
        Command::new("git")
            .current_dir(workspace_root())
            .args(["log", "-1", "--format=%ct"]),
    )
    .filter(|s| !s.is_empty())
    .unwrap_or_else(|| "0".into())
}

/// `cargo deb` of `package` (the binary already built and stripped); its file name in `out`.
fn deb(package: &str, arch: Arch, revision: u32, out: &Path) -> anyhow::Result<String> {
    let version = env!("CARGO_PKG_VERSION");
    let deb_arch = match arch {
        Arch::X86_64 => "amd64",
        Arch::Aarch64 => "arm64",
    };
    let name = format!("{package}_{version}-{revision}_{deb_arch}.deb");
    run_cmd(
        cargo()
            .args([
                "deb",
                "--no-build",
                "--no-strip",
                "--locked",
                "--package",
                package,
            ])
            .args(["--target", arch.triple(), "--deb-revision"])
            .arg(revision.to_string())
            .arg("--output")
            .arg(out.join(&name))
            .env("SOURCE_DATE_EPOCH", source_date_epoch()),
    )?;
    Ok(name)
}

/// `cargo generate-rpm` of `package`; its file name in `out`.
fn rpm(package: &str, arch: Arch, revision: u32, out: &Path) -> anyhow::Result<String> {
    let version = env!("CARGO_PKG_VERSION");
    let name = format!("{package}-{version}-{revision}.{}.rpm", arch.name());
    run_cmd(
        cargo()
            .args(["generate-rpm", "--package", package_dir(package)])
            .args(["--target", arch.triple(), "--arch", arch.name()])
            .arg("--target-dir")
            .arg(workspace_root().join("target"))
            .arg("--set-metadata")
            .arg(format!("release = \"{revision}\""))
            .arg("--output")
            .arg(out.join(&name))
            .env("SOURCE_DATE_EPOCH", source_date_epoch()),
    )?;
    Ok(name)
}

/// Writes `out/SHA256SUMS` (`sha256sum` of `names`, in that order) and returns it.
fn sha256sums(out: &Path, names: &[String]) -> anyhow::Result<String> {
    let o = Command::new("sha256sum")
        .current_dir(out)
        .args(names)
        .output()
        .context("sha256sum")?;
    if !o.status.success() {
        bail!("sha256sum failed: {}", String::from_utf8_lossy(&o.stderr));
    }
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    std::fs::write(out.join("SHA256SUMS"), &text)?;
    Ok(text)
}

/// `cargo xtask setup`'s part: the Debian packages, the rustup target, the pinned tools and the
/// test image. Idempotent.
pub fn setup() -> anyhow::Result<()> {
    setup_tools(false)?;
    ensure_systemd_image()
}

/// The packages, target and tools `dist` needs (`aarch64`: also its cross toolchain).
fn setup_tools(aarch64: bool) -> anyhow::Result<()> {
    let mut missing = crate::packages::missing_packages(PACKAGES);
    if aarch64 {
        missing.extend(crate::packages::missing_packages(AARCH64_PACKAGES));
    }
    crate::packages::apt_install(&missing, "`cargo xtask dist` needs them: run it as root")?;
    let mut targets = vec![Arch::X86_64.triple()];
    if aarch64 {
        targets.push(Arch::Aarch64.triple());
    }
    let installed = output_of(Command::new("rustup").args(["target", "list", "--installed"]))
        .unwrap_or_default();
    for t in targets {
        if !installed.lines().any(|l| l.trim() == t) {
            run_cmd(Command::new("rustup").args(["target", "add", t])).with_context(|| {
                format!("rustup could not add the target {t} (the static build needs its std)")
            })?;
        }
    }
    let cargo_bin = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"))
        .join("bin");
    for (krate, version, _) in TOOLS {
        let have =
            output_of(Command::new(cargo_bin.join(krate)).arg("--version")).unwrap_or_default();
        if have.split_whitespace().any(|w| w == *version) {
            continue;
        }
        run_cmd(
            cargo()
                .args(["install", "--locked", krate, "--version"])
                .arg(version),
        )
        .with_context(|| format!("cargo install {krate} {version}"))?;
    }
    Ok(())
}

/// Makes [`SYSTEMD_IMAGE`] unless podman has it: mmdebstrap of Debian 12 (minbase + systemd as
/// init) into a tarball, `podman import` with `/sbin/init` as its command.
fn ensure_systemd_image() -> anyhow::Result<()> {
    if Command::new("podman")
        .args(["image", "exists", SYSTEMD_IMAGE])
        .status()
        .is_ok_and(|s| s.success())
    {
        return Ok(());
    }
    let dir = std::env::temp_dir().join(format!("bufscope-systemd-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let tar = dir.join("rootfs.tar");
    let made = run_cmd(
        Command::new("mmdebstrap")
            .args(["--mode=root", "--variant=minbase", "--quiet"])
            .arg(format!("--include={SYSTEMD_IMAGE_PACKAGES}"))
            .arg("bookworm")
            .arg(&tar),
    )
    .context("mmdebstrap of the systemd test image failed (it needs Debian's package mirror)")
    .and_then(|()| {
        run_cmd(
            Command::new("podman")
                .args(["import", "--change", "CMD [\"/sbin/init\"]", "--change"])
                .arg(format!(
                    "LABEL org.opencontainers.image.description=\"Debian 12 minbase + {SYSTEMD_IMAGE_PACKAGES} (mmdebstrap, cargo xtask setup)\""
                ))
                .arg(&tar)
                .arg(SYSTEMD_IMAGE),
        )
    });
    let _ = std::fs::remove_dir_all(&dir);
    made
}

/// A command's standard output, trimmed, when it ran and succeeded.
fn output_of(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}
