//! The guard: the buffer policy applied in the kernel, without touching the application.
//!
//! - `tcp-autotune`: a TCP `SO_RCVBUF`/`SO_SNDBUF` (or `*FORCE`, or an `SO_BUF_LOCK` that sets a
//!   lock) that would lock the buffer *below* what autotuning can reach in the socket's network
//!   namespace (`tcp_rmem[2]`/`tcp_wmem[2]`, read from the socket's `struct net` at the call) is
//!   skipped in `cgroup/setsockopt` (`optlen = -1`: the kernel's handler does not run, the
//!   caller gets success), so autotuning stays on and a socket configured before
//!   `connect()`/`listen()` is born with the normal window scale. A request at or above that
//!   ceiling is *honoured*: the kernel applies it as it would without the guard (clamped at
//!   `rmem_max`/`wmem_max`, or not for `*FORCE`). The guard never leaves a socket with less
//!   than the application or autotuning would have given it.
//! - `udp-floor`: a UDP request below the floor is rewritten to the floor; a UDP socket is
//!   raised with `bpf_setsockopt` once, at its first bind, connect or unconnected send. The
//!   receive side is bounded by a budget (`GUARD_STATE[STATE_GRANTED]` against
//!   `GUARD.udp_budget`): a raise it has no room for is not made (the socket keeps the
//!   kernel's size) and is counted. A socket's grant is released when it closes
//!   (`cgroup/sock_release`) or sizes itself at or above the floor.
//!
//! Per-socket state lives in `GUARD_SK` (socket-local storage, freed with the socket, copied
//! to accepted children: `BPF_F_CLONE`): what was decided for which rule under which policy
//! generation, what a skipped TCP request would have given, what the budget granted. A socket
//! is decided once per rule and generation; later calls cost one lookup; a socket marked under
//! another generation (the policy changed across a pinned restart) is decided again at its next
//! bind, connect, send or setsockopt. Marks are set only for callers in scope. Each decision is
//! reported once ([`GuardEvent`] in `EVENTS`), after it was acted on; when the ring buffer is
//! full it is counted in `GUARD_STATS` instead.
//!
//! Settings come from `GUARD` (frozen `.rodata`: with the guard off every branch here is dead
//! code to the verifier). Observe mode counts the same decisions and changes nothing.

use core::ffi::c_void;
use core::intrinsics::{AtomicOrdering, atomic_xadd};

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_SK_STORAGE_GET_F_CREATE, bpf_map_type, bpf_sock},
    helpers::{
        bpf_get_current_ancestor_cgroup_id, bpf_get_current_pid_tgid, bpf_getsockopt,
        bpf_ktime_get_ns, bpf_setsockopt, bpf_sk_storage_get,
    },
    macros::{btf_map, cgroup_sock, cgroup_sock_addr, cgroup_sockopt, map},
    maps::{Array, HashMap, PerCpuArray},
    programs::{SockAddrContext, SockContext, SockoptContext},
};
use bufscope_common::{
    GuardConfig, GuardEvent, IPPROTO_TCP, IPPROTO_UDP, Owner, SO_BUF_LOCK, SO_RCVBUF,
    SO_RCVBUFFORCE, SO_SNDBUF, SO_SNDBUFFORCE, SOCK_BUF_LOCK_MASK, SOL_SOCKET, event_kind, guard,
    maps, transport,
};

use crate::events::{EVENTS, submit_flags};
use crate::kmem::kread;
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
    generation: 0,
    self_tgid: 0,
    lease_secs: 0,
    _pad: 0,
    udp_budget: 0,
};

/// Reads one `GUARD` field (volatile: the compiler must not fold the compiled-in zero).
macro_rules! guard_cfg {
    ($f:ident) => {
        unsafe { core::ptr::read_volatile(&raw const GUARD.$f) }
    };
}

/// The guard's own counters (slots [`guard::STAT_UNREPORTED`], …), per CPU.
#[map]
static GUARD_STATS: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(maps::GUARD_STATS.default_entries, 0);

/// Shared state: the receive bytes granted to live sockets ([`guard::STATE_GRANTED`], updated
/// atomically) and the global ceilings bufscope keeps current ([`guard::STATE_RMEM_MAX`],
/// [`guard::STATE_WMEM_MAX`]).
#[map]
static GUARD_STATE: Array<u64> = Array::with_max_entries(maps::GUARD_STATE.default_entries, 0);

