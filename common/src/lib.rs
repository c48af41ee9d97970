//! Types shared by bufscope's BPF programs (`bufscope-ebpf`) and its userspace (`bufscope`).
//!
//! Everything here is `#[repr(C)]`, has no padding holes that differ between the BPF target
//! and x86_64/aarch64, and is plain old data. Sizes are asserted at compile time on both sides
//! (see the `const` assertions at the bottom), so a layout drift fails the build, not a scrape.
//!
//! Data flow (one signal end to end, drops as the example):
//! `tp_btf/kfree_skb` → [`DropKey`]/[`DropVal`] in the per-CPU hash `DROPS` → the exporter polls
//! it, attributes `DropKey::inode` to a process through `OWNERS` ([`Owner`]) or `/proc` →
//! `bufscope_socket_drops_total{comm,pid,container,proto,reason}` → the Grafana panel
//! "Top processes by drop rate".
#![no_std]

/// `SOL_SOCKET`.
pub const SOL_SOCKET: i32 = 1;
/// `SO_SNDBUF`.
pub const SO_SNDBUF: i32 = 7;
/// `SO_RCVBUF`.
pub const SO_RCVBUF: i32 = 8;
/// `SO_SNDBUFFORCE` (needs CAP_NET_ADMIN in the initial user namespace).
pub const SO_SNDBUFFORCE: i32 = 32;
/// `SO_RCVBUFFORCE` (needs CAP_NET_ADMIN in the initial user namespace).
pub const SO_RCVBUFFORCE: i32 = 33;
/// `SO_BUF_LOCK` (5.14+): sets or clears the lock bits without changing sizes.
pub const SO_BUF_LOCK: i32 = 72;

/// `SOCK_SNDBUF_LOCK` bit of `sk_userlocks`.
pub const SOCK_SNDBUF_LOCK: u8 = 1;
/// `SOCK_RCVBUF_LOCK` bit of `sk_userlocks`: receive autotuning is off for this socket.
pub const SOCK_RCVBUF_LOCK: u8 = 2;
/// Mask of the buffer lock bits (other bits of `sk_userlocks` mean other things).
pub const SOCK_BUF_LOCK_MASK: u8 = 3;

/// `IPPROTO_TCP`.
pub const IPPROTO_TCP: u8 = 6;
/// `IPPROTO_UDP`.
pub const IPPROTO_UDP: u8 = 17;
/// `IPPROTO_UDPLITE`.
pub const IPPROTO_UDPLITE: u8 = 136;

/// `AF_INET`.
pub const AF_INET: u16 = 2;
/// `AF_INET6`.
pub const AF_INET6: u16 = 10;
/// `SOCK_STREAM`.
pub const SOCK_STREAM: u16 = 1;
/// `SOCK_DGRAM`.
pub const SOCK_DGRAM: u16 = 2;

/// The transport a socket is about, from its family, type and protocol: `IPPROTO_TCP` for an
/// `AF_INET`/`AF_INET6` `SOCK_STREAM` TCP socket, `IPPROTO_UDP` (or `IPPROTO_UDPLITE`) for an
/// inet `SOCK_DGRAM` one, 0 for every other socket. `sk_protocol` alone is not enough: a
/// `NETLINK_XFRM` socket has protocol 6 and a raw socket may have 6 or 17.
#[inline(always)]
pub const fn transport(family: u16, sk_type: u16, protocol: u16) -> u8 {
    if family != AF_INET && family != AF_INET6 {
        return 0;
    }
    match (sk_type, protocol) {
        (SOCK_STREAM, 6) => IPPROTO_TCP,
        (SOCK_DGRAM, 17) => IPPROTO_UDP,
        (SOCK_DGRAM, 136) => IPPROTO_UDPLITE,
        _ => 0,
    }
}

/// `TCP_ESTABLISHED` (state numbers are stable kernel ABI of the `inet_sock_set_state` tracepoint).
pub const TCP_ESTABLISHED: i32 = 1;
/// `TCP_SYN_SENT`.
pub const TCP_SYN_SENT: i32 = 2;
/// `TCP_SYN_RECV`.
pub const TCP_SYN_RECV: i32 = 3;
/// `TCP_CLOSE`.
pub const TCP_CLOSE: i32 = 7;
/// `TCP_LISTEN`.
pub const TCP_LISTEN: i32 = 10;

/// Number of 64-bit words in the drop-reason filter bitmap (reasons 0..256).
pub const REASON_WORDS: usize = 4;

/// Kernel drop reasons (`enum skb_drop_reason`, names without `SKB_DROP_REASON_`) bufscope
/// counts by default: the ones that mean "a buffer or queue was full". `--drops.reasons`
/// replaces the list. Their numbers change between kernels, so userspace resolves them by name
/// at start-up (BTF, else the `skb:kfree_skb` tracepoint format) into the filter bitmap.
pub const TRACKED_DROP_REASONS: &[&str] = &[
    "SOCKET_RCVBUFF",
    "PROTO_MEM",
    "SOCKET_BACKLOG",
    "TCP_ZEROWINDOW",
    "TCP_OFO_DROP",
    "TCP_OFO_QUEUE_PRUNE",
    "FULL_RING",
    "NOMEM",
];

/// Where a kernel struct field lives, resolved from the running kernel's BTF at start-up.
///
/// A field is read as the `u32` at byte `off`, shifted right by `shift` and masked to `bits`
/// bits. Plain `u8`/`u16`/`u32` members are `shift = 0, bits = 8/16/32`; bitfields (e.g.
/// `tcp_options_received.rcv_wscale`) carry their bit position. `bits == 0` means "absent on
/// this kernel".
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Field {
    /// Byte offset of the 32-bit word holding the field, from the start of the outer struct.
    pub off: u32,
    /// Right shift applied to that word.
    pub shift: u16,
    /// Width in bits (1..=32); 0 when the field does not exist on this kernel.
    pub bits: u16,
}

impl Field {
    /// Mask for `bits`.
    #[inline(always)]
    pub const fn mask(&self) -> u32 {
        if self.bits >= 32 {
            u32::MAX
        } else {
            (1u32 << self.bits) - 1
        }
    }

    /// True when the field exists on this kernel.
    #[inline(always)]
    pub const fn present(&self) -> bool {
        self.bits != 0
    }
}

impl Config {
    /// All zeroes (the value compiled into the BPF object before userspace patches it).
    pub const fn zeroed() -> Self {
        // SAFETY: every field is an integer or an array of integers; all-zero is valid.
        unsafe { core::mem::zeroed() }
    }
}

