//! Pinned BPF state (`--bpf.pin-path DIR`): counting that outlives the daemon.
//!
//! Without the flag nothing is pinned and everything bufscope attached goes away with it. With
//! it, the persistent maps (every map of the object except its `.rodata`/`.data`/`.bss`) are
//! pinned at `DIR/maps/<NAME>` and the links of the probes at `DIR/links/<probe>_<n>`, so the
//! programs keep counting while no bufscope runs (an upgrade, an OOM kill, a crash loop). The
//! next bufscope finds them and, by what `DIR/META` ([`meta`]) says:
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
//! A probe its room marks unpinned ([`super::LoadPlan::unpinned`]) is never pinned.
//! `bufscope cleanup --bpf.pin-path DIR` removes everything ([`dir::cleanup`]);
//! `bufscope check --bpf.pin-path DIR` lists what is pinned ([`dir::describe`]).

pub mod dir;
pub mod meta;

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use aya::maps::MapInfo;

use super::ProbeSpec;
pub use meta::{MAX_PROBES, PinMeta};

/// Bump when the meaning of a persistent map's key or value changes without its size
/// changing: pins of another layout version are replaced, never read.
pub const LAYOUT_VERSION: u32 = 1;

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

    /// The maps were kept from an earlier bufscope: their counts include what was counted
    /// while no bufscope ran.
    pub fn kept_maps(&self) -> bool {
        matches!(self, Outcome::Adopted | Outcome::Upgraded)
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
pub fn persistent_maps(
    object: &[u8],
    sizes: impl Iterator<Item = (&'static str, u32)> + Clone,
) -> anyhow::Result<Vec<MapDef>> {
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
                .clone()
                .find(|(n, _)| n == name)
                .map_or(m.max_entries(), |(_, v)| v);
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

/// What the self-metrics and the status say about the pins.
#[derive(Clone, Debug, Default)]
pub struct PinsReport {
    /// The pin directory.
    pub path: String,
    /// `created`, `adopted`, `upgraded` or `replaced`.
    pub outcome: &'static str,
    /// Maps whose pins had another layout and were replaced.
    pub replaced: Vec<String>,
    /// Probes whose links are pinned (they keep counting while bufscope is down).
    pub pinned: Vec<String>,
    /// When the pinned maps were created (seconds since the epoch).
    pub since_unix: u64,
    /// [`LAYOUT_VERSION`].
    pub layout: u32,
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
    /// When adopting: the variants whose links the last run pinned (`PinMeta::variants`).
    adopt: [u8; MAX_PROBES],
    /// The directory, locked for this run's life.
    pub lock: dir::PinLock,
}

impl PinDir {
    /// `DIR/maps/<name>`.
    pub fn map_path(&self, name: &str) -> PathBuf {
        self.dir.join("maps").join(name)
    }

    /// `DIR/links/<probe>_<n>` (bpffs refuses '.' in names).
    pub fn link_path(&self, probe: &str, n: usize) -> PathBuf {
        self.dir.join("links").join(format!("{probe}_{n}"))
    }

    /// The variant of probe `probe` (index `i` in the probe list) whose `hooks` links the
    /// last run pinned, when they are all there and can be adopted as they run.
    pub fn adoptable(&self, i: usize, probe: &ProbeSpec) -> Option<usize> {
        if self.outcome != Outcome::Adopted {
            return None;
        }
        let v = usize::from(*self.adopt.get(i)?).checked_sub(1)?;
        let hooks = probe.variants.get(v)?.len();
        (0..hooks)
            .all(|n| self.link_path(probe.name, n).exists())
            .then_some(v)
    }

    /// Records that probe `i` runs with pinned links of `variant` (None: not pinned).
    pub fn set_variant(&mut self, i: usize, variant: Option<usize>) {
        if let Some(slot) = self.meta.variants.get_mut(i) {
            *slot = variant.map_or(0, |v| u8::try_from(v + 1).unwrap_or(0));
        }
    }

    /// Removes the pinned links of probes that are not pinned by this run (disabled now, or
    /// left by an older object whose maps were replaced): called once every probe is attached.
    pub fn drop_stale_links(&self, probes: &[ProbeSpec]) -> anyhow::Result<()> {
        for name in dir::list(&self.dir.join("links"))? {
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
                self.lock
                    .remove_link(&name)
                    .context("removing a stale link")?;
                tracing::info!(link = %path.display(), "removed a pinned link of an earlier run");
            }
        }
        Ok(())
    }

    /// What the self-metrics say about the pins (`probes`: the probe list).
    pub fn report(&self, probes: &[ProbeSpec]) -> PinsReport {
        PinsReport {
            path: self.dir.display().to_string(),
            outcome: self.outcome.as_str(),
            replaced: self.replaced.iter().map(|(n, _)| n.clone()).collect(),
            pinned: probes
                .iter()
                .zip(self.meta.variants)
                .filter(|(_, v)| *v != 0)
                .map(|(p, _)| p.name.to_string())
                .collect(),
            since_unix: self.meta.created_unix,
            layout: LAYOUT_VERSION,
        }
    }

    /// Writes `DIR/META` (after the links are attached and pinned).
    pub fn write_meta(&self) -> anyhow::Result<()> {
        meta::write(&self.dir, self.meta)
    }
}

/// The pinned links of this run, re-read on every poll: a link whose pin was removed (`bufscope
/// cleanup --force`, by hand) is detached, and one pinned anew at its path belongs to someone
/// else; either way the probe no longer counts for this bufscope.
#[derive(Debug, Default)]
pub struct LinkWatch {
    links: Vec<WatchedLink>,
}

#[derive(Debug)]
struct WatchedLink {
    probe: &'static str,
    path: PathBuf,
    /// The link's id when this run attached or adopted it.
    id: u32,
    lost: bool,
}

/// The id of the link pinned at `path`.
fn link_id(path: &std::path::Path) -> anyhow::Result<u32> {
    let l = aya::programs::links::PinnedLink::from_pin(path)?;
    Ok(aya::programs::links::FdLink::from(l).info()?.id())
}

impl LinkWatch {
    /// Re-reads every watched pin; returns the probes that lost a link since the last check,
    /// each with why.
    pub fn check(&mut self) -> Vec<(&'static str, String)> {
        let mut lost = Vec::new();
        for l in self.links.iter_mut().filter(|l| !l.lost) {
            let why = match link_id(&l.path) {
                Ok(id) if id == l.id => continue,
                Ok(id) => format!(
                    "{} now holds link {id}, not this bufscope's link {}: another process replaced it",
                    l.path.display(),
                    l.id
                ),
                Err(e) => format!(
                    "the pin of its link {} at {} is gone ({e}): the link was detached (by `bufscope cleanup --force` or by hand)",
                    l.id,
                    l.path.display()
                ),
            };
            l.lost = true;
            if !lost.iter().any(|(p, _)| *p == l.probe) {
                lost.push((l.probe, why));
            }
        }
        lost
    }

    /// How many links are watched.
    pub fn len(&self) -> usize {
        self.links.len()
    }

    /// Whether no link is watched.
    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }
}

impl PinDir {
    /// The links this run pinned or adopted (`probes`: the probe list), with their ids now.
    pub fn watch(&self, probes: &[ProbeSpec]) -> LinkWatch {
        let mut links = Vec::new();
        for (i, p) in probes.iter().enumerate() {
            let Some(v) = self
                .meta
                .variants
                .get(i)
                .and_then(|v| usize::from(*v).checked_sub(1))
            else {
                continue;
            };
            let hooks = p.variants.get(v).map_or(0, |h| h.len());
            for n in 0..hooks {
                let path = self.link_path(p.name, n);
                let id = link_id(&path).unwrap_or_else(|e| {
                    tracing::warn!(probe = p.name, "cannot read back {}: {e}", path.display());
                    0
                });
                links.push(WatchedLink {
                    probe: p.name,
                    path,
                    id,
                    lost: false,
                });
            }
        }
        LinkWatch { links }
    }
}

/// Decides what to do with what is pinned in the locked directory (see the module
/// documentation) and removes what must not be read: maps of another layout.
pub fn prepare(lock: dir::PinLock, maps: &[MapDef], programs: u64) -> anyhow::Result<PinDir> {
    let dir = lock.path().to_path_buf();
    let dir = dir.as_path();
    let pinned_maps = dir::list(&dir.join("maps"))?;
    let meta = match meta::read(dir) {
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
            lock.remove_map(name).context("removing a stale map pin")?;
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
    log_outcome(dir, &outcome, new.created_unix, &replaced);
    Ok(PinDir {
        dir: dir.to_path_buf(),
        outcome,
        replaced,
        meta: new,
        adopt,
        lock,
    })
}

/// Says in the log what the start does with the pins in `dir`.
fn log_outcome(dir: &Path, outcome: &Outcome, created_unix: u64, replaced: &[(String, String)]) {
    match outcome {
        Outcome::Created => tracing::info!(path = %dir.display(), "pinning maps and links"),
        Outcome::Adopted => tracing::info!(
            path = %dir.display(),
            since = created_unix,
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
    fn object_maps_are_the_persistent_ones() {
        let sizes = [("DROPS", 1234u32)];
        let maps = persistent_maps(super::super::OBJECT, sizes.iter().copied()).unwrap();
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
