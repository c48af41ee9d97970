//! A private APT: Debian's archive through an `APT_CONFIG` of our own, with its own sources
//! list, package lists and download cache under a cache directory, so that fetching a package
//! (the matrix's guest kernels, the tunnel bench's Go toolchain) never touches the host's
//! `/etc/apt` or installs anything: `apt-get download` fetches the `.deb`s and `dpkg-deb -x`
//! unpacks them into a private prefix.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

use crate::util::run_cmd;

/// Debian's archive (the same mirror as the host's own sources).
const MIRROR: &str = "http://deb.debian.org/debian";
const SECURITY: &str = "http://deb.debian.org/debian-security";

/// An APT configuration of our own (sources: bookworm, its security and backports suites;
/// bullseye and its security suite, for Debian 11's kernel in the matrix).
pub struct PrivateApt {
    conf: PathBuf,
}

impl PrivateApt {
    /// Writes the configuration under `dir` and refreshes its package lists when they are
    /// missing, older than a day, or from other sources.
    pub fn open(dir: &Path) -> anyhow::Result<Self> {
        for d in [
            "lists/partial",
            "archives/partial",
            "etc/sources.list.d",
            "etc/preferences.d",
        ] {
            std::fs::create_dir_all(dir.join(d))
                .with_context(|| format!("creating {}", dir.join(d).display()))?;
        }
        let key = "signed-by=/usr/share/keyrings/debian-archive-keyring.gpg";
        let sources = format!(
            "deb [{key}] {MIRROR} bookworm main\n\
             deb [{key}] {SECURITY} bookworm-security main\n\
             deb [{key}] {MIRROR} bookworm-backports main\n\
             deb [{key}] {MIRROR} bullseye main\n\
             deb [{key}] {SECURITY} bullseye-security main\n"
        );
        let list = dir.join("etc/sources.list");
        // New sources (a suite added here) make the package lists stale whatever their age.
        let same_sources = std::fs::read_to_string(&list).is_ok_and(|old| old == sources);
        std::fs::write(&list, sources)?;
        let a = dir.display();
        let conf = format!(
            "Dir::State \"{a}\";\nDir::State::Lists \"{a}/lists\";\n\
             Dir::State::status \"/var/lib/dpkg/status\";\nDir::Cache \"{a}\";\n\
             Dir::Cache::Archives \"{a}/archives\";\nDir::Etc::SourceList \"{a}/etc/sources.list\";\n\
             Dir::Etc::SourceParts \"{a}/etc/sources.list.d\";\n\
             Dir::Etc::Preferences \"{a}/etc/preferences\";\n\
             Dir::Etc::PreferencesParts \"{a}/etc/preferences.d\";\n\
             APT::Sandbox::User \"root\";\n"
        );
        let path = dir.join("apt.conf");
        std::fs::write(&path, conf)?;
        let stamp = dir.join("lists/.updated");
        let fresh = same_sources
            && std::fs::metadata(&stamp)
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
        Ok(Self { conf: path })
    }

    /// `apt-cache args…` with this configuration; its standard output.
    pub fn cache_output(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new("apt-cache")
            .env("APT_CONFIG", &self.conf)
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

    /// Downloads `packages` (`name=version` or `name/suite`) into `work` (emptied first) and
    /// unpacks each into `root` with `dpkg-deb -x`; the `.deb`s are removed afterwards.
    pub fn fetch_unpacked(
        &self,
        packages: &[String],
        work: &Path,
        root: &Path,
    ) -> anyhow::Result<()> {
        let _ = std::fs::remove_dir_all(work);
        std::fs::create_dir_all(work).with_context(|| format!("creating {}", work.display()))?;
        run_cmd(
            Command::new("apt-get")
                .env("APT_CONFIG", &self.conf)
                .current_dir(work)
                .args(["download", "-qq"])
                .args(packages),
        )
        .with_context(|| format!("downloading {}", packages.join(" ")))?;
        let debs: Vec<PathBuf> = std::fs::read_dir(work)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "deb"))
            .collect();
        if debs.len() != packages.len() {
            bail!(
                "apt-get download of {} produced {} .deb files",
                packages.join(" "),
                debs.len()
            );
        }
        for deb in &debs {
            run_cmd(Command::new("dpkg-deb").arg("-x").arg(deb).arg(root))?;
        }
        let _ = std::fs::remove_dir_all(work);
        Ok(())
    }
}
