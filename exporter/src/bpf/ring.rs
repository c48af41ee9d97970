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