/// Kernel layout and configuration, patched into the BPF object's `.rodata` (`CONFIG`) before
/// load. The verifier sees these as constants, so unused branches are pruned.
///
/// Offsets are byte offsets from the start of the named struct unless the name says otherwise.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    // --- fd → file → socket walk (process context, classic syscall tracepoints) ---
    /// `task_struct.files`.
    pub task_files: u32,
    /// `files_struct.fdt`.
    pub files_fdt: u32,
    /// `fdtable.max_fds`.
    pub fdt_max_fds: u32,
    /// `fdtable.fd`.
    pub fdt_fd: u32,
    /// `file.private_data` (a `struct socket *` for socket files).
    pub file_private_data: u32,
    /// `file.f_inode`.
    pub file_inode: u32,
    /// `inode.i_ino`.
    pub inode_ino: u32,
    /// `socket.sk`.
    pub socket_sk: u32,
    /// Offset from a `struct socket` to its inode's `i_ino` (`socket_alloc.vfs_inode` +
    /// `inode.i_ino`): `SOCK_INODE(sock)->i_ino`, the socket's inode number.
    pub socket_ino: u32,
    /// `task_struct.start_boottime` (ns since boot, distinguishes reused pids).
    pub task_start_boottime: u32,
    /// `task_struct.group_leader`.
    pub task_group_leader: u32,

    // --- struct sock ---
    /// `sock.sk_socket`.
    pub sk_socket: u32,
    /// `sock.__sk_common.skc_net` (a `struct net *`).
    pub sk_net: u32,
    /// `sock.__sk_common.skc_family` (u16).
    pub sk_family: u32,
    /// `sock.__sk_common.skc_num` (local port, host order, u16).
    pub sk_num: u32,
    /// `sock.sk_rcvbuf` (int).
    pub sk_rcvbuf: u32,
    /// `sock.sk_sndbuf` (int).
    pub sk_sndbuf: u32,
    /// `sock.sk_backlog.rmem_alloc` (= `sk_rmem_alloc`, atomic int).
    pub sk_rmem_alloc: u32,
    /// `sock.sk_state` (`__sk_common.skc_state`, u8).
    pub sk_state: u32,
    /// `sock.sk_userlocks` (u8 on recent kernels, 4-bit bitfield on older ones).
    pub sk_userlocks: Field,
    /// `sock.sk_protocol` (u16 on recent kernels, 8-bit bitfield on older ones).
    pub sk_protocol: Field,

    // --- struct tcp_sock ---
    /// `tcp_sock.rx_opt.rcv_wscale` (bitfield).
    pub tcp_rcv_wscale: Field,
    /// `tcp_sock.rx_opt.snd_wscale` (bitfield).
    pub tcp_snd_wscale: Field,
    /// `tcp_sock.rx_opt.wscale_ok` (bitfield).
    pub tcp_wscale_ok: Field,
    /// `tcp_sock.window_clamp`.
    pub tcp_window_clamp: u32,
    /// `tcp_sock.rcv_rtt_est.rtt_us` (receiver RTT estimate, µs << 3).
    pub tcp_rcv_rtt_us: u32,
    /// `tcp_sock.srtt_us` (smoothed RTT, µs << 3).
    pub tcp_srtt_us: u32,
    /// `tcp_sock.copied_seq`.
    pub tcp_copied_seq: u32,
    /// `tcp_sock.rcvq_space.seq`.
    pub tcp_rcvq_space_seq: u32,

    // --- struct net ---
    /// `net.ns.inum` (the netns inode number, as in `/proc/<pid>/ns/net`).
    pub net_inum: u32,
    /// `net.ipv4.sysctl_tcp_rmem` + 8 (`tcp_rmem[2]`, int).
    pub net_tcp_rmem_max: u32,
    /// `net.ipv4.sysctl_tcp_moderate_rcvbuf` (u8; absent on very old kernels).
    pub net_tcp_moderate_rcvbuf: Field,
    /// `net.ipv4.sysctl_tcp_window_scaling` (u8).
    pub net_tcp_window_scaling: Field,

    // --- struct sk_buff / skb_shared_info / net_device ---
    /// `sk_buff.head`.
    pub skb_head: u32,
    /// `sk_buff.end` (an offset from head on 64-bit kernels).
    pub skb_end: u32,
    /// `sk_buff.dev`.
    pub skb_dev: u32,
    /// `skb_shared_info.gso_segs` (u16).
    pub shinfo_gso_segs: u32,
    /// `net_device.ifindex`.
    pub dev_ifindex: u32,
    /// `net_device.name` (char[16]).
    pub dev_name: u32,
    /// `net_device.nd_net` (a `struct net *`).
    pub dev_net: u32,
    /// `task_struct.cred` (the subjective credentials `capable()` checks).
    pub task_cred: u32,
    /// `cred.cap_effective` (read as a u64: `kernel_cap_t` is one u64 since 6.3 and two
    /// little-endian u32 words before; `CAP_NET_ADMIN` is bit 12 either way).
    pub cred_cap_effective: u32,
    /// `cred.user_ns`.
    pub cred_user_ns: u32,
    /// `user_namespace.level` (0 for the initial user namespace).
    pub user_ns_level: u32,
    /// `sock.sk_ino` (`unsigned long`, 6.18+: the socket's inode number cached in the sock,
    /// 0 once orphaned); 0 when this kernel has no such member (then `sk_socket` +
    /// [`Config::socket_ino`] is read instead). Also keeps `reason_mask` 8-byte aligned.
    pub sk_ino: u32,

    // --- behaviour ---
    /// Bitmap of tracked `enum skb_drop_reason` values (bit r set: count reason r).
    pub reason_mask: [u64; REASON_WORDS],
    /// Value of `SKB_DROP_REASON_FULL_RING` on this kernel (device drops attributed by ifindex);
    /// `u32::MAX` when the kernel has no such reason.
    pub reason_full_ring: u32,
    /// Non-zero when the kernel's `sk_buff.end` is an offset from `head` (64-bit kernels).
    pub skb_end_is_offset: u32,
    /// Event ring buffer wake-ups: 0 = the kernel default (the reader is woken for nearly
    /// every event when it keeps up: an irq_work self-IPI per event); N = wake it only once
    /// N bytes wait (the reader must then also drain on a timer).
    pub ringbuf_wakeup_bytes: u32,

    // --- the calling task ---
    /// Non-zero when the kernel has `bpf_get_current_task_btf` (5.11+; its BTF's
    /// `enum bpf_func_id` names it): tracing programs then load through a BTF-typed `current`;
    /// else they read it with `bpf_get_current_task` and probe reads (the verifier prunes the
    /// branch this kernel does not take, helper call included).
    pub current_task_btf: u32,
    /// `task_struct.pid` (the thread id; cgroup programs read it where the kernel gives them no
    /// `bpf_get_current_pid_tgid`).
    pub task_pid: u32,
    /// `task_struct.tgid` (the process id).
    pub task_tgid: u32,
    /// `task_struct.comm` (char[16]).
    pub task_comm: u32,
    /// `task_struct.cgroups` (a `struct css_set *`).
    pub task_cgroups: u32,
    /// `css_set.dfl_cgrp` (the task's cgroup2 cgroup).
    pub css_set_dfl_cgrp: u32,
    /// `cgroup.level` (int: 0 for the root).
    pub cgroup_level: u32,
    /// `cgroup.ancestors` (6.0+: `struct cgroup *[]`) or `cgroup.ancestor_ids` (before: `u64[]`
    /// of cgroup ids), indexed by level.
    pub cgroup_ancestors: u32,
    /// Non-zero when [`Config::cgroup_ancestors`] holds ids (`ancestor_ids`), not pointers.
    pub cgroup_ancestor_ids: u32,
    /// `cgroup.kn` (its `struct kernfs_node *`).
    pub cgroup_kn: u32,
    /// `kernfs_node.id` (u64: the cgroup id, the cgroup directory's inode number).
    pub kn_id: u32,
    /// `sock.sk_type` (u16 on recent kernels, a 16-bit bitfield on older ones).
    pub sk_type: Field,
    /// `net.ipv4.sysctl_tcp_wmem` + 8 (`tcp_wmem[2]`, int: send autotuning's ceiling).
    pub net_tcp_wmem_max: u32,
    /// `sk_buff.data` (a pointer: the start of the data kernel WireGuard parses).
    pub skb_data: u32,
    /// `sk_buff.len`.
    pub skb_len: u32,
    /// `sk_buff.cb` (the control buffer: kernel WireGuard keeps its `struct packet_cb` there).
    pub skb_cb: u32,
    /// `sk_buff.transport_header` (u16, an offset from `head`).
    pub skb_transport_header: u32,
    /// Padding.
    pub _pad_end: u32,
}

