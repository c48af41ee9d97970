//! Pinned BPF state (`--bpf.pin-path DIR`): counting that outlives the daemon.
//!
//! Without the flag nothing is pinned and everything bufscope attached goes away with it. With
//! it, the persistent maps (every map of the object except its `.rodata`/`.data`/`.bss`) are
//! pinned at `DIR/maps/<NAME>` and the links of the probes at `DIR/links/<probe>_<n>`, so the
//! programs keep counting while no bufscope runs (an upgrade, an OOM kill, a crash loop). The
//! next bufscope finds them and, by what `DIR/META` says:
//! - **adopts** them when they were made by the same object with the same settings (the
//!   programs' fingerprint): the pinned links stay as they are, nothing is reloaded, the maps
//!   are read where the last bufscope left them, so the counters continue from the kernel's
//!   totals and not one event is missed;
//! - **upgrades** them when the maps' layout is the same but the programs differ (a new
//!   bufscope, other flags): the maps are kept, the new programs attached, and each old link
//!   removed right after its replacement attached (nothing is missed; an event in the
//!   microseconds between the two can be counted twice);
//! - **replaces** a map whose layout differs (type, key or value size, entries, or
//!   [`LAYOUT_VERSION`]): it is never read with the wrong layout; its pin is removed and a new
//!   map made (its counts restart, said in one log line and in `bufscope_bpf_pins_info`).
//!
//! The guard's links are pinned only with `--guard.persist`; since the guard decides in the
//! shared `cgroup/setsockopt` program, the setsockopt probe's links then follow the same rule.
//! `bufscope cleanup --bpf.pin-path DIR` removes everything (links first: removing a link's
//! last reference detaches it). `bufscope check --bpf.pin-path DIR` lists what is pinned.

use std::ffi::CString;
use std::os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use aya::maps::{Array, Map, MapData, MapInfo};

/// Bump when the meaning of a persistent map's key or value changes without its size
/// changing: pins of another layout version are replaced, never read.
pub const LAYOUT_VERSION: u32 = 1;
/// `PinMeta::magic`: "BUFSCOPE".
const MAGIC: u64 = u64::from_le_bytes(*b"BUFSCOPE");
/// `PinMeta::meta_version`: the layout of [`PinMeta`] itself.
const META_VERSION: u32 = 1;
/// `statfs` magic of bpffs.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
/// Where bpffs is conventionally mounted (and is mounted by bufscope when absent).
pub const BPFFS: &str = "/sys/fs/bpf";
/// Most probes a [`PinMeta`] can describe.
pub const MAX_PROBES: usize = 32;

/// What `DIR/META` holds (one entry of a pinned array map made by userspace).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PinMeta {
    /// [`MAGIC`].
    pub magic: u64,
    /// [`META_VERSION`].
    pub meta_version: u32,
    /// [`LAYOUT_VERSION`] of the bufscope that made the maps.
    pub layout_version: u32,
    /// Fingerprint of the object and the settings the pinned programs were loaded with.
    pub programs: u64,
    /// When the maps were created (seconds since the epoch).
    pub created_unix: u64,
    /// When the links were last (re)attached (seconds since the epoch).
    pub attached_unix: u64,
    /// How many bufscope starts adopted these pins.
    pub adoptions: u32,
    /// Reserved.
    pub _pad: u32,
    /// Per probe, in [`crate::signals::PROBES`] order: 0 = no pinned links, `i + 1` = the links
    /// of variant `i` are pinned.
    pub variants: [u8; MAX_PROBES],
    /// The version of the bufscope that last wrote this, NUL-padded.
    pub version: [u8; 32],
}

// SAFETY: plain old data, `#[repr(C)]`, no padding (8+4+4+8+8+8+4+4+32+32 bytes).
unsafe impl aya::Pod for PinMeta {}

impl PinMeta {
    fn new(programs: u64) -> Self {
        let now = unix_now();
        let mut version = [0u8; 32];
        let v = env!("CARGO_PKG_VERSION").as_bytes();
        version[..v.len().min(32)].copy_from_slice(&v[..v.len().min(32)]);
        Self {
            magic: MAGIC,
            meta_version: META_VERSION,
            layout_version: LAYOUT_VERSION,
            programs,
            created_unix: now,
            attached_unix: now,
            adoptions: 0,
            _pad: 0,
            variants: [0; MAX_PROBES],
            version,
        }
    }

