//! TCP connections at ESTABLISHED: the receive window scale they were born with versus the
//! scale the kernel would have chosen without a locked (small) receive buffer.

use bufscope_common::{EstablishedEvent, SOCK_RCVBUF_LOCK, estab_flags};

use crate::attribution::Attributor;
use crate::store::{Proto, Store, Who};

/// `TCP_MAX_WSCALE`.
const TCP_MAX_WSCALE: u32 = 14;

/// The receive window scale `tcp_select_initial_window` picks for a socket whose buffer is not
/// locked: `clamp(ilog2(min(max(tcp_rmem[2], rmem_max), 65535 << 14)) - 15, 0, 14)`
/// (KERNEL-FACTS §3.2). `tcp_rmem_max` is the socket's own netns value; `rmem_max` is global.
pub fn expected_wscale(tcp_rmem_max: i64, rmem_max: i64) -> u8 {
    let space = tcp_rmem_max
        .max(rmem_max)
        .clamp(1, 65535i64 << TCP_MAX_WSCALE) as u64;
    let log = 63 - space.leading_zeros();
    log.saturating_sub(15).min(TCP_MAX_WSCALE) as u8
}

/// True when the connection's scale is smaller than expected. Connections without window
/// scaling (peer or sysctl) are never "shrunk": that is not what a buffer lock causes.
pub fn shrunk(ev: &EstablishedEvent, rmem_max: i64) -> bool {
    ev.flags & estab_flags::WSCALE_OK != 0
        && ev.window_scaling != 0
        && ev.rcv_wscale < expected_wscale(ev.tcp_rmem_max as i64, rmem_max)
}

/// Who the connection belongs to: the probe's owner record, else `/proc`.
fn resolve(ev: &EstablishedEvent, attr: &mut Attributor) -> Option<crate::store::ProcRef> {
    if ev.flags & estab_flags::OWNER_KNOWN != 0 {
        return Some(attr.owner(&ev.owner));
    }
    if ev.flags & estab_flags::PASSIVE != 0 {
        return attr.listener(ev.netns, ev.lport);
    }
    if ev.inode == 0 {
        return None;
    }
    attr.lookup_inode(ev.inode).or_else(|| {
        attr.resolve_inodes(&foldhash::HashSet::from_iter([ev.inode]));
        attr.lookup_inode(ev.inode)
    })
}

/// Adds one connection to the store and returns whom it was attributed to.
pub fn handle(
    ev: &EstablishedEvent,
    rmem_max: i64,
    attr: &mut Attributor,
    store: &mut Store,
) -> Who {
    let who = match resolve(ev, attr) {
        Some(p) => Who::Proc(p),
        None => {
            store.count_unknown("tcp_state", 1);
            Who::Unknown
        }
    };
    let meta = match who {
        Who::Proc(p) => attr.meta(&p),
        Who::Unknown => Default::default(),
    };
    let s = store.proc_mut(who, || meta);
    s.tcp_established += 1;
    if shrunk(ev, rmem_max) {
        s.tcp_wscale_shrunk += 1;
    }
    // A child accepted from a locked listener inherits SOCK_RCVBUF_LOCK (sk_clone_lock): it
    // got the lock without calling setsockopt itself.
    if ev.flags & estab_flags::PASSIVE != 0 && ev.userlocks & SOCK_RCVBUF_LOCK != 0 {
        *s.rcvbuf_locks.entry(Proto::Tcp).or_default() += 1;
    }
    who
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_scale_matches_kernel_facts() {
        // tcp_rmem[2] = 32 MiB, rmem_max = 4 MiB -> ilog2(2^25) - 15 = 10.
        assert_eq!(expected_wscale(33_554_432, 4_194_304), 10);
        // Debian defaults: tcp_rmem[2] = 6 MiB, rmem_max = 212992 -> ilog2(6291456) = 22 -> 7.
        assert_eq!(expected_wscale(6_291_456, 212_992), 7);
        // Jason Xing's patch: tcp_rmem[2] = rmem_max = 40880000 -> ilog2 = 25 -> 10.
        assert_eq!(expected_wscale(40_880_000, 40_880_000), 10);
        // Enormous values cap at 14.
        assert_eq!(expected_wscale(i64::MAX, 0), 14);
        assert_eq!(expected_wscale(0, 0), 0);
    }

    #[test]
    fn shrink_needs_negotiated_scaling() {
        let mut ev = EstablishedEvent {
            flags: estab_flags::WSCALE_OK,
            window_scaling: 1,
            rcv_wscale: 1,
            tcp_rmem_max: 33_554_432,
            ..Default::default()
        };
        assert!(shrunk(&ev, 4_194_304));
        ev.rcv_wscale = 10;
        assert!(!shrunk(&ev, 4_194_304));
        ev.rcv_wscale = 0;
        ev.flags = 0;
        assert!(!shrunk(&ev, 4_194_304), "no wscale option from the peer");
    }
}