/// What the owner of a socket is: the process that created, bound, connected, accepted or
/// configured it, captured in process context (drop hooks run in softirq, where `current` is
/// whoever was interrupted, usually the sender).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Owner {
    /// Process id (thread-group id).
    pub tgid: u32,
    /// Thread id that made the call.
    pub pid: u32,
    /// cgroup v2 id of the caller (`bpf_get_current_cgroup_id`).
    pub cgroup_id: u64,
    /// Start time of the process (ns since boot), to tell reused pids apart.
    pub start_ns: u64,
    /// `comm` of the caller (not NUL-terminated when 16 bytes long).
    pub comm: [u8; 16],
}

/// How a [`DropKey`] identifies where a drop happened.
pub mod drop_site {
    /// A socket that has an inode (the usual case): `DropKey::inode` is set.
    pub const SOCKET: u8 = 0;
    /// A socket without an inode (not yet accepted, or orphaned after close): identified by
    /// netns + local port in `DropKey::id`.
    pub const SOCKET_NO_INODE: u8 = 1;
    /// No socket (e.g. a full TUN ring): identified by netns + ifindex in `DropKey::id`.
    pub const DEVICE: u8 = 2;
    /// The kernel's hooks do not name the socket (kernels without `kfree_skb`'s `rx_sk`,
    /// 6.11+, for drops no other hook sees): counted per network namespace (`DropKey::netns`,
    /// from the receiving device; 0 when the skb has none) and reason only.
    pub const NETNS: u8 = 3;
    /// Never written by BPF: with pinned maps, userspace folds the counts of a live process's
    /// closed sockets here when it removes their entries, so that they survive a restart
    /// (`DropKey::inode` = the process's start time in clock ticks, `DropKey::id` = its tgid).
    pub const RETIRED: u8 = 4;
}

/// Key of the `DROPS` per-CPU hash: one entry per (socket or device, drop reason).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DropKey {
    /// Socket inode number (as in `/proc/<pid>/fd` → `socket:[N]` and `/proc/net/udp`), or 0.
    pub inode: u64,
    /// Network namespace inode number.
    pub netns: u32,
    /// Local port for [`drop_site::SOCKET_NO_INODE`], ifindex for [`drop_site::DEVICE`], else 0.
    pub id: u32,
    /// `enum skb_drop_reason` value (kernel-specific; names resolved at start-up).
    pub reason: u16,
    /// IP protocol of the socket (`IPPROTO_*`), 0 when unknown / no socket.
    pub proto: u8,
    /// One of [`drop_site`].
    pub site: u8,
    /// Padding (keeps the key 24 bytes on every target).
    pub _pad: u32,
}

/// Where kernel WireGuard frees the packets it discards (the `wireguard` room fills it from
/// `/proc/kallsyms` whenever the module is (re)loaded): `consume_skb`'s `location` (its
/// caller's return address) inside one of these `[lo, hi)` ranges is a discard site.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WgSites {
    /// `wg_packet_receive` (a packet dropped on arrival: a full per-peer or handshake queue,
    /// an unknown session, a malformed packet).
    pub receive: [u64; 2],
    /// `wg_receive`: `wg_packet_receive` frees its `err:` packets with a tail call, so
    /// `location` is the return address in its caller.
    pub socket_receive: [u64; 2],
    /// `wg_packet_rx_poll` (a packet queued dead: the device's decrypt ring was full, or it
    /// could not be decrypted, or was replayed).
    pub rx_poll: [u64; 2],
    /// `consume_skb` itself: where `consume_skb` has no `location` (before 6.3), the
    /// `fentry` variant finds the caller's return address in its trampoline's frame, and
    /// knows the frame by the return address into `consume_skb` just below it.
    pub consume: [u64; 2],
}

/// Why kernel WireGuard discarded a packet (the `reason` of a [`WgKey`]).
pub mod wg_reason {
    /// A data packet whose peer's receive queue was full.
    pub const PEER_QUEUE_FULL: u16 = 1;
    /// A handshake packet while the device's handshake queue was full.
    pub const HANDSHAKE_QUEUE_FULL: u16 = 2;
    /// A data packet for a session index with no key (stale or unknown session).
    pub const UNKNOWN_SESSION: u16 = 3;
    /// A packet that is no WireGuard message.
    pub const MALFORMED: u16 = 4;
    /// A data packet queued dead: the device's decrypt ring was full (or it failed to decrypt).
    pub const DECRYPT_RING_FULL: u16 = 5;
    /// A decrypted packet freed after decryption: replayed, or with an inner header the peer
    /// may not send (the latter also counted in the device's `rx_errors`).
    pub const REPLAYED_OR_INVALID: u16 = 6;
}

