//! The guard: the buffer policy applied in the kernel, without touching the application.
//!
//! - `tcp-autotune`: a TCP `SO_RCVBUF`/`SO_SNDBUF` (or `*FORCE`, or an `SO_BUF_LOCK` that sets a
//!   lock) is skipped in `cgroup/setsockopt` (`optlen = -1`: the kernel's handler does not run,
//!   the caller gets success), so autotuning stays on and a socket configured before
//!   `connect()`/`listen()` is born with the normal window scale.
//! - `udp-floor`: a UDP request below the floor is rewritten to the floor; a UDP socket is
//!   raised with `bpf_setsockopt` once, at its first bind, connect or unconnected send.
//!
//! Per-socket state lives in `GUARD_SK` (socket-local storage, freed with the socket): what
//! was decided for which rule, and what a skipped TCP request asked for. A socket is decided
//! once per rule; later calls cost one lookup. Each decision is reported once ([`GuardEvent`]
//! in `EVENTS`), after it was acted on; when the ring buffer is full it is counted in
//! `GUARD_STATS` instead.
//!
//! Settings come from `GUARD` (frozen `.rodata`: with the guard off every branch here is dead
//! code to the verifier). Observe mode counts the same decisions and changes nothing.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::{BPF_SK_STORAGE_GET_F_CREATE, bpf_sock},
    btf_maps::SkStorage,
    helpers::{
        bpf_get_current_ancestor_cgroup_id, bpf_get_current_pid_tgid, bpf_getsockopt,
        bpf_ktime_get_ns, bpf_setsockopt, bpf_sk_storage_get,
    },
    macros::{btf_map, cgroup_sock_addr, cgroup_sockopt, map},
    maps::{Array, HashMap, PerCpuArray},
    programs::{SockAddrContext, SockoptContext},
};
use bufscope_common::{
    GuardConfig, GuardEvent, IPPROTO_TCP, IPPROTO_UDP, Owner, SO_BUF_LOCK, SO_RCVBUF,
    SO_RCVBUFFORCE, SO_SNDBUF, SO_SNDBUFFORCE, SOCK_BUF_LOCK_MASK, SOL_SOCKET, event_kind, guard,
    transport,
};

use crate::events::{EVENTS, submit_flags};
use crate::sock::{addr_of, sk_inode};
use crate::task::{ancestor_cgroup_id, cgroup_owner, leader_comm};

/// The guard's settings, patched by userspace before load (see [`GuardConfig`]).
#[unsafe(no_mangle)]
static GUARD: GuardConfig = GuardConfig {
    mode: 0,
    rules: 0,
    udp_rcv_floor: 0,
    udp_snd_floor: 0,
    cgroup_id: 0,
    cgroup_level: 0,
    comm_mode: 0,
    tcp_rmem_ceiling: 0,
    tcp_wmem_ceiling: 0,
    self_tgid: 0,
    lease_secs: 0,
};

/// Reads one `GUARD` field (volatile: the compiler must not fold the compiled-in zero).
macro_rules! guard_cfg {
    ($f:ident) => {
        unsafe { core::ptr::read_volatile(&raw const GUARD.$f) }
    };
}

/// The guard's own counters (slots [`guard::STAT_UNREPORTED`], …), per CPU.
#[map]
static GUARD_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(guard::STAT_COUNT, 0);

/// The comms of `--guard.comm` / `--guard.exclude-comm` (the kernel's 16-byte `comm`).
#[map]
static GUARD_COMMS: HashMap<[u8; 16], u8> = HashMap::with_max_entries(256, 0);

/// What the guard knows about one socket (socket-local storage: freed with the socket, no
/// eviction, no inode reuse).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct GuardSk {
    /// The skipped TCP `SO_RCVBUF`/`SO_SNDBUF` requests (receive, send; 0: not asked):
    /// `getsockopt` reads back at least what the kernel would have given, so applications that
    /// verify their request (iperf3 aborts with "socket buffer size not set correctly") carry
    /// on, while the real buffer stays unlocked and autotuned.
    asked: [i32; 2],
    /// Rules with a decision on this socket (bits `guard::RULE_*`): each is reported once.
    decided: u32,
    /// Non-zero once the socket was looked at for the UDP floor outside `setsockopt` (at its
    /// creation, or its first bind/connect/send): never again.
    raised: u32,
}

