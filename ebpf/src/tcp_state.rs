//! TCP state changes: listener owners (`listen()`), active-open owners (`connect()`), and the
//! window scale of every connection at ESTABLISHED, as [`EstablishedEvent`]s in `EVENTS`.
//!
//! | program | hook |
//! |---|---|
//! | [`inet_sock_set_state`] | `tp_btf/inet_sock_set_state` |

use aya_ebpf::{
    helpers::bpf_skc_to_tcp_sock,
    macros::{btf_tracepoint, map},
    maps::LruHashMap,
    programs::BtfTracePointContext,
};
use bufscope_common::{
    EstablishedEvent, IPPROTO_TCP, Owner, TCP_CLOSE, TCP_ESTABLISHED, TCP_LISTEN, TCP_SYN_RECV,
    TCP_SYN_SENT, estab_flags, event_kind, maps, stat,
};

use crate::events::{EVENTS, stat_inc, submit_flags};
use crate::kmem::{load, load_field};
use crate::owners::{OWNERS, owned_by_current, record_owner};
use crate::sock::{btf_sk_inode, btf_sk_netns, btf_sk_userlocks};
use crate::task::current_owner;

/// (netns, local port) → owner of the TCP listener, for passive opens (the child has no inode
/// yet when it reaches ESTABLISHED, and `current` is then the softirq's victim).
#[map]
static LISTENERS: LruHashMap<ListenKey, Owner> =
    LruHashMap::with_max_entries(maps::LISTENERS.default_entries, 0);

/// Key of [`LISTENERS`].
#[repr(C)]
#[derive(Clone, Copy)]
struct ListenKey {
    netns: u32,
    port: u32,
}

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
                record_owner(inode, &current_owner());
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