/// Key of the `WG_DROPS` per-CPU hash: the namespace and UDP port of the WireGuard socket that
/// received the packet, and why it was discarded. Value: packets (u64).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WgKey {
    /// Network namespace inode number of the receiving (outer) device.
    pub netns: u32,
    /// Destination UDP port of the outer packet (the WireGuard device's listen port).
    pub port: u16,
    /// One of [`wg_reason`].
    pub reason: u16,
}

/// Value of the `DROPS` per-CPU hash (summed over CPUs by userspace).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropVal {
    /// Dropped packets, GRO/GSO skbs weighted by their segment count.
    pub packets: u64,
    /// Dropped skbs (what `/proc/net/udp`'s drops column and `RcvbufErrors` count).
    pub skbs: u64,
    /// `sk_rcvbuf` at the last drop on this CPU (bytes, already doubled by the kernel).
    pub rcvbuf: i32,
    /// `sk_rmem_alloc` at the last drop on this CPU.
    pub rmem_alloc: i32,
    /// When this CPU last counted a drop, in jiffies (`bpf_jiffies64()`: inlined by the JIT,
    /// unlike `bpf_ktime_get_ns()`, which cost the per-packet path ≈25 ns). Only compared
    /// between CPUs to pick the latest `rcvbuf`/`rmem_alloc`; the name predates the change.
    pub last_ns: u64,
    /// Device name for [`drop_site::DEVICE`] drops.
    pub ifname: [u8; 16],
}

/// Value of the `AUTOTUNE` per-CPU hash, keyed by socket inode: `tcp:tcp_rcvbuf_grow` events.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AutotuneVal {
    /// `tcp_rcvbuf_grow` events (the kernel wanted a bigger receive buffer).
    pub grow_events: u64,
    /// Of those, events where growth was suppressed (`SOCK_RCVBUF_LOCK` or
    /// `tcp_moderate_rcvbuf = 0`).
    pub suppressed: u64,
    /// Bytes copied to the reader in the last measurement interval.
    pub copied: u64,
    /// Length of that interval (µs, the tracepoint's `time`).
    pub interval_us: u64,
    /// When this CPU last saw an event, in jiffies (`bpf_jiffies64()`, as
    /// [`DropVal::last_ns`]); only compared between CPUs.
    pub last_ns: u64,
    /// Receiver RTT estimate at the last event (µs).
    pub rtt_us: u32,
    /// `sk_rcvbuf` at the last event.
    pub rcvbuf: i32,
    /// Network namespace inode number.
    pub netns: u32,
    /// `sk_userlocks & SOCK_BUF_LOCK_MASK` at the last event.
    pub userlocks: u32,
}

/// Event kinds sent through the `EVENTS` ring buffer (first `u32` of every event).
pub mod event_kind {
    /// [`super::SockoptEvent`].
    pub const SOCKOPT: u32 = 1;
    /// [`super::EstablishedEvent`].
    pub const ESTABLISHED: u32 = 2;
    /// [`super::GuardEvent`].
    pub const GUARD: u32 = 3;
}

/// One buffer-size `setsockopt(SOL_SOCKET, …)` call, seen at syscall exit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockoptEvent {
    /// [`event_kind::SOCKOPT`].
    pub kind: u32,
    /// `SO_RCVBUF`, `SO_SNDBUF`, `SO_RCVBUFFORCE`, `SO_SNDBUFFORCE` or `SO_BUF_LOCK`.
    pub optname: i32,
    /// The caller (process context: exact).
    pub owner: Owner,
    /// Socket inode.
    pub inode: u64,
    /// Network namespace inode number of the socket.
    pub netns: u32,
    /// The requested value (the `int` at `optval`).
    pub requested: i32,
    /// Return value of the syscall (0 or `-errno`).
    pub ret: i32,
    /// `optlen` passed by the caller.
    pub optlen: u32,
    /// `sk_rcvbuf` after the call (what the kernel actually gave). With
    /// [`sockopt_flags::BEFORE_HANDLER`]: the value before the call.
    pub rcvbuf_after: i32,
    /// `sk_sndbuf` after the call (with [`sockopt_flags::BEFORE_HANDLER`]: before it).
    pub sndbuf_after: i32,
    /// `sk_userlocks & SOCK_BUF_LOCK_MASK` before the call.
    pub locks_before: u8,
    /// `sk_userlocks & SOCK_BUF_LOCK_MASK` after the call (with
    /// [`sockopt_flags::BEFORE_HANDLER`]: before it).
    pub locks_after: u8,
    /// The socket's transport as [`transport`] says it: `IPPROTO_TCP`/`IPPROTO_UDP` only for
    /// inet stream/datagram sockets, 0 for any other socket (netlink, raw, unix).
    pub proto: u8,
    /// [`sockopt_flags`].
    pub flags: u8,
    /// Address family of the socket (`AF_INET`, `AF_INET6`, `AF_UNIX`, …).
    pub family: u16,
    /// `sk_state` at the call (`TCP_ESTABLISHED` 1, `TCP_CLOSE` 7 before `connect()`/`listen()`,
    /// `TCP_LISTEN` 10; 0 from an older program that did not record it).
    pub state: u8,
    /// Padding.
    pub _pad1: u8,
    /// The value the kernel's handler got: `requested`, unless the guard rewrote it
    /// ([`sockopt_flags::GUARD_RAISED`]).
    pub applied: i32,
    /// Padding.
    pub _pad2: u32,
}

/// Flags of [`SockoptEvent::flags`].
pub mod sockopt_flags {
    /// Seen by `cgroup/setsockopt`, before the kernel's handler ran: `ret`, `*_after` and
    /// `locks_after` hold the state before the call, and userspace derives the outcome from
    /// the kernel's rules (`sk_setsockopt`). Without it the event comes from the syscall exit
    /// and every field is the kernel's own result.
    pub const BEFORE_HANDLER: u8 = 1;
    /// The caller has `CAP_NET_ADMIN` in the initial user namespace (what `*FORCE` needs).
    pub const NET_ADMIN: u8 = 2;
    /// The guard skipped the kernel's handler: the call succeeded and changed nothing.
    pub const GUARD_SKIPPED: u8 = 4;
    /// The guard rewrote the request: the kernel's handler got `SockoptEvent::applied`.
    pub const GUARD_RAISED: u8 = 8;
}