/// The comms of `--guard.comm` / `--guard.exclude-comm` (the kernel's 16-byte `comm`).
#[map]
static GUARD_COMMS: HashMap<[u8; 16], u8> =
    HashMap::with_max_entries(maps::GUARD_COMMS.default_entries, 0);

/// What the guard knows about one socket (socket-local storage: freed with the socket, no
/// eviction, no inode reuse; copied to the children a listener accepts).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct GuardSk {
    /// What the skipped TCP `SO_RCVBUF`/`SO_SNDBUF` requests would have given (receive, send:
    /// the kernel's doubled size; 0: none skipped): `getsockopt` reads back the larger of this
    /// and what the socket really has, so applications that verify their request (iperf3
    /// aborts with "socket buffer size not set correctly") carry on, while the real buffer
    /// stays unlocked and autotuned.
    asked: [i32; 2],
    /// The policy generation the marks below were made under.
    generation: u32,
    /// Decisions reported under it (bits `guard::RULE_*`, [`DECIDED_HONOURED`]).
    decided: u32,
    /// Non-zero once the socket was looked at for the UDP floor outside `setsockopt` (at its
    /// first bind/connect/send by a caller in scope) under this generation.
    raised: u32,
    /// The process last found out of scope at an unconnected send (0: none): its later sends
    /// skip the scope check (a bind, connect or setsockopt always checks).
    outside_tgid: u32,
    /// Receive bytes this socket holds of the budget (released at close or when it sizes
    /// itself); kept across generations.
    granted: u64,
}

/// [`GuardSk::decided`] bit of a reported `honoured` TCP decision (one per socket).
const DECIDED_HONOURED: u32 = 1 << 8;
/// [`GuardSk::decided`] bit: the budget left this socket out (counted once).
const DECIDED_LEFT_OUT: u32 = 1 << 9;

/// `BPF_F_CLONE`: the storage is copied to a listener's accepted children.
const BPF_F_CLONE: usize = 1 << 9;

/// A socket-storage map definition whose entries are cloned to accepted children (aya's
/// `SkStorage` has no flags parameter).
#[repr(C)]
pub(crate) struct CloneSkStorage<T> {
    r#type: *const [i32; bpf_map_type::BPF_MAP_TYPE_SK_STORAGE as usize],
    key: *const i32,
    value: *const T,
    max_entries: *const [i32; 0],
    map_flags: *const [i32; BPF_F_NO_PREALLOC as usize | BPF_F_CLONE],
}

// SAFETY: placeholder pointers the loader patches; never dereferenced.
unsafe impl<T> Sync for CloneSkStorage<T> {}

impl<T> CloneSkStorage<T> {
    const fn new() -> Self {
        Self {
            r#type: core::ptr::null(),
            key: core::ptr::null(),
            value: core::ptr::null(),
            max_entries: core::ptr::null(),
            map_flags: core::ptr::null(),
        }
    }
}

/// Per-socket guard state ([`GuardSk`]).
#[btf_map]
static GUARD_SK: CloneSkStorage<GuardSk> = CloneSkStorage::new();

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

/// Brings `st`'s marks to the current policy generation: marks made under another one are
/// dropped (the socket is decided again), its skipped-request readback and its grant kept.
#[inline(always)]
fn current(st: &mut GuardSk) {
    let generation = guard_cfg!(generation);
    if st.generation != generation {
        st.generation = generation;
        st.decided = 0;
        st.raised = 0;
        st.outside_tgid = 0;
    }
}

/// Marks `bit` decided in `st`: true the first time (report it), false after (and without
/// storage: reported every time rather than never).
#[inline(always)]
fn first_decision(st: &mut Option<&mut GuardSk>, bit: u32) -> bool {
    match st {
        Some(st) => {
            current(st);
            let first = st.decided & bit == 0;
            st.decided |= bit;
            first
        }
        None => true,
    }
}

/// Adds `delta` (wrapping: a negative amount as its two's complement) to the shared
/// `GUARD_STATE[STATE_GRANTED]` with an atomic add whose result is not used (what every BPF
/// CPU version has; the fetching form needs `-mcpu=v3`); the slot, for reading it after.
#[inline(always)]
fn granted_add(delta: u64) -> Option<*mut u64> {
    let p = GUARD_STATE.get_ptr_mut(guard::STATE_GRANTED)?;
    // SAFETY: an array slot, 8-byte aligned, alive as long as the map.
    let _ = unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, delta) };
    Some(p)
}

