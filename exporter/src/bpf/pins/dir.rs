//! The pin directory on its bpffs: making it usable (bpffs mounted when absent, `maps/` and
//! `links/`), listing it, and removing what bufscope pinned there (`bufscope cleanup`).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use aya::maps::MapInfo;

use super::meta::{self, PinMeta};

/// Where bpffs is conventionally mounted (and is mounted by bufscope when absent).
pub const BPFFS: &str = "/sys/fs/bpf";

/// Makes sure `dir` can hold pins: bpffs mounted at [`BPFFS`] when `dir` is below it and it
/// is not mounted (as tracefs is mounted), `dir` on a bpffs, its `maps/` and `links/` made.
pub fn ensure(dir: &Path) -> anyhow::Result<()> {
    if !dir.is_absolute() {
        bail!(
            "--bpf.pin-path {} is not an absolute path: name a directory on a bpffs, e.g. {BPFFS}/bufscope",
            dir.display()
        );
    }
    if dir.starts_with(BPFFS) && !is_bpffs(Path::new(BPFFS)) {
        mount_bpffs()?;
    }
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating --bpf.pin-path {}", dir.display()))?;
    if !is_bpffs(dir) {
        bail!(
            "--bpf.pin-path {} is not on a bpffs: pins need one; pick a directory under {BPFFS} \
             (mounted by bufscope when absent) or mount one there (`mount -t bpf bpf DIR`)",
            dir.display()
        );
    }
    for sub in ["maps", "links"] {
        std::fs::create_dir_all(dir.join(sub))
            .with_context(|| format!("creating {}", dir.join(sub).display()))?;
    }
    Ok(())
}

/// Whether `p` is on a bpffs.
pub fn is_bpffs(p: &Path) -> bool {
    crate::kernel::fs_magic(p).ok() == Some(crate::kernel::BPF_FS_MAGIC)
}

fn mount_bpffs() -> anyhow::Result<()> {
    std::fs::create_dir_all(BPFFS).with_context(|| format!("creating {BPFFS}"))?;
    // SAFETY: valid NUL-terminated strings; mount(2) has no other preconditions.
    let rc = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            c"/sys/fs/bpf".as_ptr(),
            c"bpf".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        bail!(
            "bpffs is not mounted and mounting it at {BPFFS} failed ({err}): mount it \
             (`mount -t bpf bpf {BPFFS}`; in Kubernetes mount the host's {BPFFS}) or grant \
             CAP_SYS_ADMIN"
        );
    }
    tracing::info!("mounted bpffs at {BPFFS}");
    Ok(())
}

/// Names in `dir` (empty when absent), sorted.
pub fn list(dir: &Path) -> anyhow::Result<Vec<String>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
    };
    let mut out: Vec<String> = rd
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    Ok(out)
}

/// Removes the pin at `path`.
pub fn remove(path: &Path) -> anyhow::Result<()> {
    std::fs::remove_file(path).with_context(|| format!("removing {}", path.display()))
}

/// What [`cleanup`] removed.
#[derive(Debug, Default)]
pub struct Removed {
    /// Links.
    pub links: usize,
    /// Maps (META included).
    pub maps: usize,
}

/// `bufscope cleanup`: detaches and removes everything pinned in `dir` (links first: removing
/// a link's last reference detaches it), then the directory.
pub fn cleanup(dir: &Path) -> anyhow::Result<Removed> {
    if !dir.exists() {
        return Ok(Removed::default());
    }
    if !is_bpffs(dir) {
        bail!(
            "{} is not on a bpffs: not a bufscope pin directory",
            dir.display()
        );
    }
    let mut removed = Removed::default();
    for name in list(&dir.join("links"))? {
        remove(&dir.join("links").join(name))?;
        removed.links += 1;
    }
    for name in list(&dir.join("maps"))? {
        remove(&dir.join("maps").join(name))?;
        removed.maps += 1;
    }
    let meta = dir.join("META");
    if meta.exists() {
        remove(&meta)?;
        removed.maps += 1;
    }
    for sub in ["links", "maps", ""] {
        let p = dir.join(sub);
        if let Err(e) = std::fs::remove_dir(&p) {
            bail!(
                "{} is not empty after removing bufscope's pins ({e}): something else pinned there",
                p.display()
            );
        }
    }
    Ok(removed)
}

/// One pinned object, for `bufscope check`.
#[derive(Debug)]
pub struct Listed {
    /// Path.
    pub path: PathBuf,
    /// What it is (map type and entries, or link and program ids).
    pub what: String,
}

/// Lists what is pinned in `dir` (links with their program ids, maps with their shapes).
pub fn describe(dir: &Path) -> anyhow::Result<(Option<PinMeta>, Vec<Listed>)> {
    let meta = meta::read(dir)?;
    let mut out = Vec::new();
    for name in list(&dir.join("links"))? {
        let path = dir.join("links").join(&name);
        let what = match aya::programs::links::PinnedLink::from_pin(&path)
            .map_err(anyhow::Error::from)
            .and_then(|l| Ok(aya::programs::links::FdLink::from(l).info()?))
        {
            Ok(i) => format!("link {} → program {}", i.id(), i.program_id()),
            Err(e) => format!("unreadable link: {e}"),
        };
        out.push(Listed { path, what });
    }
    for name in list(&dir.join("maps"))? {
        let path = dir.join("maps").join(&name);
        let what = match MapInfo::from_pin(&path) {
            Ok(i) => format!(
                "map {} {:?} key {} value {} entries {}",
                i.id(),
                i.map_type()
                    .map(|t| format!("{t:?}"))
                    .unwrap_or_else(|_| "?".into()),
                i.key_size(),
                i.value_size(),
                i.max_entries()
            ),
            Err(e) => format!("unreadable map: {e}"),
        };
        out.push(Listed { path, what });
    }
    Ok((meta, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_pin_path_is_refused_with_the_fix() {
        let e = ensure(Path::new("bufscope"))
            .map(|()| String::new())
            .unwrap_or_else(|e| e.to_string());
        assert!(
            e.contains("not an absolute path") && e.contains("/sys/fs/bpf"),
            "{e}"
        );
    }
}