/// The guard's settings (`bufscope run --guard.*`), patched into `.rodata` (`GUARD`) before
/// load: the verifier then drops every guard branch when the mode is off.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuardConfig {
    /// [`guard::MODE_OFF`], [`guard::MODE_OBSERVE`] or [`guard::MODE_ENFORCE`].
    pub mode: u32,
    /// Rules on: bits [`guard::RULE_TCP_AUTOTUNE`], [`guard::RULE_UDP_FLOOR`].
    pub rules: u32,
    /// UDP receive floor: the `SO_RCVBUF` value (before the kernel doubles it) smaller requests
    /// are raised to and sockets that never ask get; already capped at `rmem_max`.
    pub udp_rcv_floor: i32,
    /// UDP send floor (`SO_SNDBUF` value), capped at `wmem_max`.
    pub udp_snd_floor: i32,
    /// cgroup v2 id (the directory's inode) the guard is scoped to; 0: every process.
    pub cgroup_id: u64,
    /// Depth of that cgroup below the cgroup2 root (`bpf_get_current_ancestor_cgroup_id`).
    pub cgroup_level: u32,
    /// [`guard::COMM_ALL`], [`guard::COMM_ONLY`] (only the comms in `GUARD_COMMS`) or
    /// [`guard::COMM_EXCEPT`] (all but those).
    pub comm_mode: u32,
    /// The policy generation: a digest of everything a decision depends on (mode, rules,
    /// floors, scope, budget), never 0. Every per-socket mark carries the generation it was
    /// made under; a socket marked under another one is decided again.
    pub generation: u32,
    /// bufscope's own process id: never in scope (its measurements and its HTTP socket).
    pub self_tgid: u32,
    /// A persisted guard's lease (`--guard.lease`, seconds; 0: no lease, the guard lives and
    /// dies with bufscope): the programs act only while `GUARD_LEASE` (a deadline in
    /// `bpf_ktime_get_ns` time, renewed by the running bufscope) lies ahead, and fail open
    /// after it.
    pub lease_secs: u32,
    /// Padding.
    pub _pad: u32,
    /// `--guard.udp-budget`: the most receive buffer (bytes, as the kernel counts it: twice
    /// the `SO_RCVBUF` value) the guard grants to live UDP sockets together.
    pub udp_budget: u64,
}

/// Constants of [`GuardConfig`] and [`GuardEvent`].
pub mod guard {
    /// The guard is off: nothing runs.
    pub const MODE_OFF: u32 = 0;
    /// Decisions are counted, nothing is changed.
    pub const MODE_OBSERVE: u32 = 1;
    /// Decisions are applied.
    pub const MODE_ENFORCE: u32 = 2;
    /// TCP `SO_RCVBUF`/`SO_SNDBUF` (and `*FORCE`, and a locking `SO_BUF_LOCK`) are skipped.
    pub const RULE_TCP_AUTOTUNE: u32 = 1;
    /// UDP buffers are raised to the floor.
    pub const RULE_UDP_FLOOR: u32 = 2;
    /// Every process in the cgroup.
    pub const COMM_ALL: u32 = 0;
    /// Only processes whose comm is listed.
    pub const COMM_ONLY: u32 = 1;
    /// Every process but those whose comm is listed.
    pub const COMM_EXCEPT: u32 = 2;
    /// [`super::GuardEvent::action`]: the call was skipped (the kernel's handler did not run,
    /// the caller got success).
    pub const ACTION_SKIPPED: u8 = 1;
    /// The buffer was raised (a request rewritten, or set on a socket that never asked).
    pub const ACTION_RAISED: u8 = 2;
    /// Observe mode: what enforce would have done, not done.
    pub const ACTION_OBSERVED: u8 = 3;
    /// A TCP request at or above what autotuning can reach in the socket's network namespace
    /// (`tcp_rmem[2]`/`tcp_wmem[2]`): left to the kernel, which applies it.
    pub const ACTION_HONOURED: u8 = 4;
    /// A UDP receive raise the budget (`--guard.udp-budget`) had no room for: the socket keeps
    /// what it would have without the guard ([`super::GuardEvent::applied`]: the bytes it did
    /// not get).
    pub const ACTION_OVER_BUDGET: u8 = 5;
    /// [`super::GuardEvent::hook`]: at `setsockopt`.
    pub const HOOK_SETSOCKOPT: u8 = 1;
    /// At `bind`.
    pub const HOOK_BIND: u8 = 2;
    /// At `connect`.
    pub const HOOK_CONNECT: u8 = 3;
    /// At `sendmsg` (an unbound, unconnected socket's first send).
    pub const HOOK_SENDMSG: u8 = 4;
    /// At socket creation (`cgroup/sock_create`).
    pub const HOOK_CREATE: u8 = 5;
    /// Slot of `GUARD_STATS` (a per-CPU array): decisions taken (and acted on) that could not
    /// be reported because the `EVENTS` ring buffer was full.
    pub const STAT_UNREPORTED: u32 = 0;
    /// Slot of `GUARD_STATS`: UDP sockets the budget left at the kernel's size.
    pub const STAT_LEFT_OUT: u32 = 1;
    /// Slot of `GUARD_STATS`: the receive bytes those sockets did not get.
    pub const STAT_LEFT_OUT_BYTES: u32 = 2;
    /// Slots of `GUARD_STATS`.
    pub const STAT_COUNT: u32 = 3;
    /// Slot of `GUARD_STATE` (a shared array, updated atomically): receive bytes granted to
    /// live UDP sockets (released when a socket closes or sizes itself).
    pub const STATE_GRANTED: u32 = 0;
    /// Slot of `GUARD_STATE`: `net.core.rmem_max` (written by bufscope at start and on every
    /// poll; 0: unknown).
    pub const STATE_RMEM_MAX: u32 = 1;
    /// Slot of `GUARD_STATE`: `net.core.wmem_max` (as [`STATE_RMEM_MAX`]).
    pub const STATE_WMEM_MAX: u32 = 2;
    /// Slots of `GUARD_STATE`.
    pub const STATE_COUNT: u32 = 3;
}

