//! bufscope's BPF programs, one module per signal as in the exporter's `signals/`.
//! Tracepoint-first: every signal has a path that needs neither kprobes nor fentry/fexit
//! (refused on some kernels).
//!
//! | signal | module | programs (best first) | map |
//! |---|---|---|---|
//! | buffer-full drops | [`drops`] | `tp_btf/kfree_skb`; older kernels: [`drops::compat`]; readers of shared dropping sockets: [`drops::reader`] | `DROPS` (per socket inode × reason), `WATCHED`, `READERS` |
//! | buffer setsockopt calls | [`setsockopt`] | `cgroup/setsockopt`; `syscalls/sys_{enter,exit}_setsockopt` | `EVENTS` ([`SockoptEvent`](bufscope_common::SockoptEvent)), `PENDING` |
//! | window-scale shrink, listener owners | [`tcp_state`] | `tp_btf/inet_sock_set_state` | `EVENTS` ([`EstablishedEvent`](bufscope_common::EstablishedEvent)), `LISTENERS` |
//! | autotuning suppressed | [`autotune`] | `tp_btf/tcp_rcvbuf_grow`; older kernels: [`autotune::compat`] | `AUTOTUNE` (per socket inode) |
//! | socket owners | [`owners`] | `cgroup/sock_create`; `syscalls/sys_exit_{socket,accept,accept4}`; also setsockopt and `connect()` | `OWNERS` |
//! | kernel WireGuard's queue drops | [`wireguard`] | `tp_btf/consume_skb` with `location` (6.3+) or `fentry/consume_skb` reading it from the trampoline frame (before), counted only at the module's discard sites | `WG_SITES`, `WG_DROPS` (per namespace × port × reason) |
//! | the guard | [`guard`] | `cgroup/{bind,connect}{4,6}` (+ `sendmsg{4,6}`), enforce: `cgroup/getsockopt`, `cgroup/sock_release`; decisions in `cgroup/setsockopt` | `GUARD_SK` (socket storage, cloned to accepted children), `GUARD_COMMS`, `GUARD_STATS`, `GUARD_STATE`, `GUARD_LEASE` |
//!
//! Shared by several signals: [`config`] (the `CONFIG`/`COMPAT` globals userspace patches
//! from the running kernel's BTF), [`events`] (`EVENTS`, `STATS`), [`kmem`] (kernel memory
//! reads), [`sock`] (socket inode, netns, locks) and [`task`] (the calling process).
//!
//! Program names (the functions below `#[btf_tracepoint]`, `#[tracepoint]`, …) and map names
//! are what userspace loads them by: the module a program lives in does not change its name.
#![no_std]
#![no_main]
// The guard's budget is one shared counter: `atomic_xadd` (BPF_ATOMIC | BPF_FETCH) — the
// target has no CAS, so core's `AtomicU64::fetch_add` is not offered.
#![feature(core_intrinsics)]
#![allow(internal_features)]

#[macro_use]
mod config;
mod events;
mod kmem;
mod sock;
mod task;

mod autotune;
mod drops;
mod guard;
mod owners;
mod setsockopt;
mod tcp_state;
mod wireguard;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// GPL: `bpf_probe_read_kernel` and tracing helpers are GPL-only.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
