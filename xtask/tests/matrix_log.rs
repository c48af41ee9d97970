//! The kernel matrix's output survives a redirect to a file: QEMU opens the consoles it is
//! given by path, which truncates a regular file, so the matrix must hand the guests pipes of
//! its own and echo what they print.
//!
//! No guest is booted: a stand-in for virtme-ng (`BUFSCOPE_MATRIX_VNG`) opens its stdout and
//! stderr by path as QEMU does (`/proc/self/fd/{1,2}`, truncating a regular file) and prints
//! what a guest running the matrix's script prints: the guest's `bufscope check` (here the
//! offline one from the same kernel's BTF, so the matrix's own comparison holds), one line per
//! step of the script, the end.
#![allow(clippy::unwrap_used)]

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::process::{Command, Stdio};

/// The stand-in for `vng`: takes vng's arguments (`--run <vmlinuz> --exec "sh <script>"`).
const FAKE_VNG: &str = r#"#!/bin/sh
# As QEMU does: the consoles opened by path (a regular file there is truncated).
exec 3>/proc/self/fd/1 4>/proc/self/fd/2
while [ $# -gt 0 ]; do
  case "$1" in
    --run) vmlinuz=$2; shift ;;
    --exec) script=${2#sh }; shift ;;
  esac
  shift
done
# kernels/<image>_<version>/root/boot/vmlinuz-* beside kernels/<image>_<version>/btf
btf=$(dirname "$(dirname "$(dirname "$vmlinuz")")")/btf
echo "[    0.000000] Linux version (a stand-in for $vmlinuz)" >&4
{
  echo "MATRIX BEGIN stand-in"
  echo "MATRIX CHECK-BEGIN"
  "$BUFSCOPE_BIN" check --btf "$btf"
  echo "MATRIX CHECK-END rc=$?"
  sed -n "s/^.*step '\(.*\)' env .*$//p" "$script" | sed "s/'\\''/'/g" |
    while IFS= read -r name; do echo "MATRIX STEP rc=0 secs=0 name=$name"; done
  echo "MATRIX END secs=0"
} >&3
"#;

/// The kernel the test boots: 6.1 when pinned (the quickest guest), else the first pin.
fn kernel() -> String {
    let pins = include_str!("../src/matrix/kernels.pin");
    let names: Vec<&str> = pins
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    names
        .iter()
        .find(|n| **n == "6.1")
        .or(names.first())
        .expect("kernels.pin names a kernel")
        .to_string()
}

#[test]
#[ignore = "needs root and the cached guest kernels (cargo xtask setup): run via cargo xtask test"]
fn matrix_output_redirected_to_a_file_keeps_every_byte() {
    let k = kernel();
    let dir = std::env::temp_dir();
    let fake = dir.join(format!("xtask-fake-vng-{}", std::process::id()));
    std::fs::write(&fake, FAKE_VNG).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bufscope =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/bufscope");
    let path = dir.join(format!("xtask-matrix-log-{}.txt", std::process::id()));
    let marker = format!("MARKER written before the matrix ({})\n", path.display());
    // `cargo xtask matrix > file 2>&1`: one open file (not O_APPEND), both streams on it.
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(marker.as_bytes()).unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args([
            "matrix",
            "--no-build",
            "--kernel",
            &k,
            "--step",
            "check: hooks",
        ])
        .env("BUFSCOPE_MATRIX_VNG", &fake)
        .env("BUFSCOPE_BIN", &bufscope)
        .stdin(Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .status()
        .unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    let nuls = bytes.iter().filter(|b| **b == 0).count();
    let first_nul = bytes.iter().position(|b| *b == 0);
    let tail: String = text
        .lines()
        .rev()
        .take(40)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        bytes.starts_with(marker.as_bytes()),
        "the line written before the matrix is gone; the file starts with {:?}",
        &text[..text.len().min(200)]
    );
    assert_eq!(
        nuls,
        0,
        "{nuls} NUL bytes in {} (the first at byte {first_nul:?}): the log was truncated under \
         the writers",
        path.display()
    );
    // Every stage of the run is in the file: the host's offline check, the guest's lines with
    // their prefix, and the closing table.
    for want in [
        format!("[{k}] host: bufscope check --btf"),
        format!("[{k}] MATRIX BEGIN"),
        format!("[{k}] [    0.000000] Linux version"),
        format!("[{k}] MATRIX END"),
        "== kernel matrix (".to_string(),
    ] {
        assert!(
            text.contains(&want),
            "no {want:?} in the log; its end:\n{tail}"
        );
    }
    assert!(
        status.success(),
        "cargo xtask matrix failed ({status}); its end:\n{tail}"
    );
    std::fs::remove_file(&path).unwrap();
    std::fs::remove_file(&fake).unwrap();
}