/// One guard decision (in process context: the owner is the caller).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuardEvent {
    /// [`event_kind::GUARD`].
    pub kind: u32,
    /// The option the decision is about (`SO_RCVBUF`, `SO_SNDBUF`, …).
    pub optname: i32,
    /// The caller.
    pub owner: Owner,
    /// Socket inode.
    pub inode: u64,
    /// What the application asked for (0 when it did not ask).
    pub requested: i32,
    /// What the kernel got instead (the floor; 0 for a skipped call; for
    /// [`guard::ACTION_OVER_BUDGET`], the receive bytes not granted).
    pub applied: i32,
    /// [`guard::RULE_TCP_AUTOTUNE`] or [`guard::RULE_UDP_FLOOR`].
    pub rule: u8,
    /// [`guard::ACTION_SKIPPED`], [`guard::ACTION_RAISED`], [`guard::ACTION_OBSERVED`],
    /// [`guard::ACTION_HONOURED`] or [`guard::ACTION_OVER_BUDGET`].
    pub action: u8,
    /// Where: [`guard::HOOK_SETSOCKOPT`], …
    pub hook: u8,
    /// The socket's transport as [`transport`] says it: `IPPROTO_TCP`/`IPPROTO_UDP` only for
    /// inet stream/datagram sockets, 0 for any other socket (netlink, raw, unix).
    pub proto: u8,
    /// Return value of `bpf_setsockopt` for raises at bind/connect/sendmsg (0 otherwise).
    pub ret: i32,
}

/// Flags of [`EstablishedEvent::flags`].
pub mod estab_flags {
    /// Passive open (accepted child), else active (`connect()`).
    pub const PASSIVE: u32 = 1;
    /// Window scaling was negotiated (`rx_opt.wscale_ok`).
    pub const WSCALE_OK: u32 = 2;
    /// `owner` is valid (found in `OWNERS`/`LISTENERS`); else userspace resolves it.
    pub const OWNER_KNOWN: u32 = 4;
}

/// A TCP connection reached ESTABLISHED (`sock:inet_sock_set_state`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EstablishedEvent {
    /// [`event_kind::ESTABLISHED`].
    pub kind: u32,
    /// [`estab_flags`].
    pub flags: u32,
    /// Owner (socket owner for active opens, listener owner for passive ones) when known.
    pub owner: Owner,
    /// Socket inode (0 for passive children: they get one at `accept()`).
    pub inode: u64,
    /// Network namespace inode number.
    pub netns: u32,
    /// `sk_rcvbuf` at ESTABLISHED.
    pub rcvbuf: i32,
    /// The netns's `tcp_rmem[2]` (what autotuning may grow to, and what sets the scale).
    pub tcp_rmem_max: i32,
    /// `tcp_sock.window_clamp` at ESTABLISHED.
    pub window_clamp: u32,
    /// Local port.
    pub lport: u16,
    /// Address family.
    pub family: u16,
    /// Our receive window scale (`rx_opt.rcv_wscale`), fixed for the connection's life.
    pub rcv_wscale: u8,
    /// The peer's scale.
    pub snd_wscale: u8,
    /// `sk_userlocks & SOCK_BUF_LOCK_MASK`.
    pub userlocks: u8,
    /// The netns's `tcp_window_scaling` sysctl.
    pub window_scaling: u8,
}

/// Key of the `TOTALS` hash: one per-process counter that bufscope builds from events
/// (setsockopt calls, TCP connections, …). No program writes it: userspace keeps each
/// process's running total there so that, with the maps pinned, a restarted bufscope goes on
/// from it (drops and autotune go on from their own maps).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TotalKey {
    /// The identity's hash (its labels': the program and where it runs), or, in entries of
    /// earlier versions, the start time of a process.
    pub start_ticks: u64,
    /// 0 for an identity's entry (earlier versions: the process id).
    pub tgid: u32,
    /// Which counter: one of [`total_family`].
    pub family: u8,
    /// IP protocol (`IPPROTO_*`), 0 when the counter has none.
    pub proto: u8,
    /// Socket option (`SO_*` optname), 0 when the counter has none.
    pub option: u8,
    /// Padding (keeps the key 16 bytes).
    pub _pad: u8,
}

/// The counters of [`TotalKey::family`].
pub mod total_family {
    /// Buffer `setsockopt` calls (by proto, option).
    pub const SETSOCKOPT_CALLS: u8 = 1;
    /// Of them, clamped by `rmem_max`/`wmem_max`.
    pub const SETSOCKOPT_CLAMPED: u8 = 2;
    /// Of them, failed.
    pub const SETSOCKOPT_FAILED: u8 = 3;
    /// Sockets that got `SOCK_RCVBUF_LOCK` (by proto).
    pub const RCVBUF_LOCKS: u8 = 4;
    /// TCP connections that reached ESTABLISHED.
    pub const TCP_ESTABLISHED: u8 = 5;
    /// Of them, born with a shrunken window scale.
    pub const TCP_WSCALE_SHRUNK: u8 = 6;
    /// Suppressed autotuning grows on sockets whose `AUTOTUNE` entries were collected
    /// (closed sockets of a live process).
    pub const AUTOTUNE_RETIRED: u8 = 7;
    /// Sockets that got `SOCK_SNDBUF_LOCK` (by proto).
    pub const SNDBUF_LOCKS: u8 = 8;
    /// Netlink overruns (by netlink protocol, in the `proto` byte).
    pub const NETLINK_OVERRUNS: u8 = 9;
    /// Buffer drops (by proto; the option byte holds the kernel's drop reason number) of an
    /// identity's departed processes.
    pub const DROPS: u8 = 10;
    /// Suppressed autotuning grows of an identity's departed processes (all of them).
    pub const AUTOTUNE_SUPPRESSED: u8 = 11;
    /// 1: the identity had series of its own.
    pub const OWN_SERIES: u8 = 12;
    /// Guard decisions (the proto byte holds the rule, the option byte the action).
    pub const GUARD_DECISIONS: u8 = 13;
}

