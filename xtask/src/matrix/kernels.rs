//! The guest kernels: pinned in `kernels.pin`, fetched from Debian's own archive with `apt-get
//! download` through a private `APT_CONFIG` ([`crate::apt`]: the host's `/etc/apt` is never
//! touched, the backports suite exists only in that private configuration), unpacked with
//! `dpkg-deb -x` into the cache (no system install), and their BTF extracted from the
//! compressed image.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

use crate::apt::PrivateApt;
use crate::util::run_cmd;

/// The pin file (also what `--bump` rewrites).
const PINS: &str = include_str!("kernels.pin");

/// One pinned guest kernel.
#[derive(Clone, Debug)]
pub struct Pin {
    /// Short name (`6.1`): `--kernel` selects by it.
    pub name: String,
    /// Debian suite it comes from.
    pub suite: String,
    /// Meta package that `--bump` follows.
    pub meta: String,
    /// Image package.
    pub package: String,
    /// Package version.
    pub version: String,
}

/// A kernel ready to boot.
#[derive(Clone, Debug)]
pub struct Kernel {
    /// Its pin.
    pub pin: Pin,
    /// The image to boot.
    pub vmlinuz: PathBuf,
    /// Its raw BTF (the `.BTF` section of its vmlinux), for `bufscope check --btf`.
    pub btf: PathBuf,
}

fn parse(text: &str) -> anyhow::Result<Vec<Pin>> {
    let mut out = Vec::new();
    for (n, l) in text.lines().enumerate() {
        let l = l.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = l.split_whitespace().collect();
        let [name, suite, meta, package, version] = f[..] else {
            bail!("kernels.pin line {}: expected 5 fields: {l}", n + 1);
        };
        out.push(Pin {
            name: name.into(),
            suite: suite.into(),
            meta: meta.into(),
            package: package.into(),
            version: version.into(),
        });
    }
    Ok(out)
}

/// The pinned kernels.
pub fn pins() -> anyhow::Result<Vec<Pin>> {
    parse(PINS)
}

/// Where kernels, BTF, the virtme-ng venv and the private APT state live:
/// `$BUFSCOPE_CACHE_DIR`, else `$XDG_CACHE_HOME/bufscope`, else `~/.cache/bufscope`; then `vm/`.
pub fn cache_dir() -> PathBuf {
    let base = std::env::var_os("BUFSCOPE_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|x| PathBuf::from(x).join("bufscope")))
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            PathBuf::from(home).join(".cache/bufscope")
        });
    base.join("vm")
}

/// The private APT configuration under the cache ([`crate::apt`]).
fn private_apt(cache: &Path) -> anyhow::Result<PrivateApt> {
    PrivateApt::open(&cache.join("apt"))
}

/// Fetches, unpacks and extracts `pin` into the cache unless it is there already.
pub fn ensure(pin: &Pin) -> anyhow::Result<Kernel> {
    let cache = cache_dir();
    let dir = cache.join("kernels").join(format!(
        "{}_{}",
        pin.package,
        pin.version.replace(['~', ':'], "_")
    ));
    let done = dir.join(".done");
    let release = pin
        .package
        .strip_prefix("linux-image-")
        .context("pinned package is not a linux-image-* package")?;
    let vmlinuz = dir.join("root/boot").join(format!("vmlinuz-{release}"));
    let btf = dir.join("btf");
    if done.exists() && vmlinuz.exists() && btf.exists() {
        return Ok(Kernel {
            pin: pin.clone(),
            vmlinuz,
            btf,
        });
    }
    let apt = private_apt(&cache)?;
    std::fs::create_dir_all(&dir)?;
    eprintln!("xtask matrix: fetching {}={}", pin.package, pin.version);
    // The modules stay: virtme-ng puts the guest's 9p/virtio/overlay modules into its
    // initramfs from `lib/modules` beside the image.
    apt.fetch_unpacked(
        &[format!("{}={}", pin.package, pin.version)],
        &dir.join("debs"),
        &dir.join("root"),
    )?;
    extract_btf(&vmlinuz, &btf)?;
    std::fs::write(&done, b"")?;
    Ok(Kernel {
        pin: pin.clone(),
        vmlinuz,
        btf,
    })
}