/// Per-socket guard state ([`GuardSk`]).
#[btf_map]
static GUARD_SK: SkStorage<GuardSk> = SkStorage::new();

/// `GUARD_SK` of `sk` (a socket pointer the verifier knows, or a
/// context), created when `create`; None when absent (or the kernel could not allocate it).
#[inline(always)]
fn guard_sk<'a>(sk: *mut c_void, create: bool) -> Option<&'a mut GuardSk> {
    let flags = if create {
        BPF_SK_STORAGE_GET_F_CREATE as u64
    } else {
        0
    };
    let map = (&raw const GUARD_SK).cast_mut().cast::<c_void>();
    let p = unsafe { bpf_sk_storage_get(map, sk, core::ptr::null_mut(), flags) };
    unsafe { p.cast::<GuardSk>().as_mut() }
}

/// Marks `rule` decided in `st`: true the first time (report it), false after (and without
/// storage: reported every time rather than never).
#[inline(always)]
fn first_decision(st: &mut Option<&mut GuardSk>, rule: u8) -> bool {
    match st {
        Some(st) => {
            let bit = rule as u32;
            let first = st.decided & bit == 0;
            st.decided |= bit;
            first
        }
        None => true,
    }
}

/// After a guard decision in `cgroup/setsockopt` on socket `sk`: remembers a skipped request
/// of `optname` = `requested` (for the `getsockopt` readback) and whether `rule` was already
/// decided for this socket. True when this decision is the socket's first for the rule (the
/// one to report).
#[inline(always)]
pub(crate) fn note_setsockopt(
    sk: *mut bpf_sock,
    d: Decision,
    optname: i32,
    requested: i32,
) -> bool {
    let mut st = guard_sk(sk.cast(), true);
    if d.action == guard::ACTION_SKIPPED
        && let Some(st) = st.as_mut()
    {
        match optname {
            SO_RCVBUF | SO_RCVBUFFORCE => st.asked[0] = requested,
            SO_SNDBUF | SO_SNDBUFFORCE => st.asked[1] = requested,
            _ => {}
        }
    }
    first_decision(&mut st, d.rule)
}

/// What the guard decided for one call.
#[derive(Clone, Copy)]
pub(crate) struct Decision {
    /// 0: nothing to do; else a [`guard`] action.
    pub(crate) action: u8,
    pub(crate) rule: u8,
    /// The value the kernel's handler gets (the floor for a raise).
    pub(crate) applied: i32,
}

impl Decision {
    const NONE: Self = Self {
        action: 0,
        rule: 0,
        applied: 0,
    };
}

/// The lease of a persisted guard (`--guard.persist`): the `bpf_ktime_get_ns` time until
/// which it acts, renewed by the running bufscope. Once it passed (no bufscope for
/// `--guard.lease`: crashed, uninstalled), the guard is off: it fails open.
#[map]
static GUARD_LEASE: Array<u64> = Array::with_max_entries(1, 0);

/// The mode in force: `GUARD.mode` (a constant to the verifier: with the guard off nothing
/// below it is loaded), or off once a persisted guard's lease expired.
#[inline(always)]
fn mode() -> u32 {
    let m = guard_cfg!(mode);
    if m != guard::MODE_OFF && guard_cfg!(lease_secs) != 0 {
        let deadline = GUARD_LEASE.get(0).copied().unwrap_or(0);
        if unsafe { bpf_ktime_get_ns() } > deadline {
            return guard::MODE_OFF;
        }
    }
    m
}

