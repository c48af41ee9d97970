//! `struct sock` helpers shared by the signals: the socket's inode (what every map is keyed
//! by), its network namespace and its buffer locks, for BTF-typed pointers (direct loads) and
//! for plain addresses (helper reads); and the plain address of a cgroup program's socket.

use aya_ebpf::{macros::map, maps::PerCpuArray};
use bufscope_common::{SOCK_BUF_LOCK_MASK, maps, transport};

use crate::kmem::{kread, kread_field, load, load_field};

/// `sock_i_ino(sk)` for a BTF-typed `sk`: the `sk_ino` cache where the kernel has one (one
/// load), else `SOCK_INODE(sk->sk_socket)->i_ino` (one load and one helper call: the inode
/// sits after `struct socket` in `struct socket_alloc`, outside what the verifier lets a
/// `struct socket *` reach). 0 when the sock has no socket.
#[inline(always)]
pub(crate) fn btf_sk_inode(sk: u64) -> u64 {
    let off = cfg!(sk_ino);
    if off != 0 {
        return load::<u64>(sk, off);
    }
    let sock: u64 = load(sk, cfg!(sk_socket));
    if sock == 0 {
        return 0;
    }
    kread(sock, cfg!(socket_ino))
}

/// `sock_net(sk)->ns.inum` for a BTF-typed `sk` (two loads).
#[inline(always)]
pub(crate) fn btf_sk_netns(sk: u64) -> u32 {
    let net: u64 = load(sk, cfg!(sk_net));
    load(net, cfg!(net_inum))
}

/// [`sk_userlocks`] for a BTF-typed `sk`.
#[inline(always)]
pub(crate) fn btf_sk_userlocks(sk: u64) -> u32 {
    load_field(sk, cfg!(sk_userlocks)) & SOCK_BUF_LOCK_MASK as u32
}

/// `SOCK_INODE(sk->sk_socket)->i_ino` (0 without a socket).
#[inline(always)]
pub(crate) fn sk_inode(sk: u64) -> u64 {
    let sock: u64 = kread(sk, cfg!(sk_socket));
    if sock == 0 {
        return 0;
    }
    kread(sock, cfg!(socket_ino))
}

/// `sock_net(sk)->ns.inum`.
#[inline(always)]
pub(crate) fn sk_netns(sk: u64) -> u32 {
    let net: u64 = kread(sk, cfg!(sk_net));
    kread(net, cfg!(net_inum))
}

/// `sk->sk_userlocks & (SOCK_SNDBUF_LOCK | SOCK_RCVBUF_LOCK)`.
#[inline(always)]
pub(crate) fn sk_userlocks(sk: u64) -> u32 {
    kread_field(sk, cfg!(sk_userlocks)) & SOCK_BUF_LOCK_MASK as u32
}

/// [`transport`] of a plain-address `sk`: its family, type and protocol read from the kernel.
#[inline(always)]
pub(crate) fn sk_transport(sk: u64) -> u8 {
    transport(
        kread::<u16>(sk, cfg!(sk_family)),
        kread_field(sk, cfg!(sk_type)) as u16,
        kread_field(sk, cfg!(sk_protocol)) as u16,
    )
}

/// One slot per CPU to turn a cgroup program's context pointer into a number: the verifier
/// forbids arithmetic on socket pointers; with CAP_PERFMON a pointer may be stored and read
/// back as a number, then read with `bpf_probe_read_kernel` like any kernel address.
#[map]
static SCRATCH: PerCpuArray<u64> = PerCpuArray::with_max_entries(maps::SCRATCH.default_entries, 0);

/// `ptr` as a plain kernel address (0 when the scratch slot is missing).
#[inline(always)]
pub(crate) fn addr_of<T>(ptr: *const T) -> u64 {
    let Some(slot) = SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    unsafe {
        core::ptr::write_volatile(slot, ptr as u64);
        core::ptr::read_volatile(slot)
    }
}