/// Declares the `STATS` slots once each: its index constant and, for a slot that counts a
/// loss, the `cause` label of `bufscope_bpf_events_lost_total` (collected into
/// [`stat::LOSSES`], which the exporter reports from: a new loss slot cannot be left out).
macro_rules! stat_slots {
    ($($(#[$m:meta])* $name:ident = $v:literal $(, lost $cause:literal)?;)*) => {
        $( $(#[$m])* pub const $name: u32 = $v; )*
        /// Every slot that counts a loss, with its `cause` label, in index order.
        pub const LOSSES: &[(u32, &str)] = &[$($(($name, $cause),)?)*];
        /// Number of slots.
        pub const COUNT: u32 = [$($name),*].len() as u32;
    };
}

/// A BPF map as both sides name it: its name in the object (the `static` of its `#[map]` in
/// `bufscope-ebpf`, whose definition sizes it with `default_entries`) and its default size
/// (entries; bytes for a ring buffer), which userspace may override at load (`--<room>.map-entries`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSpec {
    /// Name in the object.
    pub name: &'static str,
    /// Entries in the object's definition (bytes for a ring buffer).
    pub default_entries: u32,
}

/// Every map of the object, defined once: the BPF side sizes its `#[map]` statics from these,
/// userspace takes the maps by these names and defaults its size flags to these sizes (a unit
/// test of the exporter compares them with the built object).
pub mod maps {
    use super::MapSpec;

    /// Socket inode × drop reason → drops (`drops` room; per-CPU hash).
    pub const DROPS: MapSpec = MapSpec {
        name: "DROPS",
        default_entries: 16384,
    };
    /// Socket inode → `tcp_rcvbuf_grow` events (`autotune` room; per-CPU hash).
    pub const AUTOTUNE: MapSpec = MapSpec {
        name: "AUTOTUNE",
        default_entries: 16384,
    };
    /// Socket inode → the process that created or accepted it (`owners` room; LRU hash).
    pub const OWNERS: MapSpec = MapSpec {
        name: "OWNERS",
        default_entries: 65536,
    };
    /// Socket inode → its transport, for UDP sockets at creation (`owners` room; LRU hash):
    /// [`udp_sockets_entries`] of `OWNERS`' size.
    pub const UDP_SOCKETS: MapSpec = MapSpec {
        name: "UDP_SOCKETS",
        default_entries: udp_sockets_entries(OWNERS.default_entries),
    };

    /// Entries of `UDP_SOCKETS` for an `OWNERS` of `owners` entries: a quarter (at least one).
    /// Both are sized by `--owners.map-entries`; `UDP_SOCKETS` holds a UDP socket only until
    /// userspace has read it (within a second of its creation).
    pub const fn udp_sockets_entries(owners: u32) -> u32 {
        if owners / 4 == 0 { 1 } else { owners / 4 }
    }
    /// The event ring buffer (bytes; `--bpf.events-ring-bytes`).
    pub const EVENTS: MapSpec = MapSpec {
        name: "EVENTS",
        default_entries: 1 << 20,
    };
    /// The probes' health counters ([`super::stat`]; per-CPU array).
    pub const STATS: MapSpec = MapSpec {
        name: "STATS",
        default_entries: super::stat::COUNT,
    };
    /// Per-process counters built from events, kept for a restart (LRU hash, userspace only).
    pub const TOTALS: MapSpec = MapSpec {
        name: "TOTALS",
        default_entries: 65536,
    };
    /// Sockets whose receivers the reader hook records (`drops` room).
    pub const WATCHED: MapSpec = MapSpec {
        name: "WATCHED",
        default_entries: 1024,
    };
    /// (socket, tgid) → receives, written by the reader hook (`drops` room; per-CPU LRU hash).
    pub const READERS: MapSpec = MapSpec {
        name: "READERS",
        default_entries: 4096,
    };
    /// Threads inside a setsockopt call (the syscall-tracepoint fallback).
    pub const PENDING: MapSpec = MapSpec {
        name: "PENDING",
        default_entries: 4096,
    };
    /// Listening sockets' owners (`tcp_state`; LRU hash).
    pub const LISTENERS: MapSpec = MapSpec {
        name: "LISTENERS",
        default_entries: 16384,
    };
    /// `tcp_rcv_space_adjust` entries in flight (autotune's fentry/fexit fallback).
    pub const SPACE_PENDING: MapSpec = MapSpec {
        name: "SPACE_PENDING",
        default_entries: 4096,
    };
    /// Each socket's last `rcvq_space` (autotune's tracepoint fallback; LRU hash).
    pub const SPACE_LAST: MapSpec = MapSpec {
        name: "SPACE_LAST",
        default_entries: 16384,
    };
    /// Per-CPU scratch space of the socket helpers.
    pub const SCRATCH: MapSpec = MapSpec {
        name: "SCRATCH",
        default_entries: 1,
    };
    /// The guard's counters (per-CPU array).
    pub const GUARD_STATS: MapSpec = MapSpec {
        name: "GUARD_STATS",
        default_entries: super::guard::STAT_COUNT,
    };
    /// The guard's shared state: granted receive bytes, `rmem_max`/`wmem_max` (array).
    pub const GUARD_STATE: MapSpec = MapSpec {
        name: "GUARD_STATE",
        default_entries: super::guard::STATE_COUNT,
    };
    /// The guard's scope: comms it acts for (or not).
    pub const GUARD_COMMS: MapSpec = MapSpec {
        name: "GUARD_COMMS",
        default_entries: 256,
    };
    /// A persisted guard's deadline.
    pub const GUARD_LEASE: MapSpec = MapSpec {
        name: "GUARD_LEASE",
        default_entries: 1,
    };

    /// Kernel WireGuard's discard sites (`wireguard` room; array of one [`super::WgSites`]).
    pub const WG_SITES: MapSpec = MapSpec {
        name: "WG_SITES",
        default_entries: 1,
    };
    /// (namespace, port, reason) → packets kernel WireGuard discarded (`wireguard` room;
    /// per-CPU hash).
    pub const WG_DROPS: MapSpec = MapSpec {
        name: "WG_DROPS",
        default_entries: 1024,
    };

    /// Every map above.
    pub const ALL: &[MapSpec] = &[
        WG_SITES,
        WG_DROPS,
        DROPS,
        AUTOTUNE,
        OWNERS,
        UDP_SOCKETS,
        EVENTS,
        STATS,
        TOTALS,
        WATCHED,
        READERS,
        PENDING,
        LISTENERS,
        SPACE_PENDING,
        SPACE_LAST,
        SCRATCH,
        GUARD_STATS,
        GUARD_STATE,
        GUARD_COMMS,
        GUARD_LEASE,
    ];
}

/// Indexes of the `STATS` per-CPU array: the probes' own health counters.
pub mod stat {
    stat_slots! {
        /// A `DROPS` insert failed (map full): packets not counted.
        DROPS_MAP_FULL = 0, lost "drops_map_full";
        /// An `AUTOTUNE` insert failed (map full).
        AUTOTUNE_MAP_FULL = 1, lost "autotune_map_full";
        /// The `EVENTS` ring buffer was full: an event was lost.
        RINGBUF_FULL = 2, lost "ringbuf_full";
        /// A drop on a socket without inode (not yet accepted, or orphaned).
        DROP_NO_INODE = 3;
        /// `OWNERS` insert failed.
        OWNERS_FULL = 4, lost "owners_map_full";
        /// The fd → socket walk failed at a syscall hook.
        FD_WALK_FAILED = 5, lost "fd_walk_failed";
        /// `PENDING` insert failed (too many threads inside setsockopt at once).
        PENDING_FULL = 6, lost "pending_map_full";
        /// Drops with a tracked reason (skbs) counted into `DROPS` (or lost to a full map),
        /// bumped after the map update: while it stands still, `DROPS` has not changed and
        /// userspace need not read it.
        DROPS_SEEN = 7;
        /// `tcp_rcvbuf_grow` events counted into `AUTOTUNE` (or lost), bumped after the update
        /// (as [`DROPS_SEEN`]).
        AUTOTUNE_SEEN = 8;
        /// `UDP_SOCKETS` insert failed: a new UDP socket's process is not known to hold one
        /// until it drops (its drop series does not start at 0).
        UDP_SOCKETS_FULL = 9, lost "udp_sockets_map_full";
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn slots_are_dense_and_losses_named_once() {
            assert_eq!(COUNT, UDP_SOCKETS_FULL + 1);
            let idx: [u32; 7] = [
                DROPS_MAP_FULL,
                AUTOTUNE_MAP_FULL,
                RINGBUF_FULL,
                OWNERS_FULL,
                FD_WALK_FAILED,
                PENDING_FULL,
                UDP_SOCKETS_FULL,
            ];
            assert_eq!(LOSSES.len(), idx.len());
            for (i, (slot, cause)) in LOSSES.iter().enumerate() {
                assert_eq!(*slot, idx[i]);
                assert!(!cause.is_empty() && LOSSES.iter().filter(|l| l.1 == *cause).count() == 1);
            }
        }
    }
}

/// Layout and behaviour the older-kernel programs (`ebpf/src/*/compat.rs`) need on top of
/// [`Config`], patched into `.rodata` (`COMPAT`) before load from the running kernel's BTF.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompatConfig {
    /// `sk_buff.sk` (the owning socket of an skb already charged to one; NULL on the receive
    /// path before the socket takes it).
    pub skb_sk: u32,
    /// `sk_buff.network_header` (u16 offset from `head`).
    pub skb_network_header: u32,
    /// `tcp_sock.rcvq_space.space` (int: bytes the reader consumed in the last measured RTT,
    /// raised only when autotuning wanted to grow).
    pub tcp_rcvq_space: u32,
    /// `tcp_sock.rcvq_space.time` (u64, µs: start of the current measurement).
    pub tcp_rcvq_time: u32,
    /// Value of `SKB_DROP_REASON_SOCKET_RCVBUFF` (`u32::MAX` when the kernel has none).
    pub reason_rcvbuff: u32,
    /// Value of `SKB_DROP_REASON_PROTO_MEM` (`u32::MAX` when the kernel has none).
    pub reason_proto_mem: u32,
    /// Padding (keeps the size a multiple of 8).
    pub _pad: [u32; 2],
}

impl CompatConfig {
    /// All zeroes (the value compiled into the BPF object before userspace patches it).
    pub const fn zeroed() -> Self {
        // SAFETY: integers only; all-zero is valid.
        unsafe { core::mem::zeroed() }
    }
}

/// What `fentry/tcp_rcv_space_adjust` hands to its `fexit` (or what the tracepoint fallback
/// remembers from one call to the next), per socket.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpaceSnap {
    /// `tcp_sock.rcvq_space.time` (µs).
    pub time: u64,
    /// `tcp_sock.rcvq_space.space`.
    pub space: i32,
    /// Padding.
    pub _pad: u32,
}

/// The reader hook (`tp_btf/sock_recv_length`): which process receives from a socket several
/// live processes hold. Its maps and program, by name. The program is loaded at start and
/// attached only while `WATCHED` has entries (sockets with drops and more than one holder).
pub mod reader {
    /// Program name in the object.
    pub const PROG: &str = "sock_recv_length";
    // Its maps: [`super::maps::WATCHED`] and [`super::maps::READERS`].
}

/// Key of `READERS`: one process receiving from one watched socket.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ReaderKey {
    /// Socket inode number (as in `DropKey::inode`).
    pub inode: u64,
    /// The receiving process (`current`'s tgid: the hook runs in the receiver's context).
    pub tgid: u32,
    /// Padding.
    pub _pad: u32,
}

