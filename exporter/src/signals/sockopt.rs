//! Buffer-size `setsockopt` calls: requested vs effective, clamps, failures, locks.

use bufscope_common::{SOCK_RCVBUF_LOCK, SockoptEvent};

use crate::attribution::Attributor;
use crate::store::{BufOption, Proto, Store, Who};

/// `SOCK_MIN_RCVBUF`-style floors don't matter here: a request counts as clamped when the
/// kernel gave less than twice what the option would have set without `rmem_max`/`wmem_max`.
const INT_MAX_HALF: u64 = (i32::MAX / 2) as u64;

/// True when the kernel clamped the request to `net.core.rmem_max`/`wmem_max`.
///
/// `sk_setsockopt` does `__sock_set_rcvbuf(sk, min_t(u32, val, rmem_max))` for `SO_RCVBUF`
/// (so a negative value counts as huge), `max(val, 0)` for the `*FORCE` variants, then stores
/// `max(min(val, INT_MAX/2) * 2, SOCK_MIN_RCVBUF)`. We compare the effective size the probe
/// read back after the call with what the unclamped path would have stored.
pub fn clamped(ev: &SockoptEvent) -> bool {
    if ev.ret != 0 || ev.optlen < 4 {
        return false;
    }
    let (requested, effective) = match BufOption::from_optname(ev.optname) {
        Some(BufOption::Rcvbuf) => (ev.requested as u32 as u64, ev.rcvbuf_after),
        Some(BufOption::Sndbuf) => (ev.requested as u32 as u64, ev.sndbuf_after),
        Some(BufOption::RcvbufForce) => (ev.requested.max(0) as u64, ev.rcvbuf_after),
        Some(BufOption::SndbufForce) => (ev.requested.max(0) as u64, ev.sndbuf_after),
        Some(BufOption::BufLock) | None => return false,
    };
    (effective.max(0) as u64) < 2 * requested.min(INT_MAX_HALF)
}

/// True when this call turned receive autotuning off for the socket.
pub fn set_rcvbuf_lock(ev: &SockoptEvent) -> bool {
    ev.ret == 0 && ev.locks_before & SOCK_RCVBUF_LOCK == 0 && ev.locks_after & SOCK_RCVBUF_LOCK != 0
}

/// Adds one event to the store and returns whom it was attributed to. The caller is exact
/// (process context).
pub fn handle(ev: &SockoptEvent, attr: &mut Attributor, store: &mut Store) -> Option<Who> {
    let option = BufOption::from_optname(ev.optname)?;
    let proto = Proto::from_ip(ev.proto);
    let who = if ev.owner.tgid == 0 {
        store.count_unknown("setsockopt", 1);
        Who::Unknown
    } else {
        Who::Proc(attr.owner(&ev.owner))
    };
    let meta = match who {
        Who::Proc(p) => attr.meta(&p),
        Who::Unknown => Default::default(),
    };
    let s = store.proc_mut(who, || meta);
    let c = s.sockopt.entry((proto, option)).or_default();
    c.calls += 1;
    if ev.ret != 0 {
        c.failed += 1;
    }
    if clamped(ev) {
        c.clamped += 1;
    }
    if set_rcvbuf_lock(ev) {
        *s.rcvbuf_locks.entry(proto).or_default() += 1;
    }
    Some(who)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bufscope_common::{SO_BUF_LOCK, SO_RCVBUF, SO_RCVBUFFORCE, SO_SNDBUF};

    fn ev(optname: i32, requested: i32, rcv_after: i32, snd_after: i32) -> SockoptEvent {
        SockoptEvent {
            optname,
            requested,
            optlen: 4,
            rcvbuf_after: rcv_after,
            sndbuf_after: snd_after,
            ..Default::default()
        }
    }

    /// Values from KERNEL-FACTS §1.2 (rmem_max = wmem_max = 4194304, getsockopt readbacks).
    #[test]
    fn kernel_semantics_table() {
        // SO_RCVBUF 65536 -> 131072: not clamped.
        assert!(!clamped(&ev(SO_RCVBUF, 65536, 131072, 0)));
        // 0/1/1000 -> 2304 (SOCK_MIN_RCVBUF floor): not clamped.
        assert!(!clamped(&ev(SO_RCVBUF, 1000, 2304, 0)));
        // 4194305 and 2^30 -> 8388608: clamped.
        assert!(clamped(&ev(SO_RCVBUF, 4194305, 8388608, 0)));
        assert!(clamped(&ev(SO_RCVBUF, 1 << 30, 8388608, 0)));
        // exactly rmem_max: not clamped.
        assert!(!clamped(&ev(SO_RCVBUF, 4194304, 8388608, 0)));
        // -1 is min_t(u32, -1, rmem_max): clamped.
        assert!(clamped(&ev(SO_RCVBUF, -1, 8388608, 0)));
        // SO_SNDBUF 2^30 -> 8388608: clamped (looks at sndbuf).
        assert!(clamped(&ev(SO_SNDBUF, 1 << 30, 212992, 8388608)));
        // FORCE 64 MiB -> 134217728: not clamped; FORCE -1 -> 2304: not clamped.
        assert!(!clamped(&ev(SO_RCVBUFFORCE, 64 << 20, 134217728, 0)));
        assert!(!clamped(&ev(SO_RCVBUFFORCE, -1, 2304, 0)));
        assert!(!clamped(&ev(SO_BUF_LOCK, 3, 131072, 0)));
        let mut failed = ev(SO_RCVBUFFORCE, 64 << 20, 212992, 0);
        failed.ret = -1;
        assert!(!clamped(&failed), "a refused call is failed, not clamped");
    }

    #[test]
    fn lock_transitions() {
        let mut e = ev(SO_RCVBUF, 65536, 131072, 0);
        e.locks_after = 2;
        assert!(set_rcvbuf_lock(&e));
        e.locks_before = 2;
        assert!(!set_rcvbuf_lock(&e), "already locked");
        e.locks_before = 1;
        e.locks_after = 1;
        assert!(!set_rcvbuf_lock(&e), "SO_SNDBUF lock is not a receive lock");
    }
}