    /// The bufscope version that wrote it.
    pub fn version(&self) -> String {
        let end = self.version.iter().position(|b| *b == 0).unwrap_or(32);
        String::from_utf8_lossy(&self.version[..end]).into_owned()
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// What a start found in the pin directory and did with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing was pinned: the maps and links were created and pinned.
    Created,
    /// Same programs and layout: the running links were kept.
    Adopted,
    /// Same layout, other programs: maps kept, programs replaced.
    Upgraded,
    /// Some or all maps had another layout and were replaced (their counts restart).
    Replaced,
}

impl Outcome {
    /// The `outcome` label of `bufscope_bpf_pins_info`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::Created => "created",
            Outcome::Adopted => "adopted",
            Outcome::Upgraded => "upgraded",
            Outcome::Replaced => "replaced",
        }
    }
}

/// A persistent map's definition, as the object (and the flags) make it.
#[derive(Clone, Debug)]
pub struct MapDef {
    /// Map name.
    pub name: String,
    /// `bpf_map_type`.
    pub map_type: u32,
    /// Key size.
    pub key_size: u32,
    /// Value size.
    pub value_size: u32,
    /// Entries (after the flags' overrides).
    pub max_entries: u32,
    /// Map flags.
    pub flags: u32,
}

/// The persistent maps of `object` (every map but the global-data sections), with `sizes`
/// applied as the loader applies them.
pub fn persistent_maps(object: &[u8], sizes: &[(&str, u32)]) -> anyhow::Result<Vec<MapDef>> {
    let obj = aya_obj::Object::parse(object).context("parsing the BPF object's maps")?;
    let mut out: Vec<MapDef> = obj
        .maps
        .iter()
        .filter(|(_, m)| {
            matches!(
                m.section_kind(),
                aya_obj::EbpfSectionKind::Maps | aya_obj::EbpfSectionKind::BtfMaps
            )
        })
        .map(|(name, m)| {
            let max_entries = sizes
                .iter()
                .find(|(n, _)| n == name)
                .map_or(m.max_entries(), |(_, v)| *v);
            MapDef {
                name: name.clone(),
                map_type: m.map_type(),
                key_size: m.key_size(),
                value_size: m.value_size(),
                max_entries,
                flags: m.map_flags(),
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// 64-bit FNV-1a: a fingerprint that stays the same from one run of a binary to the next.
#[derive(Clone, Copy, Debug)]
pub struct Fingerprint(u64);

impl Default for Fingerprint {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fingerprint {
    /// Mixes `bytes` in (with their length, so that concatenations differ).
    pub fn add(&mut self, bytes: &[u8]) -> &mut Self {
        for b in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
        self
    }

    /// The value.
    pub fn value(&self) -> u64 {
        self.0
    }
}

/// The pin directory of a run.
#[derive(Debug)]
pub struct PinDir {
    /// `--bpf.pin-path`.
    pub dir: PathBuf,
    /// What the start found and did.
    pub outcome: Outcome,
    /// Maps whose pins were replaced, with why.
    pub replaced: Vec<(String, String)>,
    /// The META record as it will be written once attached.
    pub meta: PinMeta,
    /// Whether the guard's links (and the shared setsockopt program's) are pinned.
    pub persist_guard: bool,
    /// When adopting: the variants whose links the last run pinned (`PinMeta::variants`).
    adopt: [u8; MAX_PROBES],
}

impl PinDir {
    /// `DIR/maps/<name>`.
    pub fn map_path(&self, name: &str) -> PathBuf {
        self.dir.join("maps").join(name)
    }

    /// `DIR/links/<probe>_<n>`.
    pub fn link_path(&self, probe: &str, n: usize) -> PathBuf {
        link_path(&self.dir, probe, n)
    }

    /// The variant of probe `probe` (index `i` in [`crate::signals::PROBES`]) whose `hooks`
    /// links the last run pinned, when they are all there and can be adopted as they run.
    pub fn adoptable(&self, i: usize, probe: &str, hooks: usize) -> Option<usize> {
        if self.outcome != Outcome::Adopted {
            return None;
        }
        let v = *self.adopt.get(i)?;
        if v == 0 {
            return None;
        }
        (0..hooks)
            .all(|n| self.link_path(probe, n).exists())
            .then_some(usize::from(v - 1))
    }

    /// Records that probe `i` runs with pinned links of `variant` (None: not pinned).
    pub fn set_variant(&mut self, i: usize, variant: Option<usize>) {
        if let Some(slot) = self.meta.variants.get_mut(i) {
            *slot = variant.map_or(0, |v| u8::try_from(v + 1).unwrap_or(0));
        }
    }

    /// Removes the pinned links of probes that are not pinned by this run (disabled now, or
    /// left by an older object whose maps were replaced): called once every probe is attached.
    pub fn drop_stale_links(&self) -> anyhow::Result<()> {
        let probes = crate::signals::PROBES;
        for name in list(&self.dir.join("links"))? {
            let keep = probes.iter().enumerate().any(|(i, p)| {
                let v = self.meta.variants.get(i).copied().unwrap_or(0);
                v != 0
                    && name.rsplit_once('_').is_some_and(|(probe, n)| {
                        probe == p.name
                            && n.parse::<usize>().is_ok_and(|n| {
                                p.variants
                                    .get(usize::from(v - 1))
                                    .is_some_and(|hooks| n < hooks.len())
                            })
                    })
            });
            if !keep {
                let path = self.dir.join("links").join(&name);
                std::fs::remove_file(&path)
                    .with_context(|| format!("removing the stale link {}", path.display()))?;
                tracing::info!(link = %path.display(), "removed a pinned link of an earlier run");
            }
        }
        Ok(())
    }

    /// What the self-metrics say about the pins.
    pub fn health(&self) -> crate::metrics::PinsHealth {
        crate::metrics::PinsHealth {
            path: self.dir.display().to_string(),
            outcome: self.outcome.as_str(),
            replaced: self.replaced.iter().map(|(n, _)| n.clone()).collect(),
            pinned: crate::signals::PROBES
                .iter()
                .zip(self.meta.variants)
                .filter(|(_, v)| *v != 0)
                .map(|(p, _)| p.name.to_string())
                .collect(),
            since_unix: self.meta.created_unix,
        }
    }

    /// Writes `DIR/META` (after the links are attached and pinned).
    pub fn write_meta(&self) -> anyhow::Result<()> {
        let path = self.dir.join("META");
        let mut array: Array<MapData, PinMeta> = match MapData::from_pin(&path) {
            Ok(data) => Array::try_from(Map::Array(data))
                .with_context(|| format!("{} is not bufscope's META", path.display()))?,
            Err(_) => {
                let a: Array<MapData, PinMeta> =
                    Array::create(1, 0).context("creating the META map")?;
                a.pin(&path)
                    .with_context(|| format!("pinning {}", path.display()))?;
                let data = MapData::from_pin(&path)
                    .with_context(|| format!("opening {}", path.display()))?;
                Array::try_from(Map::Array(data))?
            }
        };
        array
            .set(0, self.meta, 0)
            .with_context(|| format!("writing {}", path.display()))
    }
}

fn link_path(dir: &Path, probe: &str, n: usize) -> PathBuf {
    dir.join("links").join(format!("{probe}_{n}"))
}

/// Reads `DIR/META`; None when absent; an error when it is not bufscope's.
pub fn read_meta(dir: &Path) -> anyhow::Result<Option<PinMeta>> {
    let path = dir.join("META");
    if !path.exists() {
        return Ok(None);
    }
    let data = MapData::from_pin(&path).with_context(|| format!("opening {}", path.display()))?;
    let info = data.info()?;
    if info.value_size() as usize != std::mem::size_of::<PinMeta>() || info.max_entries() != 1 {
        bail!(
            "{} has value size {} (bufscope's META has {})",
            path.display(),
            info.value_size(),
            std::mem::size_of::<PinMeta>()
        );
    }
    let array: Array<MapData, PinMeta> = Array::try_from(Map::Array(data))
        .with_context(|| format!("{} is not an array map", path.display()))?;
    let meta = array
        .get(&0, 0)
        .with_context(|| format!("reading {}", path.display()))?;
    if meta.magic != MAGIC || meta.meta_version != META_VERSION {
        bail!(
            "{} was not written by this bufscope's META format",
            path.display()
        );
    }
    Ok(Some(meta))
}

/// Makes sure `dir` can hold pins: bpffs mounted at [`BPFFS`] when `dir` is below it and it
/// is not mounted (as tracefs is mounted), `dir` on a bpffs, its `maps/` and `links/` made.
pub fn ensure_dir(dir: &Path) -> anyhow::Result<()> {
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

fn is_bpffs(p: &Path) -> bool {
    let Ok(c) = CString::new(p.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: statfs fills the zeroed struct; `c` is a valid NUL-terminated path.
    unsafe {
        let mut s: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut s) == 0 && s.f_type as i64 == BPF_FS_MAGIC
    }
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

/// Decides what to do with what is pinned in `dir` (see the module documentation) and
/// removes what must not be read: maps of another layout and, unless adopting, the old links.
pub fn prepare(
    dir: &Path,
    maps: &[MapDef],
    programs: u64,
    persist_guard: bool,
) -> anyhow::Result<PinDir> {
    ensure_dir(dir)?;
    let pinned_maps = list(&dir.join("maps"))?;
    let meta = match read_meta(dir) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!("{e:#}: replacing every pin in {}", dir.display());
            None
        }
    };
    let mut replaced = Vec::new();
    let layout_ok = meta.is_some_and(|m| m.layout_version == LAYOUT_VERSION);
    for name in &pinned_maps {
        let path = dir.join("maps").join(name);
        let why = match maps.iter().find(|d| &d.name == name) {
            None => Some("no longer in the object".to_string()),
            Some(_) if !layout_ok => Some(match meta {
                Some(m) => format!(
                    "layout version {} (this bufscope: {LAYOUT_VERSION})",
                    m.layout_version
                ),
                None => "no readable META".into(),
            }),
            Some(def) => match MapInfo::from_pin(&path) {
                Ok(info) => differs(def, &info),
                Err(e) => Some(format!("unreadable: {e}")),
            },
        };
        if let Some(why) = why {
            std::fs::remove_file(&path)
                .with_context(|| format!("removing the stale pin {}", path.display()))?;
            replaced.push((name.clone(), why));
        }
    }
    let kept_maps = pinned_maps.len() - replaced.len();
    let outcome = match meta {
        _ if pinned_maps.is_empty() => Outcome::Created,
        _ if !replaced.is_empty() => Outcome::Replaced,
        Some(m) if m.programs == programs => Outcome::Adopted,
        _ => Outcome::Upgraded,
    };
    let mut new = PinMeta::new(programs);
    let mut adopt = [0; MAX_PROBES];
    if let (Some(m), true) = (meta, kept_maps > 0) {
        new.created_unix = m.created_unix;
        new.adoptions = m.adoptions;
        if outcome == Outcome::Adopted {
            adopt = m.variants;
            new.attached_unix = m.attached_unix;
            new.adoptions = m.adoptions.saturating_add(1);
        }
    }
    match outcome {
        Outcome::Created => tracing::info!(path = %dir.display(), "pinning maps and links"),
        Outcome::Adopted => tracing::info!(
            path = %dir.display(),
            since = new.created_unix,
            "adopting the pinned maps and links: counting goes on from the kernel's totals"
        ),
        Outcome::Upgraded => tracing::info!(
            path = %dir.display(),
            "pinned maps kept (same layout); programs replaced (other object or settings): each \
             old link is removed right after its replacement attached"
        ),
        Outcome::Replaced => tracing::warn!(
            path = %dir.display(),
            "replaced pinned maps of another layout, their counts restart: {}",
            replaced
                .iter()
                .map(|(n, w)| format!("{n} ({w})"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
    Ok(PinDir {
        dir: dir.to_path_buf(),
        outcome,
        replaced,
        meta: new,
        persist_guard,
        adopt,
    })
}

/// Why a pinned map cannot be read as `def`, or None.
fn differs(def: &MapDef, info: &MapInfo) -> Option<String> {
    let pinned_type = info.map_type().map(|t| t as u32).unwrap_or(u32::MAX);
    let fields = [
        ("type", pinned_type, def.map_type),
        ("key size", info.key_size(), def.key_size),
        ("value size", info.value_size(), def.value_size),
        ("entries", info.max_entries(), def.max_entries),
        ("flags", info.map_flags(), def.flags),
    ];
    fields
        .iter()
        .find(|(_, had, want)| had != want)
        .map(|(what, had, want)| format!("{what} {had}, now {want}"))
}

/// Names in `dir` (empty when absent).
fn list(dir: &Path) -> anyhow::Result<Vec<String>> {
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

/// Removes every pinned link in `dir` (each detaches when its pin was its last reference).
fn remove_links(dir: &Path) -> anyhow::Result<usize> {
    let links = list(&dir.join("links"))?;
    for l in &links {
        let p = dir.join("links").join(l);
        std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
    }
    Ok(links.len())
}

/// What [`cleanup`] removed.
#[derive(Debug, Default)]
pub struct Removed {
    /// Links.
    pub links: usize,
    /// Maps (META included).
    pub maps: usize,
}

/// `bufscope cleanup`: detaches and removes everything pinned in `dir`, then the directory.
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
    let links = remove_links(dir)?;
    let mut maps = 0;
    for name in list(&dir.join("maps"))? {
        let p = dir.join("maps").join(&name);
        std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
        maps += 1;
    }
    let meta = dir.join("META");
    if meta.exists() {
        std::fs::remove_file(&meta).with_context(|| format!("removing {}", meta.display()))?;
        maps += 1;
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
    Ok(Removed { links, maps })
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
    let meta = read_meta(dir)?;
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

/// `bpf(cmd, attr)`: the zero-padded `union bpf_attr` `attr`; the syscall's result or errno.
fn bpf(cmd: libc::c_long, attr: &[u64]) -> std::io::Result<i64> {
    // SAFETY: `attr` is a valid, zero-padded bpf_attr of the size passed; what it points to
    // (a path) outlives the call at every caller.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_ptr(),
            std::mem::size_of_val(attr) as libc::c_uint,
        )
    };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// `bpf(BPF_LINK_CREATE)` of a cgroup program: aya makes such links for `cgroup/setsockopt`
/// and `cgroup/getsockopt` too, but cannot hand them over to be pinned; this makes one that
/// can be.
pub fn cgroup_link(
    prog: BorrowedFd<'_>,
    cgroup: BorrowedFd<'_>,
    attach_type: u32,
) -> anyhow::Result<OwnedFd> {
    const BPF_LINK_CREATE: libc::c_long = 28;
    // union bpf_attr, link_create: prog_fd and target_fd, then attach_type and flags (0).
    let mut attr = [0u64; 16];
    attr[0] = u64::from(prog.as_raw_fd() as u32) | u64::from(cgroup.as_raw_fd() as u32) << 32;
    attr[1] = u64::from(attach_type);
    let fd = bpf(BPF_LINK_CREATE, &attr).context("bpf(BPF_LINK_CREATE) on the cgroup")?;
    // SAFETY: the kernel returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `bpf(BPF_OBJ_PIN)`: pins the BPF object `fd` at `path`.
pub fn pin_fd(fd: BorrowedFd<'_>, path: &Path) -> anyhow::Result<()> {
    const BPF_OBJ_PIN: libc::c_long = 6;
    let c = CString::new(path.as_os_str().as_bytes())
        .with_context(|| format!("pin path {} contains NUL", path.display()))?;
    // union bpf_attr, obj_pin: pathname (u64), bpf_fd, file_flags.
    let attr = [c.as_ptr() as u64, u64::from(fd.as_raw_fd() as u32), 0, 0];
    bpf(BPF_OBJ_PIN, &attr).with_context(|| format!("pinning at {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn fingerprint_is_stable_and_separates_concatenations() {
        let a = Fingerprint::default().add(b"ab").add(b"c").value();
        let b = Fingerprint::default().add(b"a").add(b"bc").value();
        assert_ne!(a, b);
        assert_eq!(a, Fingerprint::default().add(b"ab").add(b"c").value());
    }

    #[test]
    fn meta_describes_every_probe() {
        assert!(crate::signals::PROBES.len() <= MAX_PROBES);
    }

    #[test]
    fn meta_has_no_padding() {
        assert_eq!(
            std::mem::size_of::<PinMeta>(),
            8 + 4 + 4 + 8 + 8 + 8 + 4 + 4 + 32 + 32
        );
    }

    #[test]
    fn relative_pin_path_is_refused_with_the_fix() {
        let e = ensure_dir(Path::new("bufscope")).unwrap_err().to_string();
        assert!(
            e.contains("not an absolute path") && e.contains("/sys/fs/bpf"),
            "{e}"
        );
    }

    #[test]
    fn object_maps_are_the_persistent_ones() {
        let maps = persistent_maps(super::super::OBJECT, &[("DROPS", 1234)]).unwrap();
        let names: Vec<&str> = maps.iter().map(|m| m.name.as_str()).collect();
        assert!(
            names.contains(&"DROPS") && names.contains(&"OWNERS"),
            "{names:?}"
        );
        assert!(!names.iter().any(|n| n.starts_with('.')), "{names:?}");
        assert_eq!(
            maps.iter().find(|m| m.name == "DROPS").unwrap().max_entries,
            1234
        );
    }
}
