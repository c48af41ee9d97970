//! The pin directory on its bpffs: making it usable (bpffs mounted when absent, `maps/` and
//! `links/`), owning it (an exclusive lock for the daemon's life: one bufscope per directory),
//! listing it, and removing what bufscope pinned there (`bufscope cleanup`).
//!
//! bufscope runs as root and unlinks in this directory, so it trusts only what it can check:
//! `DIR`, `maps/` and `links/` must be real directories (a symlink is refused, never followed)
//! owned by the user bufscope runs as and writable by no one else; every unlink is an
//! `unlinkat(2)` relative to a directory fd opened with `O_NOFOLLOW`. A bpffs bufscope mounts
//! itself gets mode 0700.

use std::ffi::CString;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use aya::maps::MapInfo;

use super::meta::{self, PinMeta};

/// Where bpffs is conventionally mounted (and is mounted by bufscope when absent).
pub const BPFFS: &str = "/sys/fs/bpf";

/// Makes sure `dir` can hold pins: bpffs mounted at [`BPFFS`] (mode 0700) when `dir` is below
/// it and it is not mounted (as tracefs is mounted), `dir` made (mode 0700) when absent and on
/// a bpffs.
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
    if std::fs::symlink_metadata(dir).is_err() {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating --bpf.pin-path {}", dir.display()))?;
    }
    if !is_bpffs(dir) {
        bail!(
            "--bpf.pin-path {} is not on a bpffs: pins need one; pick a directory under {BPFFS} \
             (mounted by bufscope when absent) or mount one there (`mount -t bpf bpf DIR`)",
            dir.display()
        );
    }
    Ok(())
}

/// Whether `p` is the root of a mount (its device differs from its parent's), or `/`: pins
/// need a directory of their own, e.g. `/sys/fs/bpf/bufscope`, never the bpffs itself.
pub fn is_mount_root(p: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let Some(parent) = p.parent() else {
        return true;
    };
    match (std::fs::metadata(p), std::fs::metadata(parent)) {
        (Ok(a), Ok(b)) => a.dev() != b.dev() || a.ino() == b.ino(),
        _ => false,
    }
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
            c"mode=0700".as_ptr().cast(),
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
    tracing::info!("mounted bpffs at {BPFFS} (mode 0700)");
    Ok(())
}

fn cstr(p: &std::ffi::OsStr) -> anyhow::Result<CString> {
    CString::new(p.as_bytes()).with_context(|| format!("{p:?} holds a NUL byte"))
}

