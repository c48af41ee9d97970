//! Reading kernel memory: helper reads for plain addresses, direct (PROBE_MEM) loads for
//! BTF-typed pointers, and classic tracepoint records.

use aya_ebpf::{EbpfContext as _, helpers::bpf_probe_read_kernel, programs::TracePointContext};
use bufscope_common::Field;

/// Reads a `T` at `base + off` from kernel memory (0 on fault).
#[inline(always)]
pub(crate) fn kread<T: Copy + Default>(base: u64, off: u32) -> T {
    if base == 0 {
        return T::default();
    }
    unsafe { bpf_probe_read_kernel((base + off as u64) as *const T) }.unwrap_or_default()
}

/// Reads a (bit)field described by a [`Field`].
#[inline(always)]
pub(crate) fn kread_field(base: u64, f: Field) -> u32 {
    if f.bits == 0 {
        return 0;
    }
    let word: u32 = kread(base, f.off);
    (word >> f.shift) & f.mask()
}

/// Loads a `T` at `base + off` directly (a PROBE_MEM load: a fault reads 0), without a helper
/// call. Only for BTF-typed pointers — `tp_btf` arguments and pointers loaded from them with
/// [`load`] — and only at the offset of a whole member of exactly `T`'s size (or a bitfield
/// [`load_field`] covers): the verifier checks every such access against the kernel's BTF and
/// refuses reads that cross a member's end. `off` comes from the frozen `CONFIG`, so the verifier
/// sees a constant.
#[inline(always)]
pub(crate) fn load<T: Copy>(base: u64, off: u32) -> T {
    // SAFETY: see above; the verifier rewrites this into an exception-table-protected load.
    unsafe { core::ptr::read_volatile((base as *const u8).add(off as usize) as *const T) }
}

/// [`kread_field`] with direct loads: reads exactly the bytes that hold the (bit)field, so the
/// access never crosses into the next member. `f` is a constant to the verifier, which keeps
/// only the branch for this kernel's layout.
#[inline(always)]
pub(crate) fn load_field(base: u64, f: Field) -> u32 {
    if f.bits == 0 {
        return 0;
    }
    let end = f.shift as u32 + f.bits as u32;
    let word: u32 = if end <= 8 {
        load::<u8>(base, f.off) as u32
    } else if end <= 16 {
        load::<u16>(base, f.off) as u32
    } else {
        load::<u32>(base, f.off)
    };
    (word >> f.shift) & f.mask()
}

/// Reads a field of a classic tracepoint record (the record is directly readable).
#[inline(always)]
pub(crate) fn tp_field<T: Copy>(ctx: &TracePointContext, off: usize) -> T {
    unsafe { core::ptr::read_unaligned(ctx.as_ptr().add(off) as *const T) }
}
