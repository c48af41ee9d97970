//! `DIR/META`: bufscope's record of what it pinned (one entry of a pinned array map made by
//! userspace): layout version, the programs' fingerprint, which variant of each probe has
//! pinned links, since when the maps count, who wrote it.

use std::path::Path;

use anyhow::{Context as _, bail};
use aya::maps::{Array, Map, MapData};

use super::LAYOUT_VERSION;

/// `PinMeta::magic`: "BUFSCOPE".
const MAGIC: u64 = u64::from_le_bytes(*b"BUFSCOPE");
/// `PinMeta::meta_version`: the layout of [`PinMeta`] itself.
const META_VERSION: u32 = 1;
/// Most probes a [`PinMeta`] can describe.
pub const MAX_PROBES: usize = 32;

/// What `DIR/META` holds.
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
    /// Per probe, in the order of the probe list: 0 = no pinned links, `i + 1` = the links of
    /// variant `i` are pinned.
    pub variants: [u8; MAX_PROBES],
    /// The version of the bufscope that last wrote this, NUL-padded.
    pub version: [u8; 32],
}

// SAFETY: plain old data, `#[repr(C)]`, no padding (8+4+4+8+8+8+4+4+32+32 bytes).
unsafe impl aya::Pod for PinMeta {}

/// Seconds since the epoch.
pub(super) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl PinMeta {
    /// A new record for programs of fingerprint `programs`, made now.
    pub fn new(programs: u64) -> Self {
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

/// Reads `DIR/META`; None when absent; an error when it is not bufscope's.
pub fn read(dir: &Path) -> anyhow::Result<Option<PinMeta>> {
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

/// Writes `DIR/META` (made and pinned when absent).
pub fn write(dir: &Path, meta: PinMeta) -> anyhow::Result<()> {
    let path = dir.join("META");
    let mut array: Array<MapData, PinMeta> = match MapData::from_pin(&path) {
        Ok(data) => Array::try_from(Map::Array(data))
            .with_context(|| format!("{} is not bufscope's META", path.display()))?,
        Err(_) => {
            let a: Array<MapData, PinMeta> =
                Array::create(1, 0).context("creating the META map")?;
            a.pin(&path)
                .with_context(|| format!("pinning {}", path.display()))?;
            let data =
                MapData::from_pin(&path).with_context(|| format!("opening {}", path.display()))?;
            Array::try_from(Map::Array(data))?
        }
    };
    array
        .set(0, meta, 0)
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_has_no_padding() {
        assert_eq!(
            std::mem::size_of::<PinMeta>(),
            8 + 4 + 4 + 8 + 8 + 8 + 4 + 4 + 32 + 32
        );
    }
}