/// Extracts the raw BTF of a bzImage: finds the compressed vmlinux (xz, zstd or gzip) inside,
/// decompresses it and copies its `.BTF` section out with objcopy.
pub fn extract_btf(vmlinuz: &Path, out: &Path) -> anyhow::Result<()> {
    let data = std::fs::read(vmlinuz).with_context(|| format!("reading {}", vmlinuz.display()))?;
    let formats: [(&[u8], &str); 3] = [
        (b"\xfd7zXZ\x00", "xz"),
        (b"\x28\xb5\x2f\xfd", "zstd"),
        (b"\x1f\x8b\x08", "gzip"),
    ];
    let elf = out.with_extension("vmlinux");
    for (magic, tool) in formats {
        let mut from = 0;
        while let Some(i) = find(&data[from..], magic).map(|i| i + from) {
            from = i + 1;
            let mut child = Command::new(tool)
                .arg("-dc")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .with_context(|| format!("{tool} (cargo xtask setup installs it)"))?;
            let mut stdin = child.stdin.take().context("stdin")?;
            let tail = data[i..].to_vec();
            let writer = std::thread::spawn(move || {
                use std::io::Write as _;
                // The decompressor stops at the end of its stream; a broken pipe is expected.
                let _ = stdin.write_all(&tail);
            });
            let output = child.wait_with_output()?;
            let _ = writer.join();
            // Trailing data after the stream makes the tool exit non-zero: the ELF decides.
            if output.stdout.starts_with(b"\x7fELF") {
                std::fs::write(&elf, &output.stdout)?;
                let r = run_cmd(
                    Command::new("objcopy")
                        .args(["-O", "binary", "--only-section=.BTF"])
                        .arg(&elf)
                        .arg(out),
                );
                let _ = std::fs::remove_file(&elf);
                r?;
                let len = std::fs::metadata(out)?.len();
                if len == 0 {
                    bail!("{} has no .BTF section", vmlinuz.display());
                }
                return Ok(());
            }
        }
    }
    bail!("found no compressed vmlinux in {}", vmlinuz.display())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The version `apt-cache madison` lists for `suite` (`pkg | version | mirror suite/main …`).
fn madison_version(madison: &str, suite: &str) -> Option<String> {
    let in_suite = format!(" {suite}/");
    madison
        .lines()
        .find(|l| l.split('|').nth(2).is_some_and(|s| s.contains(&in_suite)))
        .and_then(|l| l.split('|').nth(1))
        .map(|v| v.trim().to_string())
}

/// `--bump`: for every pin, the image package its meta package depends on in its suite now,
/// and that package's version there; rewrites `kernels.pin` in the source tree.
pub fn bump() -> anyhow::Result<()> {
    let apt = private_apt(&cache_dir())?;
    let mut text = PINS.to_string();
    for pin in pins()? {
        let madison = apt.cache_output(&["madison", &pin.meta])?;
        let meta_version = madison_version(&madison, &pin.suite)
            .with_context(|| format!("{} has no version in {}", pin.meta, pin.suite))?;
        let show = apt.cache_output(&["show", &format!("{}={meta_version}", pin.meta)])?;
        let package = show
            .lines()
            .find_map(|l| l.strip_prefix("Depends: "))
            .and_then(|d| d.split([',', ' ']).find(|p| p.starts_with("linux-image-")))
            .with_context(|| format!("{}={meta_version} depends on no image", pin.meta))?
            .to_string();
        let madison = apt.cache_output(&["madison", &package])?;
        let version = madison_version(&madison, &pin.suite)
            .with_context(|| format!("{package} has no version in {}", pin.suite))?;
        if package != pin.package || version != pin.version {
            eprintln!(
                "xtask matrix: {}: {} {} -> {package} {version}",
                pin.name, pin.package, pin.version
            );
            text = text
                .lines()
                .map(|l| {
                    if l.split_whitespace().next() == Some(pin.name.as_str()) {
                        format!(
                            "{:<8}{:<20}{:<24}{:<34}{version}",
                            pin.name, pin.suite, pin.meta, package
                        )
                    } else {
                        l.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n")
                + "\n";
        } else {
            eprintln!(
                "xtask matrix: {}: {} {} is current",
                pin.name, package, version
            );
        }
    }
    let path = crate::util::workspace_root().join("xtask/src/matrix/kernels.pin");
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("xtask matrix: wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_pin_file_parses() {
        let p = pins().unwrap();
        assert!(p.iter().any(|k| k.name == "6.1"));
        assert!(p.iter().all(|k| k.package.starts_with("linux-image-")));
        assert!(parse("6.1 bookworm meta pkg").is_err());
    }
}
