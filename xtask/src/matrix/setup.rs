//! What `cargo xtask setup` adds for the matrix: QEMU and the tools its guests use, virtme-ng in
//! a venv of the cache, the pinned kernels.

use std::process::Command;

use anyhow::Context as _;

use super::kernels::{self, cache_dir};
use crate::util::run_cmd;

/// virtme-ng, installed in a venv in the cache (measured with this version).
const VIRTME_NG: &str = "virtme-ng==1.42";

/// Debian packages the guests need, and one file each provides: QEMU, what virtme-ng's init
/// uses in the guest (kmod, busybox, udev: without udev the guest's output is lost), and the
/// tools that get BTF out of a kernel image.
const PACKAGES: &[(&str, &str)] = &[
    ("qemu-system-x86", "/usr/bin/qemu-system-x86_64"),
    ("kmod", "/usr/bin/kmod"),
    ("busybox-static", "/bin/busybox"),
    ("udev", "/usr/bin/udevadm"),
    ("binutils", "/usr/bin/objcopy"),
    ("xz-utils", "/usr/bin/xz"),
    ("zstd", "/usr/bin/zstd"),
];

/// What `cargo xtask setup` adds for the matrix: packages, virtme-ng, the pinned kernels.
pub fn setup() -> anyhow::Result<()> {
    let mut missing = crate::packages::missing_packages(PACKAGES);
    // `python3 -m venv` needs ensurepip, which Debian ships in python3-venv.
    let venv_ok = Command::new("python3")
        .args(["-c", "import ensurepip, venv"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !venv_ok {
        missing.push("python3-venv");
    }
    crate::packages::apt_install(&missing, "the kernel matrix needs them: run it as root")?;
    let venv = cache_dir().join("venv");
    if !venv.join("bin/vng").exists() {
        std::fs::create_dir_all(cache_dir())?;
        run_cmd(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
        run_cmd(Command::new(venv.join("bin/pip")).args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            VIRTME_NG,
        ]))
        .context("installing virtme-ng in its venv")?;
    }
    for pin in kernels::pins()? {
        kernels::ensure(&pin)?;
    }
    Ok(())
}
