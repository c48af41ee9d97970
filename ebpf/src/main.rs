//! bufscope's BPF programs. Tracepoint-first: every signal has a path that needs neither
//! kprobes nor fentry/fexit (refused on some kernels).
//!
//! | signal | program | map |
//! |---|---|---|
//! | buffer-full drops | `tp_btf/kfree_skb` | `DROPS` (per socket inode × reason) |
//! | buffer setsockopt calls | `cgroup/setsockopt` ([`cgroup`]; fallback `syscalls/sys_{enter,exit}_setsockopt`) | `EVENTS` ([`SockoptEvent`]) |
//! | window-scale shrink | `tp_btf/inet_sock_set_state` | `EVENTS` ([`EstablishedEvent`]) |
//! | autotuning suppressed | `tp_btf/tcp_rcvbuf_grow` | `AUTOTUNE` (per socket inode) |
//! | socket owners | `cgroup/sock_create` ([`cgroup`]; fallback `syscalls/sys_exit_{socket,accept,accept4}`), setsockopt, SYN_SENT, LISTEN | `OWNERS`, `LISTENERS` |
//! | readers of shared dropping sockets | `tp_btf/sock_recv_length` ([`reader`]), attached only while a socket is watched | `WATCHED`, `READERS` |
//!
//! Drop hooks run in softirq where `current` is whoever was interrupted (usually the sender),
//! so nothing here attributes a drop to `current`: drops are keyed by the socket's inode, and
//! the owner of each inode is recorded in process context by the owner hooks (or found by
//! userspace in `/proc` for sockets that predate the exporter).
//!
//! Struct offsets are not compiled in: userspace resolves them from the running kernel's BTF
//! and patches `CONFIG` (in `.rodata`, so the verifier treats them as constants).
#![no_std]
#![no_main]

use aya_ebpf::{
    EbpfContext as _,
    bindings::{BPF_NOEXIST, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_get_current_task_btf, bpf_jiffies64, bpf_probe_read_kernel, bpf_probe_read_user,
        bpf_skc_to_tcp_sock,
    },
    macros::{btf_tracepoint, map, tracepoint},
    maps::{HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{BtfTracePointContext, TracePointContext},
};
use aya_log_ebpf::debug;
use bufscope_common::{
    AutotuneVal, Config, DropKey, DropVal, EstablishedEvent, Field, IPPROTO_TCP, Owner,
    SO_BUF_LOCK, SO_RCVBUF, SO_RCVBUFFORCE, SO_SNDBUF, SO_SNDBUFFORCE, SOCK_BUF_LOCK_MASK,
    SOCK_RCVBUF_LOCK, SOL_SOCKET, SockoptEvent, TCP_CLOSE, TCP_ESTABLISHED, TCP_LISTEN,
    TCP_SYN_RECV, TCP_SYN_SENT, drop_site, estab_flags, event_kind, stat,
};

/// Kernel layout + behaviour, patched by userspace before load (see [`Config`]).
#[unsafe(no_mangle)]
static CONFIG: Config = Config::zeroed();

/// Reads one `CONFIG` field without letting the compiler fold it to the compiled-in zero.
macro_rules! cfg {
    ($($f:tt)+) => {
        unsafe { core::ptr::read_volatile(&raw const $crate::CONFIG.$($f)+) }
    };
}

mod cgroup;
mod compat;
mod guard;
mod reader;

// ---------------------------------------------------------------------------------------------
// Maps. Sizes are defaults; userspace may resize them at load (`--bpf.*-entries`).
// ---------------------------------------------------------------------------------------------

/// Socket inode → the process that owns it (recorded in process context).
#[map]
static OWNERS: LruHashMap<u64, Owner> = LruHashMap::with_max_entries(65536, 0);

/// (netns, local port) → owner of the TCP listener, for passive opens (the child has no inode
/// yet when it reaches ESTABLISHED, and `current` is then the softirq's victim).
#[map]
static LISTENERS: LruHashMap<ListenKey, Owner> = LruHashMap::with_max_entries(16384, 0);

/// Buffer-full drops per (socket, reason).
#[map]
static DROPS: PerCpuHashMap<DropKey, DropVal> = PerCpuHashMap::with_max_entries(16384, 0);

/// `tcp_rcvbuf_grow` events per socket inode.
#[map]
static AUTOTUNE: PerCpuHashMap<u64, AutotuneVal> = PerCpuHashMap::with_max_entries(16384, 0);

/// Low-rate events with detail (setsockopt calls, established connections).
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// setsockopt calls in flight: `pid_tgid` → what `sys_enter` saw. A plain (preallocated)
/// hash, not an LRU: an LRU insert took half of `sys_enter`'s cost (240 → 126 ns without it).
/// Every entry is removed by the same thread's `sys_exit` (setsockopt always returns), and a
/// thread's next call overwrites its own key; a failed insert is counted
/// (`stat::PENDING_FULL`, exported as `bufscope_bpf_events_lost_total{cause="pending_map_full"}`).
#[map]
static PENDING: HashMap<u64, Pending> = HashMap::with_max_entries(4096, 0);

/// The probes' own health counters (indexes in [`stat`]).
#[map]
static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stat::COUNT, 0);

