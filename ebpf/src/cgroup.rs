//! cgroup programs attached at the cgroup2 root: they run only for the calls bufscope wants
//! (a `setsockopt`, an inet socket's creation), so no other syscall pays for them — unlike the
//! `syscalls:sys_*` tracepoints, which put every task on the syscall-tracing slow path while
//! attached (+16–18% per getppid here).
//!
//! | program | hook | records |
//! |---|---|---|
//! | [`cgroup_setsockopt`] | `cgroup/setsockopt` | a [`SockoptEvent`] with the state *before* the kernel's handler ([`sockopt_flags::BEFORE_HANDLER`]); userspace derives the outcome |
//! | [`cgroup_sock_create`] | `cgroup/sock_create` | the creator in `OWNERS` |
//!
//! Both always return 1 (allow): observing never changes a call. The context pointers are
//! turned into plain addresses through [`SCRATCH`] (the verifier forbids arithmetic on
//! socket pointers; with CAP_PERFMON a pointer may be stored and read back as a number) and
//! read with `bpf_probe_read_kernel`, like the syscall programs.

use aya_ebpf::{
    helpers::bpf_get_current_task,
    macros::{cgroup_sock, cgroup_sockopt, map},
    maps::PerCpuArray,
    programs::{SockContext, SockoptContext},
};
use aya_log_ebpf::debug;
use bufscope_common::{
    SO_RCVBUFFORCE, SO_SNDBUFFORCE, SOL_SOCKET, SockoptEvent, event_kind, sockopt_flags, stat,
};

use super::guard;
use super::{
    EVENTS, current_owner, is_buffer_option, kread, kread_field, record_caller_as_owner,
    record_owner, sk_netns, sk_userlocks, stat_inc, submit_flags,
};

/// One slot per CPU to turn a context pointer into a number (see the module doc).
#[map]
static SCRATCH: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

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

/// `SOCK_INODE(sk->sk_socket)->i_ino` (0 without a socket).
#[inline(always)]
pub(crate) fn sk_inode(sk: u64) -> u64 {
    let sock: u64 = kread(sk, cfg!(sk_socket));
    if sock == 0 {
        return 0;
    }
    kread(sock, cfg!(socket_ino))
}

/// Largest optval the kernel hands a cgroup program (one page); above it the program must
/// leave the buffer alone (`optlen = 0`: "use the caller's data").
const PAGE_SIZE: i32 = 4096;

/// `cgroup/setsockopt`: buffer-size options at `SOL_SOCKET`, before the kernel's handler. The
/// guard ([`crate::guard`]) decides here too: one program observes and acts.
#[cgroup_sockopt(setsockopt)]
pub fn cgroup_setsockopt(ctx: SockoptContext) -> i32 {
    let so = unsafe { &mut *ctx.sockopt };
    if so.level != SOL_SOCKET || !is_buffer_option(so.optname) {
        if so.optlen > PAGE_SIZE {
            so.optlen = 0;
        }
        return 1;
    }
    let optlen = so.optlen;
    let optval = unsafe { so.__bindgen_anon_2.optval } as *const u8;
    let end = unsafe { so.__bindgen_anon_3.optval_end } as *const u8;
    let requested = if optlen >= 4 && unsafe { optval.add(4) } <= end {
        unsafe { core::ptr::read_unaligned(optval as *const i32) }
    } else {
        0
    };
    let sk = addr_of(unsafe { so.__bindgen_anon_1.sk });
    if sk == 0 {
        return 1;
    }
    let inode = sk_inode(sk);
    let owner = current_owner();
    record_caller_as_owner(inode, &owner);
    let Some(mut entry) = EVENTS.reserve::<SockoptEvent>(0) else {
        stat_inc(stat::RINGBUF_FULL);
        return 1;
    };
    let locks = sk_userlocks(sk) as u8;
    let proto = kread_field(sk, cfg!(sk_protocol));
    let mut flags = sockopt_flags::BEFORE_HANDLER;
    // Only the *FORCE options look at the capability (4 reads saved on every other call).
    if matches!(so.optname, SO_RCVBUFFORCE | SO_SNDBUFFORCE) && caller_net_admin() {
        flags |= sockopt_flags::NET_ADMIN;
    }
    let decision = guard::decide_setsockopt(proto, so.optname, requested, optlen);
    let mut applied = requested;
    match decision.action {
        bufscope_common::guard::ACTION_SKIPPED => {
            // The kernel's handler does not run; the caller gets success.
            so.optlen = -1;
            flags |= sockopt_flags::GUARD_SKIPPED;
            guard::remember_skipped(inode, so.optname, requested);
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
    entry.write(SockoptEvent {
        kind: event_kind::SOCKOPT,
        optname: so.optname,
        owner,
        inode,
        netns: sk_netns(sk),
        requested,
        ret: 0,
        optlen: optlen.max(0) as u32,
        rcvbuf_after: kread(sk, cfg!(sk_rcvbuf)),
        sndbuf_after: kread(sk, cfg!(sk_sndbuf)),
        locks_before: locks,
        locks_after: locks,
        proto: proto as u8,
        flags,
        family: kread(sk, cfg!(sk_family)),
        _pad1: 0,
        applied,
        _pad2: 0,
    });
    entry.submit(submit_flags());
    // The outcome is derived in userspace; this is what the kernel's handler is about to get.
    debug!(
        &ctx,
        "setsockopt tgid={} opt={} req={} applied={} rcvbuf_before={}",
        owner.tgid,
        so.optname,
        requested,
        applied,
        kread::<i32>(sk, cfg!(sk_rcvbuf))
    );
    if decision.action != 0 {
        guard::report(
            decision,
            bufscope_common::guard::HOOK_SETSOCKOPT,
            so.optname,
            inode,
            requested,
            proto as u8,
            0,
        );
    }
    1
}

/// `cgroup/sock_create`: records the creator of every new inet socket (process context).
#[cgroup_sock(sock_create)]
pub fn cgroup_sock_create(ctx: SockContext) -> i32 {
    let sk = addr_of(ctx.sock);
    let inode = sk_inode(sk);
    if inode != 0 {
        record_owner(inode);
    }
    1
}