/// Takes `bytes` off `GUARD_STATE[STATE_GRANTED]`.
#[inline(always)]
fn granted_sub(bytes: u64) {
    granted_add(bytes.wrapping_neg());
}

/// Takes `bytes` of the UDP receive budget: false (nothing taken) when it has no room.
/// Concurrent charges never overshoot it together: each adds first, reads the total after,
/// and takes its bytes back when the total is above the budget (two racing charges may then
/// both be refused, never both kept beyond it).
#[inline(always)]
fn charge(bytes: u64) -> bool {
    let budget = guard_cfg!(udp_budget);
    let Some(p) = GUARD_STATE.get_ptr_mut(guard::STATE_GRANTED) else {
        return false;
    };
    // SAFETY: as in `granted_add`.
    if unsafe { core::ptr::read_volatile(p) }.saturating_add(bytes) > budget {
        return false;
    }
    let Some(p) = granted_add(bytes) else {
        return false;
    };
    if unsafe { core::ptr::read_volatile(p) } > budget {
        granted_sub(bytes);
        return false;
    }
    true
}

/// Gives `st`'s grant back to the budget.
#[inline(always)]
fn release(st: &mut GuardSk) {
    if st.granted != 0 {
        granted_sub(st.granted);
        st.granted = 0;
    }
}

/// Counts a raise the budget left out (`bytes` not granted), once per socket and generation.
#[inline(always)]
fn left_out(st: &mut GuardSk, bytes: u64) {
    current(st);
    if st.decided & DECIDED_LEFT_OUT != 0 {
        return;
    }
    st.decided |= DECIDED_LEFT_OUT;
    if let Some(p) = GUARD_STATS.get_ptr_mut(guard::STAT_LEFT_OUT) {
        unsafe { *p += 1 };
    }
    if let Some(p) = GUARD_STATS.get_ptr_mut(guard::STAT_LEFT_OUT_BYTES) {
        unsafe { *p += bytes };
    }
}

/// After a guard decision in `cgroup/setsockopt` on socket `sk`: remembers what a skipped
/// request of `optname` would have given (for the `getsockopt` readback; a request the kernel
/// applies clears it) and whether the decision was already reported for this socket under the
/// current generation. True when this decision is the one to report.
#[inline(always)]
pub(crate) fn note_setsockopt(sk: *mut bpf_sock, d: Decision, optname: i32) -> bool {
    let mut st = guard_sk(sk.cast(), true);
    if let Some(st) = st.as_mut() {
        let slot = match optname {
            SO_RCVBUF | SO_RCVBUFFORCE => 0,
            SO_SNDBUF | SO_SNDBUFFORCE => 1,
            _ => 2,
        };
        if slot < 2 {
            match d.action {
                guard::ACTION_SKIPPED => st.asked[slot] = d.would,
                guard::ACTION_HONOURED => st.asked[slot] = 0,
                _ => {}
            }
        }
    }
    let bit = if d.action == guard::ACTION_HONOURED {
        DECIDED_HONOURED
    } else {
        d.rule as u32
    };
    first_decision(&mut st, bit)
}

/// What the guard decided for one call.
#[derive(Clone, Copy)]
pub(crate) struct Decision {
    /// 0: nothing to do; else a [`guard`] action.
    pub(crate) action: u8,
    pub(crate) rule: u8,
    /// The value the kernel's handler gets (the floor for a raise); for an over-budget
    /// decision, the receive bytes not granted.
    pub(crate) applied: i32,
    /// For a skipped TCP size request: the buffer it would have locked (the readback).
    would: i32,
}

impl Decision {
    const NONE: Self = Self {
        action: 0,
        rule: 0,
        applied: 0,
        would: 0,
    };
}

/// The lease of a persisted guard (`--guard.persist`): the `bpf_ktime_get_ns` time until
/// which it acts, renewed by the running bufscope. Once it passed (no bufscope for
/// `--guard.lease`: crashed, uninstalled), the guard is off: it fails open.
#[map]
static GUARD_LEASE: Array<u64> = Array::with_max_entries(maps::GUARD_LEASE.default_entries, 0);

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

/// `SOCK_MIN_RCVBUF` on 64-bit kernels (2048 + the aligned `struct sk_buff`): the smallest
/// receive buffer a size request gives.
const SOCK_MIN_RCVBUF: i64 = 2304;
/// `SOCK_MIN_SNDBUF` (twice `SOCK_MIN_RCVBUF`).
const SOCK_MIN_SNDBUF: i64 = 4608;

