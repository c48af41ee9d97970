//! The event ring buffer as the collector drains it ([`Records`]): the kernel's `EVENTS`
//! ring buffer when bufscope runs, an in-memory [`FakeRing`](super::fake::FakeRing) in unit
//! tests (records built from the `#[repr(C)]` events of `bufscope-common`).

use std::os::fd::{AsFd as _, OwnedFd};

use anyhow::Context as _;
use aya::Ebpf;
use aya::maps::{MapData, RingBuf};
use bufscope_common::maps;

use super::maps::take_map;

/// A source of ring-buffer records.
pub trait Records: Send {
    /// Hands every record waiting to `each`, oldest first; returns how many.
    fn drain(&mut self, each: &mut dyn FnMut(&[u8])) -> usize;
}

/// The kernel's `EVENTS` ring buffer.
pub struct Ring {
    ring: RingBuf<MapData>,
}

impl Ring {
    /// Takes `EVENTS` out of the loaded object, with a duplicate of its fd (for the reactor
    /// that wakes the drain when the kernel signals it).
    pub fn take(ebpf: &mut Ebpf) -> anyhow::Result<(Self, OwnedFd)> {
        let ring: RingBuf<MapData> = take_map(ebpf, maps::EVENTS.name)?;
        let fd = ring
            .as_fd()
            .try_clone_to_owned()
            .context("duplicating the ring buffer fd")?;
        Ok((Self { ring }, fd))
    }
}

impl Records for Ring {
    fn drain(&mut self, each: &mut dyn FnMut(&[u8])) -> usize {
        let mut n = 0;
        while let Some(item) = self.ring.next() {
            each(&item);
            n += 1;
        }
        n
    }
}

/// The kernel's positions in a BPF ring buffer, read without draining it: how many bytes
/// wait for the reader (records and their headers). A read-only mapping of the consumer and
/// producer pages of the ring's fd (both are readable by anyone holding it).
pub struct RingPositions {
    ptr: std::ptr::NonNull<u8>,
    page: usize,
}

// SAFETY: the mapping is only read, with atomic loads, and lives as long as this value.
unsafe impl Send for RingPositions {}
// SAFETY: as above.
unsafe impl Sync for RingPositions {}

impl RingPositions {
    /// Maps the position pages of the ring buffer behind `fd` (None: the kernel refused).
    pub fn map(fd: std::os::fd::BorrowedFd<'_>) -> Option<Self> {
        use std::os::fd::AsRawFd as _;
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
        // SAFETY: a fresh read-only shared mapping of two pages of a ring buffer map fd
        // (page 0: consumer position, page 1: producer position); checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * page,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        Some(Self {
            ptr: std::ptr::NonNull::new(ptr.cast())?,
            page,
        })
    }

    fn load(&self, offset: usize) -> u64 {
        // SAFETY: `offset` is 0 or one page into the live two-page mapping; the kernel keeps
        // an aligned u64 position at the start of each page and updates it atomically.
        let p = unsafe { self.ptr.as_ptr().add(offset) }.cast::<std::sync::atomic::AtomicU64>();
        // SAFETY: as above: aligned, mapped, only ever accessed atomically.
        unsafe { &*p }.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Bytes written by the programs and not consumed yet.
    pub fn backlog(&self) -> u64 {
        let consumer = self.load(0);
        let producer = self.load(self.page);
        producer.saturating_sub(consumer)
    }
}

impl Drop for RingPositions {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `map`, once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), 2 * self.page) };
    }
}
