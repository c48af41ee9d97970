//! Reading a whole per-CPU hash map in a few `BPF_MAP_LOOKUP_BATCH` calls (5.6+) instead of
//! two syscalls per entry (`get_next_key` + `lookup`, what aya 0.14's iterator does; aya has
//! no batch API). With 10,000 sockets in `DROPS` that is the difference between ~20,000
//! syscalls per poll (and per scrape) and about ten.

use std::io;
use std::os::fd::AsFd as _;

use aya::maps::{MapData, MapFd};

use super::sys;

/// Entries asked for per call (grown when a hash bucket holds more: `ENOSPC`).
const CHUNK: usize = 1024;

/// Number of possible CPUs (the kernel copies one value per possible CPU).
fn possible_cpus() -> Option<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible").ok()?;
    let mut n = 0;
    for part in s.trim().split(',') {
        match part.split_once('-') {
            Some((a, b)) => n += b.parse::<usize>().ok()? - a.parse::<usize>().ok()? + 1,
            None => {
                part.parse::<usize>().ok()?;
                n += 1;
            }
        }
    }
    (n > 0).then_some(n)
}

/// How to read one per-CPU hash map in batches (its key and value sizes, checked against the
/// kernel's idea of the map, and the number of possible CPUs).
#[derive(Debug)]
pub struct BatchReader {
    key_size: usize,
    value_size: usize,
    ncpus: usize,
    /// Values are per CPU (each padded to 8 bytes); else one packed value per key.
    per_cpu: bool,
}

impl BatchReader {
    /// A reader for per-CPU hash map `map`, when the kernel reports exactly these key and
    /// value sizes for it (None otherwise: then read it key by key).
    pub fn new(map: &MapData, key_size: usize, value_size: usize) -> Option<Self> {
        Self::with_cpus(map, key_size, value_size, possible_cpus()?, true)
    }

    /// A reader for a plain (not per-CPU) hash or LRU hash map: [`BatchReader::read`] then
    /// returns one value per key.
    pub fn shared(map: &MapData, key_size: usize, value_size: usize) -> Option<Self> {
        Self::with_cpus(map, key_size, value_size, 1, false)
    }

    fn with_cpus(
        map: &MapData,
        key_size: usize,
        value_size: usize,
        ncpus: usize,
        per_cpu: bool,
    ) -> Option<Self> {
        let info = map.info().ok()?;
        (info.key_size() as usize == key_size && info.value_size() as usize == value_size)
            .then_some(Self {
                key_size,
                value_size,
                ncpus,
                per_cpu,
            })
    }

    /// Every entry of the map behind `fd` (the one this reader was made for) as (key, one value
    /// per possible CPU; one value from a [`BatchReader::shared`] reader). `K`/`V` must be the
    /// map's key and value types (sizes checked when the reader was made).
    pub fn read<K: aya::Pod, V: aya::Pod>(&self, fd: &MapFd) -> io::Result<Vec<(K, Vec<V>)>> {
        if std::mem::size_of::<K>() != self.key_size || std::mem::size_of::<V>() != self.value_size
        {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let stride = self.stride();
        let mut chunk = CHUNK;
        let mut out = Vec::new();
        let mut token = None;
        loop {
            let mut keys = vec![0u8; chunk * self.key_size];
            let mut vals = vec![0u8; chunk * stride * self.ncpus];
            let (count, next) = match sys::map_lookup_batch(
                fd.as_fd(),
                token,
                chunk as u32,
                &mut keys,
                &mut vals,
            ) {
                Ok(r) => r,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && chunk < 1 << 20 => {
                    chunk *= 4;
                    continue;
                }
                Err(e) => return Err(e),
            };
            for i in 0..(count as usize).min(chunk) {
                // SAFETY: the kernel wrote `count` keys of key_size bytes and, per key, one
                // stride-aligned value per possible CPU; K and V are Pod of exactly those sizes,
                // so any bytes are valid and read_unaligned handles alignment.
                let k: K = unsafe {
                    std::ptr::read_unaligned(keys.as_ptr().add(i * self.key_size).cast())
                };
                let base = i * stride * self.ncpus;
                let v: Vec<V> = (0..self.ncpus)
                    .map(|c| {
                        // SAFETY: as above, within the value block of entry i.
                        unsafe {
                            std::ptr::read_unaligned(vals.as_ptr().add(base + c * stride).cast())
                        }
                    })
                    .collect();
                out.push((k, v));
            }
            match next {
                Some(n) => token = Some(n),
                None => return Ok(out),
            }
        }
    }
}

impl BatchReader {
    /// Bytes between two CPUs' values.
    fn stride(&self) -> usize {
        if self.per_cpu {
            self.value_size.div_ceil(8) * 8
        } else {
            self.value_size
        }
    }

    /// Reads and deletes the entry `key` of the map behind `fd` in one step
    /// (`BPF_MAP_LOOKUP_AND_DELETE_ELEM`): its values as they were when it went, one per
    /// possible CPU (one for a [`BatchReader::shared`] reader). `Ok(None)`: no such entry; an
    /// error: this kernel cannot (before 5.14 for hash maps), the caller deletes it plainly.
    pub fn take<K: aya::Pod, V: aya::Pod>(
        &self,
        fd: &MapFd,
        key: &K,
    ) -> io::Result<Option<Vec<V>>> {
        if std::mem::size_of::<K>() != self.key_size || std::mem::size_of::<V>() != self.value_size
        {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let stride = self.stride();
        // SAFETY: K is Pod of key_size bytes: viewing it as bytes is valid.
        let k =
            unsafe { std::slice::from_raw_parts((key as *const K).cast::<u8>(), self.key_size) };
        let mut vals = vec![0u8; stride * self.ncpus];
        match sys::map_lookup_and_delete(fd.as_fd(), k, &mut vals) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
        }
        Ok(Some(
            (0..self.ncpus)
                .map(|c| {
                    // SAFETY: the kernel wrote one stride-aligned value per possible CPU; V is
                    // Pod of value_size bytes.
                    unsafe { std::ptr::read_unaligned(vals.as_ptr().add(c * stride).cast()) }
                })
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn possible_cpus_parse() {
        // Whatever this machine has, it matches the kernel's own count of possible CPUs.
        let n = possible_cpus().unwrap_or(0);
        assert!(n >= 1);
        assert!(n >= std::thread::available_parallelism().map_or(1, usize::from));
    }
}
