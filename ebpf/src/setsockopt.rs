//! Buffer `setsockopt` calls: `SOL_SOCKET` × `SO_{RCV,SND}BUF{,FORCE}` | `SO_BUF_LOCK`, as
//! [`SockoptEvent`]s in `EVENTS`.
//!
//! | program | hook | variant |
//! |---|---|---|
//! | [`cgroup_setsockopt`] | `cgroup/setsockopt` | best: runs only for setsockopt calls; records the state *before* the kernel's handler ([`sockopt_flags::BEFORE_HANDLER`]), userspace derives the outcome; the guard decides here too |
//! | [`sys_enter_setsockopt`] + [`sys_exit_setsockopt`] | `syscalls/sys_{enter,exit}_setsockopt` | without cgroup2: the state after the call, and its return code |
//!
//! The cgroup program is attached at the cgroup2 root and runs only for the calls bufscope
//! wants, so no other syscall pays for it — unlike the `syscalls:sys_*` tracepoints, which put
//! every task on the syscall-tracing slow path while attached (+16–18% per getppid here). It
//! always returns 1 (allow) unless the guard acts. The socket pointer is turned into a plain
//! address ([`addr_of`]) and read with `bpf_probe_read_kernel`, like the syscall programs.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, bpf_probe_read_user},
    macros::{cgroup_sockopt, map, tracepoint},
    maps::HashMap,
    programs::{SockoptContext, TracePointContext},
};
use aya_log_ebpf::debug;
use bufscope_common::{
    SO_BUF_LOCK, SO_RCVBUF, SO_RCVBUFFORCE, SO_SNDBUF, SO_SNDBUFFORCE, SOL_SOCKET, SockoptEvent,
    event_kind, maps, sockopt_flags, stat, transport,
};

use crate::events::{EVENTS, stat_inc, submit_flags};
use crate::guard;
use crate::kmem::{kread, tp_field};
use crate::owners::record_caller_as_owner;
use crate::sock::{addr_of, sk_inode, sk_netns, sk_transport, sk_userlocks};
use crate::task::{current_owner, fd_file, sockopt_owner};

/// setsockopt calls in flight: `pid_tgid` → what `sys_enter` saw. A plain (preallocated)
/// hash, not an LRU: an LRU insert took half of `sys_enter`'s cost (240 → 126 ns without it).
/// Every entry is removed by the same thread's `sys_exit` (setsockopt always returns), and a
/// thread's next call overwrites its own key; a failed insert is counted
/// (`stat::PENDING_FULL`, exported as `bufscope_bpf_events_lost_total{cause="pending_map_full"}`).
#[map]
static PENDING: HashMap<u64, Pending> = HashMap::with_max_entries(maps::PENDING.default_entries, 0);

/// What `sys_enter_setsockopt` hands to `sys_exit_setsockopt`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Pending {
    /// The `struct file` behind the fd (the inode is read at exit: fewer reads on entry).
    file: u64,
    sk: u64,
    optname: i32,
    requested: i32,
    optlen: u32,
    locks_before: u32,
}

/// Whether `optname` (at `SOL_SOCKET`) sets a buffer size or lock.
#[inline(always)]
pub(crate) fn is_buffer_option(optname: i32) -> bool {
    matches!(
        optname,
        SO_RCVBUF | SO_SNDBUF | SO_RCVBUFFORCE | SO_SNDBUFFORCE | SO_BUF_LOCK
    )
}

// ---------------------------------------------------------------------------------------------
// cgroup/setsockopt
// ---------------------------------------------------------------------------------------------

/// `CAP_NET_ADMIN`.
const CAP_NET_ADMIN: u64 = 12;

/// Whether the caller would pass `capable(CAP_NET_ADMIN)`: the capability in its effective
/// set and its credentials in the initial user namespace (what `SO_*BUFFORCE` checks).
#[inline(always)]
fn caller_net_admin() -> bool {
    let task = unsafe { bpf_get_current_task() };
    let cred: u64 = kread(task, cfg!(task_cred));
    if cred == 0 {
        return false;
    }
    let caps: u64 = kread(cred, cfg!(cred_cap_effective));
    let ns: u64 = kread(cred, cfg!(cred_user_ns));
    let level: u32 = kread(ns, cfg!(user_ns_level));
    ns != 0 && level == 0 && caps & (1 << CAP_NET_ADMIN) != 0
}

/// Largest optval the kernel hands a cgroup program (one page); above it the program must
/// leave the buffer alone (`optlen = 0`: "use the caller's data").
const PAGE_SIZE: i32 = 4096;