/// Whether the calling process (`tgid`; its name — the thread-group leader's `comm`, not the
/// calling thread's — and its cgroup2 ancestor at a level, read only when the scope needs
/// them) is in the guard's scope (cgroup subtree and comm lists).
#[inline(always)]
fn in_scope(
    tgid: u32,
    comm: impl FnOnce() -> [u8; 16],
    ancestor_cgroup_id: impl FnOnce(u32) -> u64,
) -> bool {
    if tgid == guard_cfg!(self_tgid) {
        return false;
    }
    let id = guard_cfg!(cgroup_id);
    if id != 0 && ancestor_cgroup_id(guard_cfg!(cgroup_level)) != id {
        return false;
    }
    match guard_cfg!(comm_mode) {
        guard::COMM_ALL => true,
        m => {
            let listed = unsafe { GUARD_COMMS.get(&comm()) }.is_some();
            (m == guard::COMM_ONLY) == listed
        }
    }
}

/// The decision for a buffer `setsockopt` of `optname` = `requested` (`optlen` bytes) on a
/// socket whose [`transport`] is `proto`, called by `owner` (`net_admin`: it would pass
/// `capable(CAP_NET_ADMIN)`). `cgroup/setsockopt`: the scope is read from the task, as the
/// program type has neither the comm nor the ancestor-cgroup helper before 6.1.
///
/// A TCP call is skipped only when the kernel would have accepted it (`optlen` >= 4, valid
/// `SO_BUF_LOCK` bits, the capability for `*FORCE`): otherwise the kernel runs it and the
/// caller gets the kernel's own error.
#[inline(always)]
pub(crate) fn decide_setsockopt(
    owner: &Owner,
    proto: u8,
    optname: i32,
    requested: i32,
    optlen: i32,
    net_admin: bool,
) -> Decision {
    let mode = mode();
    if mode == guard::MODE_OFF
        || (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
        || optlen < 4
        || !in_scope(owner.tgid, leader_comm, ancestor_cgroup_id)
    {
        return Decision::NONE;
    }
    let rules = guard_cfg!(rules);
    let act = |rule: u32, enforced: u8, applied: i32| Decision {
        action: if mode == guard::MODE_ENFORCE {
            enforced
        } else {
            guard::ACTION_OBSERVED
        },
        rule: rule as u8,
        applied,
    };
    if proto == IPPROTO_TCP && rules & guard::RULE_TCP_AUTOTUNE != 0 {
        let locks = match optname {
            SO_RCVBUF | SO_SNDBUF => true,
            SO_RCVBUFFORCE | SO_SNDBUFFORCE => net_admin,
            SO_BUF_LOCK => {
                requested & !(SOCK_BUF_LOCK_MASK as i32) == 0
                    && requested & SOCK_BUF_LOCK_MASK as i32 != 0
            }
            _ => false,
        };
        if locks {
            return act(guard::RULE_TCP_AUTOTUNE, guard::ACTION_SKIPPED, 0);
        }
    }
    if proto == IPPROTO_UDP && rules & guard::RULE_UDP_FLOOR != 0 {
        let floor = match optname {
            SO_RCVBUF | SO_RCVBUFFORCE => guard_cfg!(udp_rcv_floor),
            SO_SNDBUF | SO_SNDBUFFORCE => guard_cfg!(udp_snd_floor),
            _ => 0,
        };
        // A negative SO_RCVBUF/SO_SNDBUF means "as much as allowed" to the kernel
        // (min_t(u32, val, max)): not smaller. Negative *FORCE values mean 0.
        let smaller = match optname {
            SO_RCVBUF | SO_SNDBUF => requested >= 0 && requested < floor,
            _ => requested < floor,
        };
        if floor > 0 && smaller {
            return act(guard::RULE_UDP_FLOOR, guard::ACTION_RAISED, floor);
        }
    }
    Decision::NONE
}

/// Sends one [`GuardEvent`] of a call by `owner`, after the decision was acted on: when the
/// ring buffer is full it is counted in `GUARD_STATS` instead (enforcement never waits for
/// the daemon).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn report(
    owner: &Owner,
    d: Decision,
    hook: u8,
    optname: i32,
    inode: u64,
    requested: i32,
    proto: u8,
    ret: i32,
) {
    let Some(mut entry) = EVENTS.reserve::<GuardEvent>(0) else {
        // Acted on already: only the report is lost.
        if let Some(p) = GUARD_STATS.get_ptr_mut(guard::STAT_UNREPORTED) {
            unsafe { *p += 1 };
        }
        return;
    };
    entry.write(GuardEvent {
        kind: event_kind::GUARD,
        optname,
        owner: *owner,
        inode,
        requested,
        applied: d.applied,
        rule: d.rule,
        action: d.action,
        hook,
        proto,
        ret,
    });
    entry.submit(submit_flags());
}