/// `openat(at, name, O_DIRECTORY | O_NOFOLLOW)` (`at`: None for the working directory).
fn open_dir_at(at: Option<&OwnedFd>, name: &std::ffi::OsStr) -> std::io::Result<OwnedFd> {
    let c = CString::new(name.as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let at = at.map_or(libc::AT_FDCWD, |f| f.as_raw_fd());
    // SAFETY: a NUL-terminated name and a directory fd that outlives the call.
    let fd = unsafe {
        libc::openat(
            at,
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd this function owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fstat(fd: &OwnedFd) -> std::io::Result<libc::stat> {
    // SAFETY: fstat on an open fd into a zeroed struct it fills.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

/// `what` (a path, for the message) is a directory owned by this user and writable by no one
/// else.
fn check_owned(fd: &OwnedFd, what: &Path) -> anyhow::Result<()> {
    let st = fstat(fd).with_context(|| format!("stat {}", what.display()))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if st.st_uid != me {
        bail!(
            "{} is owned by uid {}, not by uid {me} that bufscope runs as: refusing to pin there \
             (remove it, or pick another --bpf.pin-path)",
            what.display(),
            st.st_uid
        );
    }
    if st.st_mode & 0o022 != 0 {
        bail!(
            "{} is writable by group or others (mode {:o}): refusing to pin there (`chmod \
             go-w {}`, or pick another --bpf.pin-path)",
            what.display(),
            st.st_mode & 0o7777,
            what.display()
        );
    }
    Ok(())
}

/// Opens `DIR/<sub>` as a real directory (made with mode 0700 when absent and `create`).
fn open_sub(
    dir: &OwnedFd,
    path: &Path,
    sub: &str,
    create: bool,
) -> anyhow::Result<Option<OwnedFd>> {
    let name = cstr(std::ffi::OsStr::new(sub))?;
    let p = path.join(sub);
    if create {
        // SAFETY: a NUL-terminated name relative to an open directory fd.
        let rc = unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o700) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(e).with_context(|| format!("creating {}", p.display()));
            }
        }
    }
    match open_dir_at(Some(dir), std::ffi::OsStr::new(sub)) {
        Ok(fd) => {
            check_owned(&fd, &p)?;
            Ok(Some(fd))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => Ok(None),
        Err(e) => Err(not_a_real_dir(e, &p)),
    }
}

fn not_a_real_dir(e: std::io::Error, p: &Path) -> anyhow::Error {
    // ELOOP: the last component is a symlink (O_NOFOLLOW); ENOTDIR: not a directory.
    if e.raw_os_error() == Some(libc::ELOOP) || e.raw_os_error() == Some(libc::ENOTDIR) {
        anyhow::anyhow!(
            "{} is a symlink or not a directory: bufscope pins only in real directories and \
             never follows a symlink there (remove it, or pick another --bpf.pin-path)",
            p.display()
        )
    } else {
        anyhow::Error::new(e).context(format!("opening {}", p.display()))
    }
}

/// The pin directory, owned: `DIR` locked (`flock(LOCK_EX)` on the directory itself, held
/// until this is dropped: by the daemon for its whole life, by `cleanup` while it removes),
/// and `maps/` and `links/` open, every one checked to be a real directory of this user.
#[derive(Debug)]
pub struct PinLock {
    path: PathBuf,
    dir: OwnedFd,
    maps: Option<OwnedFd>,
    links: Option<OwnedFd>,
}

/// Who holds the lock of a pin directory.
fn holder(dir: &OwnedFd) -> String {
    let Ok(st) = fstat(dir) else {
        return "another process".into();
    };
    let dev = format!(
        "{:02x}:{:02x}:{}",
        libc::major(st.st_dev),
        libc::minor(st.st_dev),
        st.st_ino
    );
    // "1: FLOCK  ADVISORY  WRITE 4242 00:1f:1234 0 EOF" (waiters are "1: -> FLOCK …").
    let pid = std::fs::read_to_string("/proc/locks")
        .ok()
        .and_then(|locks| {
            locks.lines().find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&dev.as_str()))
                    .then(|| f.get(4)?.parse::<u32>().ok())
                    .flatten()
                    .filter(|pid| *pid != 0)
            })
        });
    match pid {
        Some(pid) => {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            format!("pid {pid} ({})", comm.trim())
        }
        None => "another process (its pid is not visible from here)".into(),
    }
}

impl PinLock {
    /// Takes `dir` for a daemon: made usable ([`ensure`]), locked, `maps/` and `links/` made.
    /// Refuses, naming the holder's pid, while another bufscope holds it.
    pub fn acquire(dir: &Path) -> anyhow::Result<Self> {
        ensure(dir)?;
        if is_mount_root(dir) {
            bail!(
                "--bpf.pin-path {}: the root of a bpffs, not a directory of its own (name one \
                 below it, e.g. {BPFFS}/bufscope)",
                dir.display()
            );
        }
        match Self::open(dir, true, None)? {
            Some(l) => Ok(l),
            None => bail!("--bpf.pin-path {}: no such directory", dir.display()),
        }
    }

    /// Opens `dir` (None when absent); `create`: make `maps/` and `links/`. While another
    /// process holds the lock: refused (`cleanup`: None), or with `cleanup: Some(true)`
    /// (`--force`) said in a warning and done anyway.
    fn open(dir: &Path, create: bool, cleanup: Option<bool>) -> anyhow::Result<Option<Self>> {
        let fd = match open_dir_at(None, dir.as_os_str()) {
            Ok(fd) => fd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => return Ok(None),
            Err(e) => return Err(not_a_real_dir(e, dir)),
        };
        // SAFETY: flock on an open fd.
        if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::WouldBlock {
                return Err(e).with_context(|| format!("locking {}", dir.display()));
            }
            let who = holder(&fd);
            match cleanup {
                None => bail!(
                    "--bpf.pin-path {} is in use by {who}: one bufscope per pin directory; stop \
                     it first, or pick another --bpf.pin-path",
                    dir.display()
                ),
                Some(false) => bail!(
                    "--bpf.pin-path {} is in use by {who}: stop it first (its pins are removed \
                     then), or remove them anyway with --force",
                    dir.display()
                ),
                Some(true) => {}
            }
            tracing::warn!(
                path = %dir.display(),
                "--force: removing the pins although {who} holds the directory; its probes \
                 stop counting (it reports them detached)"
            );
            eprintln!(
                "bufscope: warning: {} is held by {who}; --force removes its pins anyway",
                dir.display()
            );
        }
        check_owned(&fd, dir)?;
        let maps = open_sub(&fd, dir, "maps", create)?;
        let links = open_sub(&fd, dir, "links", create)?;
        Ok(Some(Self {
            path: dir.to_path_buf(),
            dir: fd,
            maps,
            links,
        }))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the pin `name` of `maps/`.
    pub fn remove_map(&self, name: &str) -> anyhow::Result<()> {
        unlink_in(self.maps.as_ref(), &self.path.join("maps"), name, false)
    }

