//! A compact index of BTF type names, built in one pass over the raw type headers: each named
//! type as (hash of its name, id), sorted by hash — about 16 bytes per type instead of a
//! `String` per name and a parsed `Type` per id. A lookup yields the ids whose name hashes
//! alike; the caller confirms each by its decoded name.

use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::PathBuf;

/// `BTF_MAGIC`.
const MAGIC: u16 = 0xeb9f;
/// `struct btf_type`: name_off, info, size/type.
const TYPE_HEADER: usize = 12;

/// Names → type ids.
pub struct NameIndex {
    /// (FNV-1a of the name, type id), sorted.
    by_hash: Vec<(u64, u32)>,
}

/// FNV-1a, 64 bits: stable across runs (the index never leaves the process, but a test can
/// recompute it).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Bytes of kind-specific data after a type's header (`BTF_KIND_*`, `vlen` members); None
/// for a kind this reader does not know (the index is then not built: btf-rs searches).
fn trailing(kind: u32, vlen: usize) -> Option<usize> {
    Some(match kind {
        // INT: one u32 of encoding; VAR: linkage; DECL_TAG: component index.
        1 | 14 | 17 => 4,
        // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG.
        2 | 7 | 8 | 9 | 10 | 11 | 12 | 16 | 18 => 0,
        // ARRAY: type, index type, nelems.
        3 => 12,
        // STRUCT, UNION: name, type, offset per member; DATASEC: type, offset, size; ENUM64.
        4 | 5 | 15 | 19 => 12 * vlen,
        // ENUM: name, value; FUNC_PROTO: name, type.
        6 | 13 => 8 * vlen,
        _ => return None,
    })
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

impl NameIndex {
    /// The index of native-endian BTF `bytes` (None: not such BTF, or a kind this reader
    /// does not know).
    pub fn build(bytes: &[u8]) -> Option<Self> {
        if u16::from_ne_bytes(bytes.get(..2)?.try_into().ok()?) != MAGIC {
            return None;
        }
        let hdr_len = u32_at(bytes, 4)? as usize;
        let (type_off, type_len) = (u32_at(bytes, 8)? as usize, u32_at(bytes, 12)? as usize);
        let (str_off, str_len) = (u32_at(bytes, 16)? as usize, u32_at(bytes, 20)? as usize);
        let types = bytes.get(hdr_len + type_off..hdr_len + type_off + type_len)?;
        let strings = bytes.get(hdr_len + str_off..hdr_len + str_off + str_len)?;
        let mut by_hash = Vec::with_capacity(type_len / 24);
        let (mut at, mut id) = (0usize, 1u32);
        while at < types.len() {
            let name_off = u32_at(types, at)? as usize;
            let info = u32_at(types, at + 4)?;
            let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
            if name_off != 0 {
                let name = strings.get(name_off..)?;
                let end = name.iter().position(|b| *b == 0)?;
                by_hash.push((fnv1a(&name[..end]), id));
            }
            at += TYPE_HEADER + trailing(kind, vlen)?;
            id += 1;
        }
        if at != types.len() {
            return None;
        }
        by_hash.sort_unstable();
        by_hash.shrink_to_fit();
        Some(Self { by_hash })
    }

    /// Ids of the types whose name may be `name` (same hash), in id order.
    pub fn candidates(&self, name: &str) -> impl Iterator<Item = u32> + '_ {
        let h = fnv1a(name.as_bytes());
        let start = self.by_hash.partition_point(|(x, _)| *x < h);
        self.by_hash[start..]
            .iter()
            .take_while(move |(x, _)| *x == h)
            .map(|(_, id)| *id)
    }
}

/// A copy of `bytes` in an anonymous memory file (`memfd_create`), to be memory-mapped by
/// path (`/proc/self/fd/N`) where the original cannot be (sysfs BTF before Linux 6.16).
/// None when the copy cannot be made: the caller parses from memory instead.
pub fn anonymous_copy(bytes: &[u8]) -> Option<MemFile> {
    // SAFETY: a NUL-terminated name and valid flags.
    let fd = unsafe { libc::memfd_create(c"bufscope-btf".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: fd was just created and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut file = std::fs::File::from(fd);
    std::io::Write::write_all(&mut file, bytes).ok()?;
    let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    path.exists().then_some(MemFile { _file: file, path })
}

/// An anonymous memory file, freed once this and every mapping of it are gone.
pub struct MemFile {
    _file: std::fs::File,
    path: PathBuf,
}

impl MemFile {
    /// A path that opens it (while it lives).
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Every named type of the running kernel's BTF is found by its name, and the index is a
    /// small fraction of what a parse of every type holds.
    #[test]
    fn indexes_every_named_type_of_the_kernel() {
        let bytes = std::fs::read("/sys/kernel/btf/vmlinux").unwrap();
        let index = NameIndex::build(&bytes).unwrap();
        let btf = btf_rs::Btf::from_bytes(&bytes).unwrap();
        for name in [
            "sock",
            "tcp_sock",
            "skb_drop_reason",
            "btf_trace_kfree_skb",
            "sk_buff",
        ] {
            let mut want = btf.resolve_ids_by_name(name).unwrap();
            want.sort_unstable();
            let got: Vec<u32> = index
                .candidates(name)
                .filter(|id| want.contains(id))
                .collect();
            assert!(!want.is_empty(), "{name}");
            assert_eq!(got, want, "{name}");
        }
        assert_eq!(index.candidates("no_such_type_anywhere").count(), 0);
        assert!(
            index.by_hash.len() * 16 < bytes.len(),
            "a fraction of the BTF"
        );
    }

    #[test]
    fn not_btf_no_index() {
        assert!(NameIndex::build(b"not btf at all, not even close").is_none());
        assert!(NameIndex::build(&[]).is_none());
    }

    #[test]
    fn the_copy_reads_back() {
        let copy = anonymous_copy(b"bytes").unwrap();
        assert_eq!(std::fs::read(copy.path()).unwrap(), b"bytes");
    }
}