/// Whether the calling process is in scope, from a cgroup socket program (they have the pid
/// and ancestor-cgroup helpers).
#[inline(always)]
fn caller_in_scope() -> bool {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let ancestor = |level: u32| unsafe { bpf_get_current_ancestor_cgroup_id(level as i32) };
    in_scope(tgid, leader_comm, ancestor)
}

/// Raises the UDP socket behind `sk` (the program's context: what `bpf_getsockopt`/
/// `bpf_setsockopt` take in these program types) to the floors where it is below them, and
/// reports the decision unless one was already reported for the socket (`st`; the inode of
/// `sk_addr`, seen at `hook`).
#[inline(always)]
fn raise_udp(sk: *mut c_void, sk_addr: u64, hook: u8, st: &mut Option<&mut GuardSk>) {
    let mode = mode();
    let mut applied = 0;
    let mut ret = 0;
    let mut optname = 0;
    for (opt, floor) in [
        (SO_RCVBUF, guard_cfg!(udp_rcv_floor)),
        (SO_SNDBUF, guard_cfg!(udp_snd_floor)),
    ] {
        if floor <= 0 {
            continue;
        }
        let mut cur: i32 = 0;
        let got = unsafe { bpf_getsockopt(sk, SOL_SOCKET, opt, (&raw mut cur).cast(), 4) };
        // getsockopt reports the doubled size the kernel stores.
        if got != 0 || cur >= floor.saturating_mul(2) {
            continue;
        }
        if optname == 0 {
            (optname, applied) = (opt, floor);
        }
        if mode == guard::MODE_ENFORCE {
            let mut v = floor;
            let r = unsafe { bpf_setsockopt(sk, SOL_SOCKET, opt, (&raw mut v).cast(), 4) } as i32;
            if ret == 0 {
                ret = r;
            }
        }
    }
    if optname == 0 || !first_decision(st, guard::RULE_UDP_FLOOR as u8) {
        return;
    }
    let d = Decision {
        action: if mode == guard::MODE_ENFORCE {
            guard::ACTION_RAISED
        } else {
            guard::ACTION_OBSERVED
        },
        rule: guard::RULE_UDP_FLOOR as u8,
        applied,
    };
    report(
        &cgroup_owner(),
        d,
        hook,
        optname,
        sk_inode(sk_addr),
        0,
        IPPROTO_UDP,
        ret,
    );
}

/// Without `bpf_setsockopt` at socket creation: at bind/connect/sendmsg, a UDP socket is
/// decided once (its first such call); every later call is one storage lookup.
#[inline(always)]
fn raise_udp_once(ctx: &SockAddrContext, hook: u8) -> i32 {
    if mode() == guard::MODE_OFF || guard_cfg!(rules) & guard::RULE_UDP_FLOOR == 0 {
        return 1;
    }
    let sa = unsafe { &*ctx.sock_addr };
    if transport(sa.family as u16, sa.type_ as u16, sa.protocol as u16) != IPPROTO_UDP {
        return 1;
    }
    let sk = unsafe { sa.__bindgen_anon_1.sk };
    if let Some(st) = guard_sk(sk.cast(), false)
        && st.raised != 0
    {
        return 1;
    }
    let mut st = guard_sk(sk.cast(), true);
    if let Some(st) = st.as_mut() {
        st.raised = 1;
    }
    if caller_in_scope() {
        raise_udp(ctx.sock_addr.cast(), addr_of(sk), hook, &mut st);
    }
    1
}

