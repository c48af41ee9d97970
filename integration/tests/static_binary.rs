//! The statically linked `bufscope` that `cargo xtask dist` ships (musl,
//! `target/x86_64-unknown-linux-musl/release/bufscope`, or `$BUFSCOPE_STATIC_BIN`) runs on a
//! kernel with nothing else: in a root that holds only the binary (a chroot in a mount namespace
//! of its own, with `/proc` and `/sys` mounted: no libc, no loader, no /etc), `bufscope check`
//! passes and chooses, probe by probe, the same hooks as the build under test (`BUFSCOPE_BIN`)
//! on the same kernel. Runs on the host (against the debug build the host's tests run), and in
//! the 5.10, 6.1 and 6.12 guests of `cargo xtask matrix` (whose steps all run this static
//! binary: there the same binary in the guest's full root).
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use bufscope_integration::{bufscope_bin, output, repo, require_root};

/// The target `cargo xtask dist` builds the x86_64 artifacts for.
const MUSL: &str = "x86_64-unknown-linux-musl";

/// The static binary: `$BUFSCOPE_STATIC_BIN`, else the dist build's, built here (as `cargo
/// xtask dist` builds it: both shipped binaries in one build, so the features are the same)
/// when absent. Never built inside a matrix guest: the matrix builds it before booting.
fn static_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("BUFSCOPE_STATIC_BIN") {
        return PathBuf::from(p);
    }
    let p = repo().join("target").join(MUSL).join("release/bufscope");
    if !p.exists() {
        let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        // Not what `cargo test` set for this test (build scripts that watch them, ring's, would
        // see them change between this build and `cargo xtask dist`'s, and rebuild).
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if k.starts_with("CARGO_PKG_")
                || k.starts_with("CARGO_BIN_EXE_")
                || k.starts_with("CARGO_MANIFEST_")
                || [
                    "CARGO_CRATE_NAME",
                    "CARGO_PRIMARY_PACKAGE",
                    "CARGO_TARGET_TMPDIR",
                ]
                .contains(&k.as_str())
            {
                c.env_remove(k);
            }
        }
        let status = c
            .current_dir(repo())
            .env(format!("CC_{}", MUSL.replace('-', "_")), "musl-gcc")
            .args(["build", "--release", "--locked", "--bins", "--target", MUSL])
            .args(["-p", "bufscope", "-p", "bufscope-tunnel"])
            .status()
            .unwrap();
        assert!(
            status.success(),
            "building the static bufscope failed (`cargo xtask setup` installs the musl target and musl-tools)"
        );
    }
    p
}

/// `bin args…` in a root holding nothing but `bin` (as `/bufscope`) and mounts of `/proc` and
/// `/sys`; the files of that root (mounts left out), the exit code and the output.
fn run_alone(bin: &Path, args: &[&str]) -> (String, i32, String) {
    let root = std::env::temp_dir().join(format!("bufscope-alone-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    std::fs::copy(bin, root.join("bufscope")).unwrap();
    let files = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let script = format!(
        "set -e; cd '{}'; mkdir proc sys; mount -t proc proc proc; mount --rbind /sys sys; \
         exec chroot . /bufscope {}",
        root.display(),
        args.join(" ")
    );
    let o = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&root);
    (
        files,
        o.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

/// The probe lines of `bufscope check`: probe → its line after the status.
fn probes(text: &str) -> BTreeMap<String, String> {
    let mut in_probes = false;
    let mut out = BTreeMap::new();
    for l in text.lines() {
        if l == "probes:" {
            in_probes = true;
            continue;
        }
        if !in_probes || !l.starts_with('[') {
            continue;
        }
        let Some(rest) = l.split_once("] ").map(|x| x.1) else {
            continue;
        };
        if let Some((probe, tail)) = rest.split_once(' ') {
            out.insert(probe.to_string(), format!("{} {}", &l[..6], tail.trim()));
        }
    }
    out
}

#[test]
#[ignore = "needs root (loads BPF, mounts): run via cargo xtask test"]
fn static_bufscope_runs_alone_and_check_passes() {
    require_root();
    let bin = static_bin();
    let (ok, headers, err) = output(
        Command::new("readelf").args(["-l", "-d", "-W"]).arg(&bin),
        "",
    );
    assert!(ok, "readelf: {err}");
    assert!(
        !headers.contains("INTERP") && !headers.contains("(NEEDED)"),
        "{} is not statically linked:\n{headers}",
        bin.display()
    );
    let (files, code, version) = run_alone(&bin, &["--version"]);
    assert_eq!(files, "bufscope");
    assert_eq!(code, 0, "--version alone: {version}");
    assert!(version.contains(env!("CARGO_PKG_VERSION")), "{version}");

    let (_, code, alone) = run_alone(&bin, &["check"]);
    eprintln!("the static binary alone:\n{alone}");
    assert_eq!(code, 0, "bufscope check failed in an empty root:\n{alone}");
    let (_, dynamic, _) = output(
        Command::new(bufscope_bin())
            .arg("check")
            .env("NO_COLOR", "1"),
        "",
    );
    let (want, got) = (probes(&dynamic), probes(&alone));
    assert!(!want.is_empty(), "no probe lines in:\n{dynamic}");
    assert_eq!(
        got,
        want,
        "the static binary alone chose other hooks than {}",
        bufscope_bin().display()
    );
}