/// The buffer a `SO_RCVBUF`/`SO_SNDBUF` (`max`: `rmem_max`/`wmem_max`, 0 when unknown) or
/// `*FORCE` (`max` None) of `val` locks, as `sk_setsockopt` computes it.
#[inline(always)]
fn locked_size(val: i32, max: Option<u64>, min: i64) -> Option<i64> {
    let v = match max {
        // min_t(u32, val, max): a negative value is "as much as allowed".
        Some(0) => return None,
        Some(max) => (val as u32 as u64).min(max) as i64,
        // *FORCE: max(val, 0).
        None => (val as i64).max(0),
    };
    Some((v.min(i32::MAX as i64 / 2) * 2).max(min))
}

/// Whether a TCP buffer call would take away: lock a buffer of socket `sk` (a plain address)
/// below what autotuning can reach in its network namespace. `Some((true, would))`: skip it
/// (`would`: the size it would have locked, 0 for `SO_BUF_LOCK`); `Some((false, _))`:
/// honour it; None: not a locking call the kernel would accept (left to the kernel).
#[inline(always)]
fn tcp_takes_away(sk: u64, optname: i32, requested: i32, net_admin: bool) -> Option<(bool, i32)> {
    let net: u64 = kread(sk, cfg!(sk_net));
    let rmem2: i32 = kread(net, cfg!(net_tcp_rmem_max));
    let wmem2: i32 = kread(net, cfg!(net_tcp_wmem_max));
    let limit = |slot: u32| GUARD_STATE.get(slot).copied().unwrap_or(0);
    let (size, ceiling) = match optname {
        SO_RCVBUF => (
            locked_size(
                requested,
                Some(limit(guard::STATE_RMEM_MAX)),
                SOCK_MIN_RCVBUF,
            ),
            rmem2,
        ),
        SO_SNDBUF => (
            locked_size(
                requested,
                Some(limit(guard::STATE_WMEM_MAX)),
                SOCK_MIN_SNDBUF,
            ),
            wmem2,
        ),
        SO_RCVBUFFORCE if net_admin => (locked_size(requested, None, SOCK_MIN_RCVBUF), rmem2),
        SO_SNDBUFFORCE if net_admin => (locked_size(requested, None, SOCK_MIN_SNDBUF), wmem2),
        SO_BUF_LOCK => {
            let bits = requested & SOCK_BUF_LOCK_MASK as i32;
            if requested & !(SOCK_BUF_LOCK_MASK as i32) != 0 || bits == 0 {
                return None;
            }
            // SOCK_SNDBUF_LOCK = 1, SOCK_RCVBUF_LOCK = 2: the sizes stay what they are now.
            let rcv: i32 = kread(sk, cfg!(sk_rcvbuf));
            let snd: i32 = kread(sk, cfg!(sk_sndbuf));
            let away = (bits & 2 != 0 && rcv < rmem2) || (bits & 1 != 0 && snd < wmem2);
            return Some((away, 0));
        }
        _ => return None,
    };
    match size {
        // Unknown rmem_max/wmem_max: what the kernel would clamp to cannot be told, so the
        // call is skipped (autotuning is never less than it).
        None => Some((true, 0)),
        Some(size) => Some((size < ceiling as i64, size as i32)),
    }
}