/// Value of `READERS` (summed over CPUs by userspace): successful receives of one process
/// from one watched socket since the key was created.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReaderVal {
    /// Calls that returned data.
    pub receives: u64,
    /// Bytes they returned.
    pub bytes: u64,
}

const _: () = assert!(core::mem::size_of::<CompatConfig>() == 32);
const _: () = assert!(core::mem::size_of::<SpaceSnap>() == 16);
const _: () = assert!(core::mem::size_of::<Field>() == 8);
const _: () = assert!(core::mem::size_of::<Config>() == 328);
const _: () = assert!(core::mem::offset_of!(Config, reason_mask) == 208);
const _: () = assert!(core::mem::size_of::<Owner>() == 40);
const _: () = assert!(core::mem::size_of::<DropKey>() == 24);
const _: () = assert!(core::mem::size_of::<DropVal>() == 48);
const _: () = assert!(core::mem::size_of::<AutotuneVal>() == 56);
const _: () = assert!(core::mem::size_of::<SockoptEvent>() == 96);
const _: () = assert!(core::mem::size_of::<GuardEvent>() == 72);
const _: () = assert!(core::mem::size_of::<GuardConfig>() == 56);
const _: () = assert!(core::mem::size_of::<EstablishedEvent>() == 80);
const _: () = assert!(core::mem::size_of::<ReaderKey>() == 16);
const _: () = assert!(core::mem::size_of::<WgSites>() == 64);
const _: () = assert!(core::mem::size_of::<WgKey>() == 8);
const _: () = assert!(core::mem::size_of::<ReaderVal>() == 16);

#[cfg(feature = "user")]
mod user {
    //! `aya::Pod` impls: these types cross the kernel boundary as raw bytes.
    use super::*;
    // SAFETY: all of these are #[repr(C)], Copy, contain only integers and integer arrays, and
    // have no implicit padding (explicit `_pad` fields; sizes asserted above).
    unsafe impl aya::Pod for Config {}
    unsafe impl aya::Pod for Owner {}
    unsafe impl aya::Pod for DropKey {}
    unsafe impl aya::Pod for DropVal {}
    unsafe impl aya::Pod for AutotuneVal {}
    unsafe impl aya::Pod for SockoptEvent {}
    unsafe impl aya::Pod for EstablishedEvent {}
    unsafe impl aya::Pod for GuardConfig {}
    unsafe impl aya::Pod for GuardEvent {}
    unsafe impl aya::Pod for CompatConfig {}
    unsafe impl aya::Pod for SpaceSnap {}
    unsafe impl aya::Pod for ReaderKey {}
    unsafe impl aya::Pod for ReaderVal {}
    unsafe impl aya::Pod for TotalKey {}
    unsafe impl aya::Pod for WgSites {}
    unsafe impl aya::Pod for WgKey {}
}