/// `cgroup/bind4` (fallback variant).
#[cgroup_sock_addr(bind4)]
pub fn guard_bind4(ctx: SockAddrContext) -> i32 {
    raise_udp_once(&ctx, guard::HOOK_BIND)
}

/// `cgroup/bind6` (fallback variant).
#[cgroup_sock_addr(bind6)]
pub fn guard_bind6(ctx: SockAddrContext) -> i32 {
    raise_udp_once(&ctx, guard::HOOK_BIND)
}

/// `cgroup/connect4` (fallback variant).
#[cgroup_sock_addr(connect4)]
pub fn guard_connect4(ctx: SockAddrContext) -> i32 {
    raise_udp_once(&ctx, guard::HOOK_CONNECT)
}

/// `cgroup/connect6` (fallback variant).
#[cgroup_sock_addr(connect6)]
pub fn guard_connect6(ctx: SockAddrContext) -> i32 {
    raise_udp_once(&ctx, guard::HOOK_CONNECT)
}

/// `cgroup/sendmsg4` (fallback variant: unconnected sends with an address).
#[cgroup_sock_addr(sendmsg4)]
pub fn guard_sendmsg4(ctx: SockAddrContext) -> i32 {
    raise_udp_once(&ctx, guard::HOOK_SENDMSG)
}

/// `cgroup/sendmsg6` (fallback variant).
#[cgroup_sock_addr(sendmsg6)]
pub fn guard_sendmsg6(ctx: SockAddrContext) -> i32 {
    raise_udp_once(&ctx, guard::HOOK_SENDMSG)
}

/// `cgroup/getsockopt`: `SO_RCVBUF`/`SO_SNDBUF` of a TCP socket whose request the guard
/// skipped read back as at least what the kernel would have given for it
/// (`2 * min(value, rmem_max)`, capped like the kernel); everything else is untouched. An
/// `optlen` above a page is reset on every path ("keep the kernel's result": before 6.5 the
/// call fails with EFAULT otherwise).
#[cgroup_sockopt(getsockopt)]
pub fn guard_getsockopt(ctx: SockoptContext) -> i32 {
    let so = unsafe { &mut *ctx.sockopt };
    if mode() == guard::MODE_ENFORCE && so.level == SOL_SOCKET {
        readback(so);
    }
    if so.optlen > 4096 {
        so.optlen = 0;
    }
    1
}

/// The readback of a skipped TCP size request, if `so` asks one.
#[inline(always)]
fn readback(so: &mut aya_ebpf::bindings::bpf_sockopt) {
    let slot = match so.optname {
        SO_RCVBUF => 0,
        SO_SNDBUF => 1,
        _ => return,
    };
    if so.retval != 0 {
        return;
    }
    let Some(st) = guard_sk(unsafe { so.__bindgen_anon_1.sk }.cast(), false) else {
        return;
    };
    let want = st.asked[slot];
    if want <= 0 {
        return;
    }
    let optval = unsafe { so.__bindgen_anon_2.optval } as *mut u8;
    let end = unsafe { so.__bindgen_anon_3.optval_end } as *const u8;
    if so.optlen < 4 || unsafe { optval.add(4) } as *const u8 > end {
        return;
    }
    let ceiling = if slot == 0 {
        guard_cfg!(tcp_rmem_ceiling)
    } else {
        guard_cfg!(tcp_wmem_ceiling)
    };
    let would = want.min(ceiling).min(i32::MAX / 2).saturating_mul(2);
    let actual = unsafe { core::ptr::read_unaligned(optval as *const i32) };
    if would > actual {
        unsafe { core::ptr::write_unaligned(optval as *mut i32, would) };
    }
}
