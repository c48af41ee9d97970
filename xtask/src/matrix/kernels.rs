//! The guest kernels: pinned in `kernels.pin`, fetched from Debian's own archive with `apt-get
//! download` through a private `APT_CONFIG` (the host's `/etc/apt` is never touched: the
//! backports suite exists only in that private configuration), unpacked with `dpkg-deb -x`
//! into the cache (no system install), and their BTF extracted from the compressed image.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

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

/// Debian's archive (the same mirror as the host's own sources).
const MIRROR: &str = "http://deb.debian.org/debian";
const SECURITY: &str = "http://deb.debian.org/debian-security";

/// Writes the private APT configuration (sources: bookworm, its security and backports
/// suites) and refreshes its package lists when they are missing or older than a day.
/// Returns the `APT_CONFIG` file.
fn apt_config(cache: &Path) -> anyhow::Result<PathBuf> {
    let apt = cache.join("apt");
    for d in [
        "lists/partial",
        "archives/partial",
        "etc/sources.list.d",
        "etc/preferences.d",
    ] {
        std::fs::create_dir_all(apt.join(d))
            .with_context(|| format!("creating {}", apt.join(d).display()))?;
    }
    let key = "signed-by=/usr/share/keyrings/debian-archive-keyring.gpg";
    let sources = format!(
        "deb [{key}] {MIRROR} bookworm main\n\
         deb [{key}] {SECURITY} bookworm-security main\n\
         deb [{key}] {MIRROR} bookworm-backports main\n"
    );
    std::fs::write(apt.join("etc/sources.list"), sources)?;
    let a = apt.display();
    let conf = format!(
        "Dir::State \"{a}\";\nDir::State::Lists \"{a}/lists\";\n\
         Dir::State::status \"/var/lib/dpkg/status\";\nDir::Cache \"{a}\";\n\
         Dir::Cache::Archives \"{a}/archives\";\nDir::Etc::SourceList \"{a}/etc/sources.list\";\n\
         Dir::Etc::SourceParts \"{a}/etc/sources.list.d\";\n\
         Dir::Etc::Preferences \"{a}/etc/preferences\";\n\
         Dir::Etc::PreferencesParts \"{a}/etc/preferences.d\";\n\
         APT::Sandbox::User \"root\";\n"
    );
    let path = apt.join("apt.conf");
    std::fs::write(&path, conf)?;
    let stamp = apt.join("lists/.updated");
    let fresh = std::fs::metadata(&stamp)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age.as_secs() < 86_400);
    if !fresh {
        run_cmd(
            Command::new("apt-get")
                .env("APT_CONFIG", &path)
                .args(["update", "-qq"]),
        )
        .context("apt-get update with the private APT_CONFIG")?;
        std::fs::write(&stamp, b"")?;
    }
    Ok(path)
}

fn apt_output(conf: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("apt-cache")
        .env("APT_CONFIG", conf)
        .args(args)
        .output()
        .with_context(|| format!("apt-cache {args:?}"))?;
    if !out.status.success() {
        bail!(
            "apt-cache {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
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
    let conf = apt_config(&cache)?;
    std::fs::create_dir_all(&dir)?;
    eprintln!("xtask matrix: fetching {}={}", pin.package, pin.version);
    run_cmd(
        Command::new("apt-get")
            .env("APT_CONFIG", &conf)
            .current_dir(&dir)
            .args(["download", "-qq"])
            .arg(format!("{}={}", pin.package, pin.version)),
    )
    .with_context(|| format!("downloading {}={}", pin.package, pin.version))?;
    let deb = std::fs::read_dir(&dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .context("apt-get download produced no .deb")?;
    run_cmd(
        Command::new("dpkg-deb")
            .arg("-x")
            .arg(&deb)
            .arg(dir.join("root")),
    )?;
    // The modules stay: virtme-ng puts the guest's 9p/virtio/overlay modules into its
    // initramfs from `lib/modules` beside the image.
    let _ = std::fs::remove_file(&deb);
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
    let conf = apt_config(&cache_dir())?;
    let mut text = PINS.to_string();
    for pin in pins()? {
        let madison = apt_output(&conf, &["madison", &pin.meta])?;
        let meta_version = madison_version(&madison, &pin.suite)
            .with_context(|| format!("{} has no version in {}", pin.meta, pin.suite))?;
        let show = apt_output(&conf, &["show", &format!("{}={meta_version}", pin.meta)])?;
        let package = show
            .lines()
            .find_map(|l| l.strip_prefix("Depends: "))
            .and_then(|d| d.split([',', ' ']).find(|p| p.starts_with("linux-image-")))
            .with_context(|| format!("{}={meta_version} depends on no image", pin.meta))?
            .to_string();
        let madison = apt_output(&conf, &["madison", &package])?;
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