    /// Removes the pin `name` of `links/` (its last reference: the link detaches).
    pub fn remove_link(&self, name: &str) -> anyhow::Result<()> {
        unlink_in(self.links.as_ref(), &self.path.join("links"), name, false)
    }
}

/// `unlinkat(dir, name)` (`rmdir`: `AT_REMOVEDIR`); a missing directory holds nothing.
fn unlink_in(
    dir: Option<&OwnedFd>,
    path: &Path,
    name: impl AsRef<std::ffi::OsStr>,
    rmdir: bool,
) -> anyhow::Result<()> {
    let Some(dir) = dir else {
        return Ok(());
    };
    let name = name.as_ref();
    let c = cstr(name)?;
    let flags = if rmdir { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: a NUL-terminated name relative to an open directory fd.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), flags) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(e).with_context(|| format!("removing {}", path.join(name).display()));
    }
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

/// What [`cleanup`] removed.
#[derive(Debug, Default)]
pub struct Removed {
    /// Links.
    pub links: usize,
    /// Maps (META included).
    pub maps: usize,
}

/// `bufscope cleanup`: detaches and removes everything pinned in `dir` (links first: removing
/// a link's last reference detaches it), then the directory. Refuses while a bufscope holds
/// `dir`, naming its pid; `force` removes anyway (that bufscope's pinned probes stop counting
/// and it reports them detached). A holder that died holds nothing: no `force` needed.
pub fn cleanup(dir: &Path, force: bool) -> anyhow::Result<Removed> {
    if std::fs::symlink_metadata(dir).is_err() {
        return Ok(Removed::default());
    }
    if !is_bpffs(dir) {
        bail!(
            "{} is not on a bpffs: not a bufscope pin directory",
            dir.display()
        );
    }
    if is_mount_root(dir) {
        bail!(
            "{} is the root of a bpffs, not a pin directory of its own: name the directory \
             `bufscope run --bpf.pin-path` used (e.g. {BPFFS}/bufscope)",
            dir.display()
        );
    }
    let Some(lock) = PinLock::open(dir, false, Some(force))? else {
        return Ok(Removed::default());
    };
    let mut removed = Removed::default();
    for name in list(&dir.join("links"))? {
        lock.remove_link(&name)?;
        removed.links += 1;
    }
    for name in list(&dir.join("maps"))? {
        lock.remove_map(&name)?;
        removed.maps += 1;
    }
    if std::fs::symlink_metadata(dir.join("META")).is_ok() {
        unlink_in(Some(&lock.dir), dir, "META", false)?;
        removed.maps += 1;
    }
    for sub in ["links", "maps"] {
        let present = match sub {
            "links" => lock.links.is_some(),
            _ => lock.maps.is_some(),
        };
        if present && let Err(e) = unlink_in(Some(&lock.dir), dir, sub, true) {
            bail!(
                "{} is not empty after removing bufscope's pins ({e:#}): something else pinned there",
                dir.join(sub).display()
            );
        }
    }
    let (Some(parent), Some(base)) = (dir.parent(), dir.file_name()) else {
        return Ok(removed);
    };
    let parent_fd = open_dir_at(None, parent.as_os_str())
        .with_context(|| format!("opening {}", parent.display()))?;
    if let Err(e) = unlink_in(Some(&parent_fd), parent, base, true) {
        bail!(
            "{} is not empty after removing bufscope's pins ({e:#}): something else pinned there",
            dir.display()
        );
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
