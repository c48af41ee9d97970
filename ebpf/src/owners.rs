//! Socket owners: which process created or accepted each socket, recorded in process context
//! (drops happen in softirq, where `current` is whoever was interrupted).
//!
//! | program | hook | variant |
//! |---|---|---|
//! | [`cgroup_sock_create`] | `cgroup/sock_create` | best: runs only when an inet socket is created |
//! | [`sys_exit_new_socket`] | `syscalls/sys_exit_{socket,accept,accept4}` | without cgroup2 |
//!
//! The other signals' process-context programs (setsockopt, `connect()` in tcp_state) record
//! the owners they see through [`record_owner`] and [`record_caller_as_owner`].

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{cgroup_sock, map, tracepoint},
    maps::LruHashMap,
    programs::{SockContext, TracePointContext},
};
use bufscope_common::{IPPROTO_UDP, IPPROTO_UDPLITE, Owner, maps, stat, transport};

use crate::events::stat_inc;
use crate::kmem::{kread, tp_field};
use crate::sock::{addr_of, sk_inode, sk_transport};
use crate::task::{cgroup_owner, current_owner, fd_file};

/// Socket inode → the process that owns it (recorded in process context). The size is a
/// default; userspace may resize it at load (`--bpf.*-entries`).
#[map]
pub(crate) static OWNERS: LruHashMap<u64, Owner> =
    LruHashMap::with_max_entries(maps::OWNERS.default_entries, 0);

/// Socket inode → its transport (`IPPROTO_UDP` or `IPPROTO_UDPLITE`) for the UDP sockets
/// created while the probe runs: userspace learns from it which new sockets can have UDP
/// buffer drops without looking at them through `/proc/<pid>/fd`. An LRU: userspace reads the
/// inodes `OWNERS` gained within a second of their creation.
#[map]
pub(crate) static UDP_SOCKETS: LruHashMap<u64, u8> =
    LruHashMap::with_max_entries(maps::UDP_SOCKETS.default_entries, 0);

/// Records `inode` in [`UDP_SOCKETS`] when `transport` (as [`transport`] says it) is UDP's.
#[inline(always)]
fn record_udp(inode: u64, transport: u8) {
    if (transport == IPPROTO_UDP || transport == IPPROTO_UDPLITE)
        && UDP_SOCKETS.insert(&inode, &transport, 0).is_err()
    {
        stat_inc(stat::UDP_SOCKETS_FULL);
    }
}

/// Records `current` as the owner of the socket behind `file` (tracing programs).
#[inline(always)]
fn record_owner_of_file(file: u64) {
    let inode: u64 = kread(file, cfg!(file_inode));
    let ino: u64 = kread(inode, cfg!(inode_ino));
    if ino != 0 {
        record_owner(ino, &current_owner());
        let sock: u64 = kread(file, cfg!(file_private_data));
        let sk: u64 = if sock == 0 {
            0
        } else {
            kread(sock, cfg!(socket_sk))
        };
        if sk != 0 {
            record_udp(ino, sk_transport(sk));
        }
    }
}

/// Whether `OWNERS` already names the calling process for `inode` (usually: `socket()` was
/// seen); a lookup costs much less than the LRU update it saves.
#[inline(always)]
pub(crate) fn owned_by_current(inode: u64) -> bool {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    unsafe { OWNERS.get(&inode) }.is_some_and(|o| o.tgid == tgid)
}

/// Records `owner` (the caller, in process context) for `inode` unless `OWNERS` already names
/// it: an LRU update costs a lock and an element swap, and most calls come from the recorded
/// owner.
#[inline(always)]
pub(crate) fn record_caller_as_owner(inode: u64, owner: &Owner) {
    let known = unsafe { OWNERS.get(&inode) }
        .is_some_and(|o| o.tgid == owner.tgid && o.start_ns == owner.start_ns);
    if inode != 0 && !known && OWNERS.insert(&inode, owner, 0).is_err() {
        stat_inc(stat::OWNERS_FULL);
    }
}

/// Records `owner` (the calling process) as the owner of `inode`.
#[inline(always)]
pub(crate) fn record_owner(inode: u64, owner: &Owner) {
    if OWNERS.insert(&inode, owner, 0).is_err() {
        stat_inc(stat::OWNERS_FULL);
    }
}

/// `syscalls/sys_exit_{socket,accept,accept4}`: `ret` (@16) is the new fd.
#[tracepoint]
pub fn sys_exit_new_socket(ctx: TracePointContext) -> u32 {
    let ret: i64 = tp_field(&ctx, 16);
    if ret < 0 {
        return 0;
    }
    let file = fd_file(ret as u64);
    if file == 0 {
        stat_inc(stat::FD_WALK_FAILED);
        return 0;
    }
    record_owner_of_file(file);
    0
}

/// `cgroup/sock_create`: records the creator of every new inet socket (process context).
/// Always returns 1 (allow): observing never changes a call.
#[cgroup_sock(sock_create)]
pub fn cgroup_sock_create(ctx: SockContext) -> i32 {
    let sk = addr_of(ctx.sock);
    let inode = sk_inode(sk);
    if inode != 0 {
        record_owner(inode, &cgroup_owner());
        // The hook's context is the new socket: family, type and protocol as the caller asked.
        let (family, sk_type, protocol) =
            unsafe { ((*ctx.sock).family, (*ctx.sock).type_, (*ctx.sock).protocol) };
        record_udp(
            inode,
            transport(family as u16, sk_type as u16, protocol as u16),
        );
    }
    1
}