/// `cgroup/setsockopt`: buffer-size options at `SOL_SOCKET`, before the kernel's handler. The
/// guard ([`crate::guard`]) decides here too: one program observes and acts. The guard acts
/// first and reports after, so a full ring buffer never changes what it does; an `optlen`
/// above a page is reset on every path (the kernel hands the program one page; before 6.5 it
/// fails the call with EFAULT unless the program says "use the caller's data").
#[cgroup_sockopt(setsockopt)]
pub fn cgroup_setsockopt(ctx: SockoptContext) -> i32 {
    let so = unsafe { &mut *ctx.sockopt };
    let optlen = so.optlen;
    if so.level == SOL_SOCKET && is_buffer_option(so.optname) {
        buffer_setsockopt(&ctx, so);
    }
    // -1 (skipped) and 4 (rewritten) are never above a page: only an untouched optlen is.
    if so.optlen > PAGE_SIZE && so.optlen == optlen {
        so.optlen = 0;
    }
    1
}

/// A buffer-size `setsockopt`: the guard's decision (acted on at once), then the event.
#[inline(always)]
fn buffer_setsockopt(ctx: &SockoptContext, so: &mut aya_ebpf::bindings::bpf_sockopt) {
    let optlen = so.optlen;
    let optval = unsafe { so.__bindgen_anon_2.optval } as *const u8;
    let end = unsafe { so.__bindgen_anon_3.optval_end } as *const u8;
    let requested = if optlen >= 4 && unsafe { optval.add(4) } <= end {
        unsafe { core::ptr::read_unaligned(optval as *const i32) }
    } else {
        0
    };
    let bsk = unsafe { &*so.__bindgen_anon_1.sk };
    let proto = transport(bsk.family as u16, bsk.type_ as u16, bsk.protocol as u16);
    let sk = addr_of(unsafe { so.__bindgen_anon_1.sk });
    if sk == 0 {
        return;
    }
    let inode = sk_inode(sk);
    let owner = sockopt_owner();
    record_caller_as_owner(inode, &owner);
    // The state before the call (the handler has not run yet, and the guard's action below
    // does not run it either).
    let locks = sk_userlocks(sk) as u8;
    let rcvbuf_before: i32 = kread(sk, cfg!(sk_rcvbuf));
    let sndbuf_before: i32 = kread(sk, cfg!(sk_sndbuf));
    let mut flags = sockopt_flags::BEFORE_HANDLER;
    // Only the *FORCE options look at the capability (4 reads saved on every other call).
    if matches!(so.optname, SO_RCVBUFFORCE | SO_SNDBUFFORCE) && caller_net_admin() {
        flags |= sockopt_flags::NET_ADMIN;
    }
    let net_admin = flags & sockopt_flags::NET_ADMIN != 0;
    // An unreadable value (optval beyond the page the kernel hands the program) is never
    // decided on: the guard would not know what it overrides.
    let readable = optlen >= 4 && unsafe { optval.add(4) } <= end;
    let decision = guard::decide_setsockopt(
        unsafe { so.__bindgen_anon_1.sk },
        sk,
        &owner,
        proto,
        so.optname,
        requested,
        if readable { optlen } else { 0 },
        net_admin,
    );
    let mut applied = requested;
    match decision.action {
        bufscope_common::guard::ACTION_SKIPPED => {
            // The kernel's handler does not run; the caller gets success.
            so.optlen = -1;
            flags |= sockopt_flags::GUARD_SKIPPED;
        }
        bufscope_common::guard::ACTION_RAISED => {
            if unsafe { optval.add(4) } <= end {
                unsafe { core::ptr::write_unaligned(optval as *mut i32, decision.applied) };
                // A non-zero optlen hands the (rewritten) program buffer to the kernel.
                so.optlen = 4;
                applied = decision.applied;
                flags |= sockopt_flags::GUARD_RAISED;
            }
        }
        _ => {}
    }
    // Each (socket, rule) decision is reported once; the socket-local storage remembers it
    // (and what a skipped request asked, for the getsockopt readback).
    if decision.action != 0
        && guard::note_setsockopt(unsafe { so.__bindgen_anon_1.sk }, decision, so.optname)
    {
        guard::report(
            &owner,
            decision,
            bufscope_common::guard::HOOK_SETSOCKOPT,
            so.optname,
            inode,
            requested,
            proto,
            0,
        );
    }
    let Some(mut entry) = EVENTS.reserve::<SockoptEvent>(0) else {
        stat_inc(stat::RINGBUF_FULL);
        return;
    };
    entry.write(SockoptEvent {
        kind: event_kind::SOCKOPT,
        optname: so.optname,
        owner,
        inode,
        netns: sk_netns(sk),
        requested,
        ret: 0,
        optlen: optlen.max(0) as u32,
        rcvbuf_after: rcvbuf_before,
        sndbuf_after: sndbuf_before,
        locks_before: locks,
        locks_after: locks,
        proto,
        flags,
        family: bsk.family as u16,
        state: bsk.state as u8,
        _pad1: 0,
        applied,
        _pad2: 0,
    });
    entry.submit(submit_flags());
    // The outcome is derived in userspace; this is what the kernel's handler is about to get.
    debug!(
        ctx,
        "setsockopt tgid={} opt={} req={} applied={} rcvbuf_before={}",
        owner.tgid,
        so.optname,
        requested,
        applied,
        rcvbuf_before
    );
}

