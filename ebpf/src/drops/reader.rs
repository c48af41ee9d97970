//! The reader hook: which process receives from a socket that several live processes hold
//! (a prefork master and its workers, a supervisor and its service), so that the socket's
//! drops go to the process that reads it rather than to whichever holder is newest.
//!
//! | program | hook | attached |
//! |---|---|---|
//! | [`sock_recv_length`] | `tp_btf/sock_recv_length` (6.4+) | only while `WATCHED` has entries |
//!
//! Userspace puts a socket into `WATCHED` when it has drops and more than one live holder,
//! and attaches the program only while `WATCHED` is non-empty: a host without a dropping
//! shared socket runs nothing here. While attached, every receive on the host costs the
//! early exit (a failed receive) or one inode load and one `WATCHED` lookup; only receives from
//! watched sockets update `READERS`.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::bpf_get_current_pid_tgid,
    macros::{btf_tracepoint, map},
    maps::{HashMap, LruPerCpuHashMap},
    programs::BtfTracePointContext,
};
use bufscope_common::{ReaderKey, ReaderVal, maps};

use crate::sock::btf_sk_inode;

/// Socket inode → 1: the sockets whose receivers are recorded (filled by userspace).
#[map]
static WATCHED: HashMap<u64, u8> = HashMap::with_max_entries(maps::WATCHED.default_entries, 0);

/// (socket inode, receiving tgid) → receives and bytes. An LRU: it never refuses a reader;
/// userspace deletes a socket's keys when it stops watching it.
#[map]
static READERS: LruPerCpuHashMap<ReaderKey, ReaderVal> =
    LruPerCpuHashMap::with_max_entries(maps::READERS.default_entries, 0);

/// `tp_btf/sock_recv_length(struct sock *sk, int ret, int flags)`: fires after every
/// `recvmsg`-family call on a socket, in the receiver's context; `ret` is what the call
/// returned (bytes, or a negative errno).
#[btf_tracepoint(function = "sock_recv_length")]
pub fn sock_recv_length(ctx: BtfTracePointContext) -> i32 {
    let ret: i32 = ctx.arg(1);
    if ret <= 0 {
        return 0;
    }
    let sk: u64 = ctx.arg(0);
    if sk == 0 {
        return 0;
    }
    let inode = btf_sk_inode(sk);
    if inode == 0 || unsafe { WATCHED.get(&inode) }.is_none() {
        return 0;
    }
    let key = ReaderKey {
        inode,
        tgid: (bpf_get_current_pid_tgid() >> 32) as u32,
        _pad: 0,
    };
    let add = |p: *mut ReaderVal| {
        let v = unsafe { &mut *p };
        v.receives += 1;
        v.bytes += ret as u64;
    };
    if let Some(p) = READERS.get_ptr_mut(&key) {
        add(p);
        return 0;
    }
    let first = ReaderVal {
        receives: 1,
        bytes: ret as u64,
    };
    if READERS.insert(&key, &first, BPF_NOEXIST as u64).is_err()
        && let Some(p) = READERS.get_ptr_mut(&key)
    {
        // Another CPU created the key in between: this CPU's slot exists now.
        add(p);
    }
    0
}
