//! Taking maps out of the loaded object and decoding the records the programs write.

use anyhow::Context as _;
use aya::Ebpf;

/// Takes map `name` out of the object as type `T` (the caller then owns it).
pub fn take_map<T>(ebpf: &mut Ebpf, name: &str) -> anyhow::Result<T>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf
        .take_map(name)
        .with_context(|| format!("map {name} missing from the BPF object"))?;
    T::try_from(map).with_context(|| format!("map {name} has an unexpected type"))
}

/// Reads a `#[repr(C)]` POD record from the start of `bytes` (None when too short).
pub fn decode<T: aya::Pod>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: length checked; T is a #[repr(C)] integer-only type from bufscope-common, valid
    // for any bit pattern; read_unaligned handles the ring buffer's 8-byte alignment.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const T) })
}