/// The decision for a buffer `setsockopt` of `optname` = `requested` (`optlen` bytes; 0 when
/// the program cannot read the value) on socket `sk` (`sk_addr`: its plain address) whose
/// [`transport`] is `proto`, called by `owner` (`net_admin`: it would pass
/// `capable(CAP_NET_ADMIN)`). `cgroup/setsockopt`: the scope is read from the task, as the
/// program type has neither the comm nor the ancestor-cgroup helper before 6.1.
///
/// A TCP call is decided only when the kernel would have accepted it (`optlen` >= 4, valid
/// `SO_BUF_LOCK` bits, the capability for `*FORCE`): otherwise the kernel runs it and the
/// caller gets the kernel's own error.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn decide_setsockopt(
    sk: *mut bpf_sock,
    sk_addr: u64,
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
    let enforce = mode == guard::MODE_ENFORCE;
    let rules = guard_cfg!(rules);
    let act = |rule: u32, enforced: u8, applied: i32, would: i32| Decision {
        action: if enforce {
            enforced
        } else {
            guard::ACTION_OBSERVED
        },
        rule: rule as u8,
        applied,
        would,
    };
    if proto == IPPROTO_TCP && rules & guard::RULE_TCP_AUTOTUNE != 0 {
        return match tcp_takes_away(sk_addr, optname, requested, net_admin) {
            Some((true, would)) => act(guard::RULE_TCP_AUTOTUNE, guard::ACTION_SKIPPED, 0, would),
            // Honoured in both modes: nothing to change.
            Some((false, _)) => Decision {
                action: guard::ACTION_HONOURED,
                rule: guard::RULE_TCP_AUTOTUNE as u8,
                applied: requested,
                would: 0,
            },
            None => Decision::NONE,
        };
    }
    if proto == IPPROTO_UDP && rules & guard::RULE_UDP_FLOOR != 0 {
        let receive = matches!(optname, SO_RCVBUF | SO_RCVBUFFORCE);
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
        if floor <= 0 {
            return Decision::NONE;
        }
        if !smaller {
            // The application sizes its receive buffer itself, at least to the floor: what
            // the guard granted it is no longer the guard's.
            if receive
                && enforce
                && let Some(st) = guard_sk(sk.cast(), false)
            {
                release(st);
            }
            return Decision::NONE;
        }
        if receive && enforce {
            let grant = floor as u64 * 2;
            let Some(st) = guard_sk(sk.cast(), true) else {
                // Without storage the grant could never be given back: no raise.
                return Decision::NONE;
            };
            if st.granted == 0 {
                if !charge(grant) {
                    left_out(st, grant);
                    return Decision {
                        action: guard::ACTION_OVER_BUDGET,
                        rule: guard::RULE_UDP_FLOOR as u8,
                        applied: grant.min(i32::MAX as u64) as i32,
                        would: 0,
                    };
                }
                st.granted = grant;
            }
        }
        return act(guard::RULE_UDP_FLOOR, guard::ACTION_RAISED, floor, 0);
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

/// Whether the calling process (`tgid`) is in scope, from a cgroup socket program (they have
/// the pid and ancestor-cgroup helpers).
#[inline(always)]
fn caller_in_scope(tgid: u32) -> bool {
    let ancestor = |level: u32| unsafe { bpf_get_current_ancestor_cgroup_id(level as i32) };
    in_scope(tgid, leader_comm, ancestor)
}

/// Raises the UDP socket behind `sk` (the program's context: what `bpf_getsockopt`/
/// `bpf_setsockopt` take in these program types) to the floors where it is below them (the
/// receive side within the budget), and reports the decision unless one was already reported
/// for the socket under this generation (`st`; the inode of `sk_addr`, seen at `hook`).
#[inline(always)]
fn raise_udp(sk: *mut c_void, sk_addr: u64, hook: u8, st: &mut Option<&mut GuardSk>) {
    let mode = mode();
    let enforce = mode == guard::MODE_ENFORCE;
    let mut applied = 0;
    let mut ret = 0;
    let mut optname = 0;
    let mut over = 0u64;
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
        let mut charged = false;
        if enforce && opt == SO_RCVBUF {
            let grant = floor as u64 * 2;
            let Some(s) = st.as_mut() else {
                // Without storage the grant could never be given back: no raise.
                continue;
            };
            if s.granted == 0 {
                if !charge(grant) {
                    left_out(s, grant);
                    over = grant;
                    continue;
                }
                s.granted = grant;
                charged = true;
            }
        }
        if optname == 0 {
            (optname, applied) = (opt, floor);
        }
        if enforce {
            let mut v = floor;
            let r = unsafe { bpf_setsockopt(sk, SOL_SOCKET, opt, (&raw mut v).cast(), 4) } as i32;
            if ret == 0 {
                ret = r;
            }
            // Not raised: nothing granted.
            if r != 0
                && charged
                && let Some(s) = st.as_mut()
            {
                release(s);
            }
        }
    }
    let action = if over != 0 {
        (optname, applied) = (SO_RCVBUF, over.min(i32::MAX as u64) as i32);
        guard::ACTION_OVER_BUDGET
    } else if enforce {
        guard::ACTION_RAISED
    } else {
        guard::ACTION_OBSERVED
    };
    if optname == 0 || !first_decision(st, guard::RULE_UDP_FLOOR) {
        return;
    }
    let d = Decision {
        action,
        rule: guard::RULE_UDP_FLOOR as u8,
        applied,
        would: 0,
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
/// decided once per policy generation (the first such call by a process in scope); every later
/// call is one storage lookup. A caller out of scope marks nothing, so the process in scope
/// that later uses the socket (socket activation, a launcher that binds and execs) decides it.
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
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if let Some(st) = guard_sk(sk.cast(), false)
        && st.generation == guard_cfg!(generation)
        && (st.raised != 0 || (hook == guard::HOOK_SENDMSG && st.outside_tgid == tgid))
    {
        return 1;
    }
    if !caller_in_scope(tgid) {
        // Only sends remember who was out of scope (a send is every datagram; a bind or
        // connect is once): the mark is never "decided".
        if hook == guard::HOOK_SENDMSG
            && let Some(st) = guard_sk(sk.cast(), true)
        {
            current(st);
            st.outside_tgid = tgid;
        }
        return 1;
    }
    let mut st = guard_sk(sk.cast(), true);
    if let Some(st) = st.as_mut() {
        current(st);
        st.raised = 1;
    }
    raise_udp(ctx.sock_addr.cast(), addr_of(sk), hook, &mut st);
    1
}

/// `cgroup/bind4`.
#[cgroup_sock_addr(bind4)]
pub fn guard_bind4(ctx: SockAddrContext) -> i32 {
    raise_udp_once(&ctx, guard::HOOK_BIND)
}

/// `cgroup/bind6`.
#[cgroup_sock_addr(bind6)]
pub fn guard_bind6(ctx: SockAddrContext) -> i32 {
    raise_udp_once(&ctx, guard::HOOK_BIND)
}

/// `cgroup/connect4`.
#[cgroup_sock_addr(connect4)]
pub fn guard_connect4(ctx: SockAddrContext) -> i32 {
    raise_udp_once(&ctx, guard::HOOK_CONNECT)
}

/// `cgroup/connect6`.
#[cgroup_sock_addr(connect6)]
pub fn guard_connect6(ctx: SockAddrContext) -> i32 {
    raise_udp_once(&ctx, guard::HOOK_CONNECT)
}

/// `cgroup/sendmsg4` (`--guard.udp-unbound-senders`: unconnected sends with an address).
#[cgroup_sock_addr(sendmsg4)]
pub fn guard_sendmsg4(ctx: SockAddrContext) -> i32 {
    raise_udp_once(&ctx, guard::HOOK_SENDMSG)
}

/// `cgroup/sendmsg6` (`--guard.udp-unbound-senders`).
#[cgroup_sock_addr(sendmsg6)]
pub fn guard_sendmsg6(ctx: SockAddrContext) -> i32 {
    raise_udp_once(&ctx, guard::HOOK_SENDMSG)
}

/// `cgroup/sock_release` (enforce): a closing UDP socket gives its grant back to the budget
/// (its storage goes with it). One storage lookup per closed UDP socket; nothing for others.
#[cgroup_sock(sock_release)]
pub fn guard_sock_release(ctx: SockContext) -> i32 {
    if guard_cfg!(mode) != guard::MODE_ENFORCE {
        return 1;
    }
    let sk = unsafe { &*ctx.sock };
    if sk.protocol != IPPROTO_UDP as u32 {
        return 1;
    }
    if let Some(st) = guard_sk(ctx.sock.cast(), false) {
        release(st);
    }
    1
}

/// `cgroup/getsockopt` (enforce only): `SO_RCVBUF`/`SO_SNDBUF` of a TCP socket whose request the
/// guard skipped read back as the larger of what the socket has and what the request would
/// have given (never more than either); everything else is untouched. An `optlen` above a
/// page is reset on every path ("keep the kernel's result": before 6.5 the call fails with
/// EFAULT otherwise).
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
    let would = st.asked[slot];
    if would <= 0 {
        return;
    }
    let optval = unsafe { so.__bindgen_anon_2.optval } as *mut u8;
    let end = unsafe { so.__bindgen_anon_3.optval_end } as *const u8;
    if so.optlen < 4 || unsafe { optval.add(4) } as *const u8 > end {
        return;
    }
    let actual = unsafe { core::ptr::read_unaligned(optval as *const i32) };
    if would > actual {
        unsafe { core::ptr::write_unaligned(optval as *mut i32, would) };
    }
}