// ---------------------------------------------------------------------------------------------
// Without cgroup2: the syscall tracepoints
// ---------------------------------------------------------------------------------------------

/// `syscalls/sys_enter_setsockopt`: fd @16, level @24, optname @32, optval @40, optlen @48.
#[tracepoint]
pub fn sys_enter_setsockopt(ctx: TracePointContext) -> u32 {
    let level: i64 = tp_field(&ctx, 24);
    let optname: i64 = tp_field(&ctx, 32);
    if level != SOL_SOCKET as i64 || !is_buffer_option(optname as i32) {
        return 0;
    }
    let fd: i64 = tp_field(&ctx, 16);
    let optval: u64 = tp_field(&ctx, 40);
    let optlen: i64 = tp_field(&ctx, 48);
    let requested: i32 = if optlen >= 4 {
        unsafe { bpf_probe_read_user(optval as *const i32) }.unwrap_or(0)
    } else {
        0
    };
    if fd < 0 {
        return 0;
    }
    let file = fd_file(fd as u64);
    if file == 0 {
        return 0;
    }
    // Not necessarily a socket: sys_exit discards the call when the kernel says ENOTSOCK.
    // Only what the call may change is read here (the lock bits); the rest waits for exit.
    let sock: u64 = kread(file, cfg!(file_private_data));
    let sk: u64 = kread(sock, cfg!(socket_sk));
    let p = Pending {
        file,
        sk,
        optname: optname as i32,
        requested,
        optlen: optlen as u32,
        locks_before: sk_userlocks(sk),
    };
    if PENDING.insert(&bpf_get_current_pid_tgid(), &p, 0).is_err() {
        stat_inc(stat::PENDING_FULL);
    }
    0
}

const EBADF: i64 = 9;
const ENOTSOCK: i64 = 88;

/// `syscalls/sys_exit_setsockopt`: ret @16.
#[tracepoint]
pub fn sys_exit_setsockopt(ctx: TracePointContext) -> u32 {
    let key = bpf_get_current_pid_tgid();
    let p = match unsafe { PENDING.get(&key) } {
        Some(p) => *p,
        None => return 0,
    };
    let _ = PENDING.remove(&key);
    let ret: i64 = tp_field(&ctx, 16);
    if ret == -EBADF || ret == -ENOTSOCK || p.sk == 0 {
        return 0;
    }
    let sk = p.sk;
    // Read through the file at exit, like `sk` below: probe reads, safe even in the rare
    // case another thread closed the fd during the call.
    let inode: u64 = kread(kread::<u64>(p.file, cfg!(file_inode)), cfg!(inode_ino));
    let owner = current_owner();
    record_caller_as_owner(inode, &owner);
    let Some(mut entry) = EVENTS.reserve::<SockoptEvent>(0) else {
        stat_inc(stat::RINGBUF_FULL);
        return 0;
    };
    let ev = SockoptEvent {
        kind: event_kind::SOCKOPT,
        optname: p.optname,
        owner,
        inode,
        netns: sk_netns(sk),
        requested: p.requested,
        ret: ret as i32,
        optlen: p.optlen,
        rcvbuf_after: kread(sk, cfg!(sk_rcvbuf)),
        sndbuf_after: kread(sk, cfg!(sk_sndbuf)),
        locks_before: p.locks_before as u8,
        locks_after: sk_userlocks(sk) as u8,
        proto: sk_transport(sk),
        flags: 0,
        family: kread(sk, cfg!(sk_family)),
        state: kread(sk, cfg!(sk_state)),
        _pad1: 0,
        applied: p.requested,
        _pad2: 0,
    };
    entry.write(ev);
    entry.submit(submit_flags());
    debug!(
        &ctx,
        "setsockopt tgid={} opt={} req={} ret={} rcvbuf={}",
        owner.tgid,
        p.optname,
        p.requested,
        ret,
        ev.rcvbuf_after
    );
    0
}