/// Key of [`LISTENERS`].
#[repr(C)]
#[derive(Clone, Copy)]
struct ListenKey {
    netns: u32,
    port: u32,
}

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

// ---------------------------------------------------------------------------------------------
// Kernel memory helpers
// ---------------------------------------------------------------------------------------------

/// Reads a `T` at `base + off` from kernel memory (0 on fault).
#[inline(always)]
fn kread<T: Copy + Default>(base: u64, off: u32) -> T {
    if base == 0 {
        return T::default();
    }
    unsafe { bpf_probe_read_kernel((base + off as u64) as *const T) }.unwrap_or_default()
}

/// Reads a (bit)field described by a [`Field`].
#[inline(always)]
fn kread_field(base: u64, f: Field) -> u32 {
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
fn load<T: Copy>(base: u64, off: u32) -> T {
    // SAFETY: see above; the verifier rewrites this into an exception-table-protected load.
    unsafe { core::ptr::read_volatile((base as *const u8).add(off as usize) as *const T) }
}

/// [`kread_field`] with direct loads: reads exactly the bytes that hold the (bit)field, so the
/// access never crosses into the next member. `f` is a constant to the verifier, which keeps
/// only the branch for this kernel's layout.
#[inline(always)]
fn load_field(base: u64, f: Field) -> u32 {
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

/// `sock_i_ino(sk)` for a BTF-typed `sk`: the `sk_ino` cache where the kernel has one (one
/// load), else `SOCK_INODE(sk->sk_socket)->i_ino` (one load and one helper call: the inode
/// sits after `struct socket` in `struct socket_alloc`, outside what the verifier lets a
/// `struct socket *` reach). 0 when the sock has no socket.
#[inline(always)]
fn btf_sk_inode(sk: u64) -> u64 {
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
fn btf_sk_netns(sk: u64) -> u32 {
    let net: u64 = load(sk, cfg!(sk_net));
    load(net, cfg!(net_inum))
}

#[inline(always)]
fn stat_inc(idx: u32) {
    if let Some(p) = STATS.get_ptr_mut(idx) {
        unsafe { *p += 1 };
    }
}

/// `sock_net(sk)->ns.inum`.
#[inline(always)]
fn sk_netns(sk: u64) -> u32 {
    let net: u64 = kread(sk, cfg!(sk_net));
    kread(net, cfg!(net_inum))
}

#[inline(always)]
fn sk_userlocks(sk: u64) -> u32 {
    kread_field(sk, cfg!(sk_userlocks)) & SOCK_BUF_LOCK_MASK as u32
}

/// [`sk_userlocks`] for a BTF-typed `sk`.
#[inline(always)]
fn btf_sk_userlocks(sk: u64) -> u32 {
    load_field(sk, cfg!(sk_userlocks)) & SOCK_BUF_LOCK_MASK as u32
}

/// `current` as a BTF-typed (trusted) `struct task_struct *`, for [`load`].
#[inline(always)]
fn current_task() -> u64 {
    unsafe { bpf_get_current_task_btf() as u64 }
}

/// The calling process, as recorded for owners and setsockopt events.
#[inline(always)]
fn current_owner() -> Owner {
    let pid_tgid = bpf_get_current_pid_tgid();
    let leader: u64 = load(current_task(), cfg!(task_group_leader));
    let start_ns = if leader == 0 {
        0
    } else {
        load::<u64>(leader, cfg!(task_start_boottime))
    };
    Owner {
        tgid: (pid_tgid >> 32) as u32,
        pid: pid_tgid as u32,
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        start_ns,
        comm: bpf_get_current_comm().unwrap_or_default(),
    }
}

/// `current->files->fdt->fd[fd]` (a `struct file *`), 0 when out of range. Direct loads down
/// to the fd array (a plain pointer to the verifier), then one helper read.
#[inline(always)]
fn fd_file(fd: u64) -> u64 {
    let files: u64 = load(current_task(), cfg!(task_files));
    if files == 0 {
        return 0;
    }
    let fdt: u64 = load(files, cfg!(files_fdt));
    if fdt == 0 {
        return 0;
    }
    let max_fds: u32 = load(fdt, cfg!(fdt_max_fds));
    if fd >= max_fds as u64 {
        return 0;
    }
    let fd_array: u64 = load(fdt, cfg!(fdt_fd));
    if fd_array == 0 {
        return 0;
    }
    unsafe { bpf_probe_read_kernel((fd_array + fd * 8) as *const u64) }.unwrap_or(0)
}

/// `bpf_ringbuf_submit` flags. With `CONFIG.ringbuf_wakeup_bytes == 0`, the kernel's default
/// (wake the reader when it has caught up, i.e. for nearly every event at low rates; each
/// wake-up is an irq_work self-IPI, about 1 µs in a VM). Otherwise no wake-up until that much
/// data waits: the reader must then also drain on a timer.
#[inline(always)]
fn submit_flags() -> u64 {
    let bytes = cfg!(ringbuf_wakeup_bytes);
    if bytes == 0 {
        return 0;
    }
    if EVENTS.query(BPF_RB_AVAIL_DATA as u64) >= bytes as u64 {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

/// Records `current` as the owner of the socket behind `file`.
#[inline(always)]
fn record_owner_of_file(file: u64) {
    let inode: u64 = kread(file, cfg!(file_inode));
    let ino: u64 = kread(inode, cfg!(inode_ino));
    if ino != 0 {
        record_owner(ino);
    }
}

/// Whether `OWNERS` already names the calling process for `inode` (usually: `socket()` was
/// seen); a lookup costs much less than the LRU update it saves.
#[inline(always)]
fn owned_by_current(inode: u64) -> bool {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    unsafe { OWNERS.get(&inode) }.is_some_and(|o| o.tgid == tgid)
}

/// Records `owner` (the caller, in process context) for `inode` unless `OWNERS` already names
/// it: an LRU update costs a lock and an element swap, and most calls come from the recorded
/// owner.
#[inline(always)]
fn record_caller_as_owner(inode: u64, owner: &Owner) {
    let known = unsafe { OWNERS.get(&inode) }
        .is_some_and(|o| o.tgid == owner.tgid && o.start_ns == owner.start_ns);
    if inode != 0 && !known && OWNERS.insert(&inode, owner, 0).is_err() {
        stat_inc(stat::OWNERS_FULL);
    }
}

#[inline(always)]
fn record_owner(inode: u64) {
    let owner = current_owner();
    if OWNERS.insert(&inode, &owner, 0).is_err() {
        stat_inc(stat::OWNERS_FULL);
    }
}

/// Reads a field of a classic tracepoint record (the record is directly readable).
#[inline(always)]
fn tp_field<T: Copy>(ctx: &TracePointContext, off: usize) -> T {
    unsafe { core::ptr::read_unaligned(ctx.as_ptr().add(off) as *const T) }
}

// ---------------------------------------------------------------------------------------------
// Owners: syscalls that return a new socket fd (process context).
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// setsockopt(SOL_SOCKET, SO_{RCV,SND}BUF{,FORCE} | SO_BUF_LOCK)
// ---------------------------------------------------------------------------------------------

#[inline(always)]
fn is_buffer_option(optname: i32) -> bool {
    matches!(
        optname,
        SO_RCVBUF | SO_SNDBUF | SO_RCVBUFFORCE | SO_SNDBUFFORCE | SO_BUF_LOCK
    )
}

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
        proto: kread_field(sk, cfg!(sk_protocol)) as u8,
        flags: 0,
        family: kread(sk, cfg!(sk_family)),
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

// ---------------------------------------------------------------------------------------------
// TCP state: listener owners, active-open owners, window scale at ESTABLISHED
// ---------------------------------------------------------------------------------------------

/// `tp_btf/inet_sock_set_state(const struct sock *sk, int oldstate, int newstate)`.
#[btf_tracepoint(function = "inet_sock_set_state")]
pub fn inet_sock_set_state(ctx: BtfTracePointContext) -> i32 {
    let newstate: i32 = ctx.arg(2);
    let oldstate: i32 = ctx.arg(1);
    let closing_listener = oldstate == TCP_LISTEN && newstate == TCP_CLOSE;
    if newstate != TCP_ESTABLISHED
        && newstate != TCP_LISTEN
        && newstate != TCP_SYN_SENT
        && !closing_listener
    {
        return 0;
    }
    let sk: u64 = ctx.arg(0);
    if load_field(sk, cfg!(sk_protocol)) != IPPROTO_TCP as u32 {
        return 0;
    }
    let netns = btf_sk_netns(sk);
    let lport: u16 = load(sk, cfg!(sk_num));
    let lkey = ListenKey {
        netns,
        port: lport as u32,
    };
    match newstate {
        // listen(): process context, `current` owns the listener.
        TCP_LISTEN => {
            let _ = LISTENERS.insert(&lkey, &current_owner(), 0);
        }
        // connect(): process context, `current` owns the socket.
        TCP_SYN_SENT => {
            let inode = btf_sk_inode(sk);
            if inode != 0 && !owned_by_current(inode) {
                record_owner(inode);
            }
        }
        TCP_CLOSE => {
            let _ = LISTENERS.remove(&lkey);
        }
        _ => established(sk, oldstate, netns, lport, &lkey),
    }
    0
}

#[inline(always)]
fn established(sk: u64, oldstate: i32, netns: u32, lport: u16, lkey: &ListenKey) {
    let passive = oldstate == TCP_SYN_RECV;
    let inode = if passive { 0 } else { btf_sk_inode(sk) };
    // softirq context (SYN-ACK / final ACK): never `current`.
    let owner = if passive {
        unsafe { LISTENERS.get(lkey) }.copied()
    } else if inode != 0 {
        unsafe { OWNERS.get(&inode) }.copied()
    } else {
        None
    };
    // `struct tcp_sock` members lie beyond `struct sock`: the verifier needs a `tcp_sock *`.
    let tp = unsafe { bpf_skc_to_tcp_sock(sk as *mut _) } as u64;
    if tp == 0 {
        return;
    }
    let mut flags = 0;
    if passive {
        flags |= estab_flags::PASSIVE;
    }
    if load_field(tp, cfg!(tcp_wscale_ok)) != 0 {
        flags |= estab_flags::WSCALE_OK;
    }
    if owner.is_some() {
        flags |= estab_flags::OWNER_KNOWN;
    }
    let net: u64 = load(sk, cfg!(sk_net));
    let Some(mut entry) = EVENTS.reserve::<EstablishedEvent>(0) else {
        stat_inc(stat::RINGBUF_FULL);
        return;
    };
    entry.write(EstablishedEvent {
        kind: event_kind::ESTABLISHED,
        flags,
        owner: owner.unwrap_or_default(),
        inode,
        netns,
        rcvbuf: load(sk, cfg!(sk_rcvbuf)),
        tcp_rmem_max: load(net, cfg!(net_tcp_rmem_max)),
        window_clamp: load(tp, cfg!(tcp_window_clamp)),
        lport,
        family: load(sk, cfg!(sk_family)),
        rcv_wscale: load_field(tp, cfg!(tcp_rcv_wscale)) as u8,
        snd_wscale: load_field(tp, cfg!(tcp_snd_wscale)) as u8,
        userlocks: btf_sk_userlocks(sk) as u8,
        window_scaling: load_field(net, cfg!(net_tcp_window_scaling)) as u8,
    });
    entry.submit(submit_flags());
}

// ---------------------------------------------------------------------------------------------
// Autotuning: tcp_rcvbuf_grow fires when the reader copied more than a window's worth in one
// RTT (the kernel wants a bigger buffer); it fires before the lock check.
// ---------------------------------------------------------------------------------------------

/// `tp_btf/tcp_rcvbuf_grow(struct sock *sk, int time)`.
#[btf_tracepoint(function = "tcp_rcvbuf_grow")]
pub fn tcp_rcvbuf_grow(ctx: BtfTracePointContext) -> i32 {
    let sk: u64 = ctx.arg(0);
    let time: i32 = ctx.arg(1);
    let inode = btf_sk_inode(sk);
    if inode == 0 {
        return 0;
    }
    let tp = unsafe { bpf_skc_to_tcp_sock(sk as *mut _) } as u64;
    if tp == 0 {
        return 0;
    }
    let copied_seq: u32 = load(tp, cfg!(tcp_copied_seq));
    let space_seq: u32 = load(tp, cfg!(tcp_rcvq_space_seq));
    let interval_us = if time > 0 { time as u64 } else { 0 };
    count_grow(
        sk,
        tp,
        inode,
        interval_us,
        copied_seq.wrapping_sub(space_seq) as u64,
    );
    0
}

/// Counts one grow event on socket `inode` (BTF-typed `sk` and its `tcp_sock` `tp`): the
/// reader consumed `copied` bytes in the measurement interval `interval_us`. Shared by
/// [`tcp_rcvbuf_grow`] and the older kernels' hooks in [`compat`].
#[inline(always)]
fn count_grow(sk: u64, tp: u64, inode: u64, interval_us: u64, copied: u64) {
    let locks = btf_sk_userlocks(sk);
    let net: u64 = load(sk, cfg!(sk_net));
    let moderate = {
        let f = cfg!(net_tcp_moderate_rcvbuf);
        // Kernels without the per-netns field always moderate (unless globally off).
        if f.present() { load_field(net, f) } else { 1 }
    };
    let suppressed = (locks & SOCK_RCVBUF_LOCK as u32) != 0 || moderate == 0;
    let rtt8: u32 = load(tp, cfg!(tcp_rcv_rtt_us));
    let rcvbuf: i32 = load(sk, cfg!(sk_rcvbuf));
    let now = unsafe { bpf_jiffies64() };
    let update = |v: &mut AutotuneVal| {
        v.grow_events += 1;
        if suppressed {
            v.suppressed += 1;
        }
        v.copied = copied;
        v.interval_us = interval_us;
        v.last_ns = now;
        v.rtt_us = rtt8 >> 3;
        v.rcvbuf = rcvbuf;
        v.userlocks = locks;
    };
    if let Some(p) = AUTOTUNE.get_ptr_mut(&inode) {
        update(unsafe { &mut *p });
        stat_inc(stat::AUTOTUNE_SEEN);
        return;
    }
    let mut v = AutotuneVal {
        netns: btf_sk_netns(sk),
        ..AutotuneVal::default()
    };
    update(&mut v);
    if AUTOTUNE.insert(&inode, &v, BPF_NOEXIST as u64).is_err() {
        // Lost a race with another CPU (the entry now exists) or the map is full.
        match AUTOTUNE.get_ptr_mut(&inode) {
            Some(p) => update(unsafe { &mut *p }),
            None => stat_inc(stat::AUTOTUNE_MAP_FULL),
        }
    }
    // After the update: userspace skips reading AUTOTUNE while this has not moved.
    stat_inc(stat::AUTOTUNE_SEEN);
}

// ---------------------------------------------------------------------------------------------
// Drops: kfree_skb with a tracked reason. This runs for every dropped skb on the machine, so
// the untracked-reason exit comes first and costs two instructions.
// ---------------------------------------------------------------------------------------------

#[inline(always)]
fn reason_tracked(reason: u32) -> bool {
    if reason >= 256 {
        return false;
    }
    let word: u64 = match reason >> 6 {
        0 => cfg!(reason_mask[0]),
        1 => cfg!(reason_mask[1]),
        2 => cfg!(reason_mask[2]),
        _ => cfg!(reason_mask[3]),
    };
    word & (1u64 << (reason & 63)) != 0
}

/// Segments carried by a GRO/GSO skb (`skb_shinfo(skb)->gso_segs`), at least 1. `skb` is the
/// BTF-typed tracepoint argument; `head` is a plain byte pointer to the verifier, so the
/// shared info needs one helper read.
#[inline(always)]
fn skb_segs(skb: u64) -> u64 {
    let head: u64 = load(skb, cfg!(skb_head));
    let shinfo = if cfg!(skb_end_is_offset) != 0 {
        let end: u32 = load(skb, cfg!(skb_end));
        head + end as u64
    } else {
        load::<u64>(skb, cfg!(skb_end))
    };
    let segs: u16 = kread(shinfo, cfg!(shinfo_gso_segs));
    if segs == 0 { 1 } else { segs as u64 }
}

/// `tp_btf/kfree_skb(struct sk_buff *skb, void *location, enum skb_drop_reason reason,
/// struct sock *rx_sk)` (rx_sk: 6.11+).
///
/// Per dropped packet: the reason filter, then direct (PROBE_MEM) loads through the typed
/// `rx_sk`/`skb` pointers — one helper call (`gso_segs`) instead of one per field — and one
/// per-CPU hash update. Keys and values are built field by field (no `Default` + update:
/// that compiles to calls of a `memset` subprogram).
#[btf_tracepoint(function = "kfree_skb")]
pub fn kfree_skb(ctx: BtfTracePointContext) -> i32 {
    let reason: u32 = ctx.arg(2);
    if !reason_tracked(reason) {
        return 0;
    }
    let skb: u64 = ctx.arg(0);
    let sk: u64 = ctx.arg(3);
    let key;
    let (rcvbuf, rmem_alloc);
    let mut ifname = [0u8; 16];
    if sk != 0 {
        key = socket_key(sk, reason);
        rcvbuf = load::<i32>(sk, cfg!(sk_rcvbuf));
        rmem_alloc = load::<i32>(sk, cfg!(sk_rmem_alloc));
    } else if reason == cfg!(reason_full_ring) {
        // A full TUN/TAP ring: no socket; the device's owner is found by userspace. Rare:
        // helper reads are fine here.
        let dev: u64 = kread(skb, cfg!(skb_dev));
        key = DropKey {
            inode: 0,
            netns: kread(kread::<u64>(dev, cfg!(dev_net)), cfg!(net_inum)),
            id: kread(dev, cfg!(dev_ifindex)),
            reason: reason as u16,
            proto: 0,
            site: drop_site::DEVICE,
            _pad: 0,
        };
        ifname = kread(dev, cfg!(dev_name));
        (rcvbuf, rmem_alloc) = (0, 0);
    } else {
        return 0;
    }
    let val = DropVal {
        packets: skb_segs(skb),
        skbs: 1,
        rcvbuf,
        rmem_alloc,
        last_ns: unsafe { bpf_jiffies64() },
        ifname,
    };
    record_drop(&key, &val);
    0
}

/// [`count_drop`], then the generation: userspace skips reading `DROPS` while
/// `stat::DROPS_SEEN` has not moved, so it moves after the update.
#[inline(always)]
fn record_drop(key: &DropKey, val: &DropVal) {
    count_drop(key, val);
    stat_inc(stat::DROPS_SEEN);
}

/// The `DROPS` key of a drop on the BTF-typed socket `sk`: by its inode, or by its local port
/// when it has none (a TCP child not accepted yet).
#[inline(always)]
fn socket_key(sk: u64, reason: u32) -> DropKey {
    let inode = btf_sk_inode(sk);
    let (site, id) = if inode == 0 {
        stat_inc(stat::DROP_NO_INODE);
        (
            drop_site::SOCKET_NO_INODE,
            load::<u16>(sk, cfg!(sk_num)) as u32,
        )
    } else {
        (drop_site::SOCKET, 0)
    };
    DropKey {
        inode,
        netns: btf_sk_netns(sk),
        id,
        reason: reason as u16,
        proto: load_field(sk, cfg!(sk_protocol)) as u8,
        site,
        _pad: 0,
    }
}

/// Adds one dropped skb (`val`: its segments, and the socket's state now) to `DROPS`.
#[inline(always)]
fn count_drop(key: &DropKey, val: &DropVal) {
    if let Some(p) = DROPS.get_ptr_mut(key) {
        let v = unsafe { &mut *p };
        v.packets += val.packets;
        v.skbs += 1;
        v.rcvbuf = val.rcvbuf;
        v.rmem_alloc = val.rmem_alloc;
        v.last_ns = val.last_ns;
        return;
    }
    if DROPS.insert(key, val, BPF_NOEXIST as u64).is_err() {
        match DROPS.get_ptr_mut(key) {
            Some(p) => {
                let v = unsafe { &mut *p };
                v.packets += val.packets;
                v.skbs += 1;
            }
            None => stat_inc(stat::DROPS_MAP_FULL),
        }
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// GPL: `bpf_probe_read_kernel` and tracing helpers are GPL-only.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
