//! The outcome of a buffer `setsockopt` call, derived by the kernel's own rules
//! (`sk_setsockopt` in net/core/sock.c) when the probe saw the call before the kernel's
//! handler, and whether the kernel clamped it: the facts the room counts and advice reads.

use bufscope_common::{SOCK_RCVBUF_LOCK, SOCK_SNDBUF_LOCK, SockoptEvent, sockopt_flags};

use crate::kernel::BufferLimits;
use crate::labels::BufOption;

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
    if ev.flags & sockopt_flags::GUARD_SKIPPED != 0 {
        return false;
    }
    // What the kernel's handler got (the guard may have raised the request).
    let val = ev.applied;
    let (requested, effective) = match BufOption::from_optname(ev.optname) {
        Some(BufOption::Rcvbuf) => (val as u32 as u64, ev.rcvbuf_after),
        Some(BufOption::Sndbuf) => (val as u32 as u64, ev.sndbuf_after),
        Some(BufOption::RcvbufForce) => (val.max(0) as u64, ev.rcvbuf_after),
        Some(BufOption::SndbufForce) => (val.max(0) as u64, ev.sndbuf_after),
        Some(BufOption::BufLock) | None => return false,
    };
    (effective.max(0) as u64) < 2 * requested.min(INT_MAX_HALF)
}

/// True when this call turned receive autotuning off for the socket.
pub fn set_rcvbuf_lock(ev: &SockoptEvent) -> bool {
    ev.ret == 0 && ev.locks_before & SOCK_RCVBUF_LOCK == 0 && ev.locks_after & SOCK_RCVBUF_LOCK != 0
}

/// True when this call turned send autotuning off for the socket (`SOCK_SNDBUF_LOCK`: a
/// successful `SO_SNDBUF`/`SO_SNDBUFFORCE`, or `SO_BUF_LOCK` with the bit).
pub fn set_sndbuf_lock(ev: &SockoptEvent) -> bool {
    ev.ret == 0 && ev.locks_before & SOCK_SNDBUF_LOCK == 0 && ev.locks_after & SOCK_SNDBUF_LOCK != 0
}

/// `EINVAL`.
pub(super) const EINVAL: i32 = 22;
/// `EPERM`.
pub(super) const EPERM: i32 = 1;

/// The kernel's buffer floors, `SOCK_MIN_RCVBUF` and `SOCK_MIN_SNDBUF` (2048 +
/// `SKB_DATA_ALIGN(sizeof(struct sk_buff))`, and twice that): they depend on the kernel's
/// build, so they are measured on it (a request of 0 is raised to the floor).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Floors {
    /// `SOCK_MIN_RCVBUF`.
    pub rcvbuf: i32,
    /// `SOCK_MIN_SNDBUF`.
    pub sndbuf: i32,
}

impl Floors {
    /// The floors of 6.x x86_64 kernels, used when the measurement fails or is not believable.
    const DEFAULT: Self = Self {
        rcvbuf: 2304,
        sndbuf: 4608,
    };

    /// Measures them with a UDP socket of this process: `SO_RCVBUF`/`SO_SNDBUF` of 0 read
    /// back as the floors. A readback that cannot be a floor (outside 2048 + 0..2048, or a
    /// send floor other than twice the receive one) means something changed the request on
    /// its way — a `cgroup/setsockopt` program such as a buffer guard attached above this
    /// process raises small UDP requests —, and the defaults are used.
    pub fn measure() -> Self {
        let measured = (|| {
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).ok()?;
            s.set_recv_buffer_size(0).ok()?;
            s.set_send_buffer_size(0).ok()?;
            Some(Self {
                rcvbuf: i32::try_from(s.recv_buffer_size().ok()?).ok()?,
                sndbuf: i32::try_from(s.send_buffer_size().ok()?).ok()?,
            })
        })();
        match measured {
            Some(f) if f.believable() => f,
            Some(f) => {
                tracing::warn!(
                    measured = ?f,
                    "SO_RCVBUF/SO_SNDBUF of 0 did not read back as the kernel's floors (a \
                     cgroup/setsockopt program changed the request?): using 2304/4608"
                );
                Self::DEFAULT
            }
            None => Self::DEFAULT,
        }
    }

    /// Whether these can be the kernel's floors: 2048 + `SKB_DATA_ALIGN(sizeof(struct
    /// sk_buff))` (an sk_buff is a few hundred bytes), and the send floor twice that.
    fn believable(self) -> bool {
        (2048..4096).contains(&self.rcvbuf) && self.sndbuf == 2 * self.rcvbuf
    }
}

/// Fills in the outcome of a call seen before the kernel's handler
/// ([`sockopt_flags::BEFORE_HANDLER`]), by the rules of `sk_setsockopt` (6.x):
///
/// - `optlen < sizeof(int)` → `-EINVAL`;
/// - `SO_RCVBUF`: `__sock_set_rcvbuf(sk, min_t(u32, val, rmem_max))`; `SO_SNDBUF` likewise with
///   `wmem_max`; `*FORCE`: `-EPERM` without `CAP_NET_ADMIN` (initial user namespace), else
///   `max(val, 0)` unclamped; setting stores `max(min(val, INT_MAX/2) * 2, SOCK_MIN_*BUF)` and
///   sets the option's lock bit;
/// - `SO_BUF_LOCK`: `-EINVAL` for bits outside `SOCK_BUF_LOCK_MASK`, else the lock bits become
///   `val`.
///
/// Returns false (event left as it is) when the ceiling it needs is unknown here.
pub fn derive(ev: &mut SockoptEvent, limits: &BufferLimits, floors: Floors) -> bool {
    if ev.flags & sockopt_flags::BEFORE_HANDLER == 0 {
        return true;
    }
    let Some(option) = BufOption::from_optname(ev.optname) else {
        return true;
    };
    if ev.flags & sockopt_flags::GUARD_SKIPPED != 0 {
        // The kernel's handler did not run: success, nothing changed.
        return true;
    }
    if ev.optlen < 4 {
        ev.ret = -EINVAL;
        return true;
    }
    // What the kernel's handler got (the guard may have raised the request).
    let val = ev.applied;
    let net_admin = ev.flags & sockopt_flags::NET_ADMIN != 0;
    let set = |val: i32, floor: i32| val.min(i32::MAX / 2).saturating_mul(2).max(floor);
    let ceiling = |max: Option<i64>| max.map(|m| m.clamp(0, u32::MAX as i64) as u32);
    match option {
        BufOption::Rcvbuf | BufOption::Sndbuf => {
            let send = option.is_send();
            let Some(max) = ceiling(if send {
                limits.wmem_max
            } else {
                limits.rmem_max
            }) else {
                return false;
            };
            let val = (val as u32).min(max) as i32;
            apply(
                ev,
                send,
                set(val, if send { floors.sndbuf } else { floors.rcvbuf }),
            );
        }
        BufOption::RcvbufForce | BufOption::SndbufForce if !net_admin => ev.ret = -EPERM,
        BufOption::RcvbufForce => apply(ev, false, set(val.max(0), floors.rcvbuf)),
        BufOption::SndbufForce => apply(ev, true, set(val.max(0), floors.sndbuf)),
        BufOption::BufLock => {
            let mask = (SOCK_RCVBUF_LOCK | SOCK_SNDBUF_LOCK) as i32;
            if val & !mask != 0 {
                ev.ret = -EINVAL;
            } else {
                ev.locks_after = val as u8;
            }
        }
    }
    true
}

/// Stores a new size and sets the option's lock bit.
fn apply(ev: &mut SockoptEvent, send: bool, size: i32) {
    if send {
        ev.sndbuf_after = size;
        ev.locks_after |= SOCK_SNDBUF_LOCK;
    } else {
        ev.rcvbuf_after = size;
        ev.locks_after |= SOCK_RCVBUF_LOCK;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bufscope_common::{SO_BUF_LOCK, SO_RCVBUF, SO_RCVBUFFORCE, SO_SNDBUF};

    fn ev(optname: i32, requested: i32, rcv_after: i32, snd_after: i32) -> SockoptEvent {
        SockoptEvent {
            optname,
            requested,
            applied: requested,
            optlen: 4,
            rcvbuf_after: rcv_after,
            sndbuf_after: snd_after,
            ..Default::default()
        }
    }

    /// `getsockopt` readbacks measured on 6.18 with rmem_max = wmem_max = 4194304.
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

    /// rmem_max = wmem_max = 4194304, as in the kernel table below.
    const LIMITS: BufferLimits = BufferLimits {
        rmem_max: Some(4_194_304),
        wmem_max: Some(4_194_304),
        tcp_rmem_max: None,
        tcp_wmem_max: None,
    };
    const FLOORS: Floors = Floors {
        rcvbuf: 2304,
        sndbuf: 4608,
    };

    /// A call the probe saw before the kernel's handler, on a socket with 212992-byte buffers.
    fn before(optname: i32, requested: i32, flags: u8) -> SockoptEvent {
        SockoptEvent {
            optname,
            requested,
            applied: requested,
            optlen: 4,
            rcvbuf_after: 212_992,
            sndbuf_after: 212_992,
            flags: sockopt_flags::BEFORE_HANDLER | flags,
            ..Default::default()
        }
    }

    /// What the kernel gave on 6.18 with rmem_max = wmem_max = 4194304 (`getsockopt` readbacks):
    /// the derivation must give the same for every row.
    #[test]
    fn derived_outcomes_match_the_kernel_table() {
        let (limits, floors) = (LIMITS, FLOORS);
        let admin = sockopt_flags::NET_ADMIN;
        // (option, value, caps, ret, rcvbuf, sndbuf, locks)
        let rows: &[(i32, i32, u8, i32, i32, i32, u8)] = &[
            (SO_RCVBUF, 0, 0, 0, 2304, 212_992, 2),
            (SO_RCVBUF, 1000, 0, 0, 2304, 212_992, 2),
            (SO_RCVBUF, 65536, 0, 0, 131_072, 212_992, 2),
            (SO_RCVBUF, 4_194_305, 0, 0, 8_388_608, 212_992, 2),
            (SO_RCVBUF, 1 << 30, 0, 0, 8_388_608, 212_992, 2),
            (SO_RCVBUF, -1, 0, 0, 8_388_608, 212_992, 2),
            (SO_SNDBUF, 0, 0, 0, 212_992, 4608, 1),
            (SO_SNDBUF, 65536, 0, 0, 212_992, 131_072, 1),
            (SO_SNDBUF, -1, 0, 0, 212_992, 8_388_608, 1),
            (SO_RCVBUFFORCE, 64 << 20, admin, 0, 134_217_728, 212_992, 2),
            (SO_RCVBUFFORCE, -1, admin, 0, 2304, 212_992, 2),
            (SO_RCVBUFFORCE, 64 << 20, 0, -EPERM, 212_992, 212_992, 0),
            (
                bufscope_common::SO_SNDBUFFORCE,
                64 << 20,
                admin,
                0,
                212_992,
                134_217_728,
                1,
            ),
            (
                bufscope_common::SO_SNDBUFFORCE,
                0,
                0,
                -EPERM,
                212_992,
                212_992,
                0,
            ),
            (SO_BUF_LOCK, 3, 0, 0, 212_992, 212_992, 3),
            (SO_BUF_LOCK, 4, 0, -EINVAL, 212_992, 212_992, 0),
        ];
        for &(opt, val, caps, ret, rcv, snd, locks) in rows {
            let mut ev = before(opt, val, caps);
            assert!(derive(&mut ev, &limits, floors));
            assert_eq!(
                (ev.ret, ev.rcvbuf_after, ev.sndbuf_after, ev.locks_after),
                (ret, rcv, snd, locks),
                "optname {opt} value {val} caps {caps}"
            );
        }
        let mut short = before(SO_RCVBUF, 65536, 0);
        short.optlen = 2;
        assert!(derive(&mut short, &limits, floors));
        assert_eq!(short.ret, -EINVAL);
        // Clamp detection works on derived events as on measured ones.
        let mut big = before(SO_RCVBUF, 1 << 30, 0);
        derive(&mut big, &limits, floors);
        assert!(clamped(&big));
    }

    /// A call the guard skipped changed nothing; one it raised is judged by what it applied.
    #[test]
    fn guard_decisions_are_derived_from_what_the_handler_got() {
        let (limits, floors) = (LIMITS, FLOORS);
        let mut skipped = before(SO_RCVBUF, 65536, sockopt_flags::GUARD_SKIPPED);
        assert!(derive(&mut skipped, &limits, floors));
        assert_eq!(
            (skipped.ret, skipped.rcvbuf_after, skipped.locks_after),
            (0, 212_992, 0)
        );
        assert!(!clamped(&skipped));
        let mut raised = before(SO_RCVBUF, 65536, sockopt_flags::GUARD_RAISED);
        raised.applied = 7 << 20;
        assert!(derive(&mut raised, &limits, floors));
        assert_eq!(
            raised.rcvbuf_after, 8_388_608,
            "7 MiB clamped to rmem_max 4 MiB"
        );
        assert!(clamped(&raised));
        // Without the ceiling nothing is made up.
        let mut unknown = before(SO_RCVBUF, 65536, 0);
        assert!(!derive(&mut unknown, &BufferLimits::default(), floors));
    }

    /// The measurement is checked: a readback raised by someone's buffer guard (a
    /// `cgroup/setsockopt` program at the cgroup root raises every small UDP request on the
    /// machine, this test's too) is not taken for the floors.
    #[test]
    fn floors_are_measured_on_this_kernel_and_checked() {
        let f = Floors::measure();
        assert!(f.believable(), "{f:?}");
        let raised = Floors {
            rcvbuf: 8_388_608,
            sndbuf: 8_388_608,
        };
        assert!(!raised.believable());
        assert!(
            !Floors {
                rcvbuf: 2304,
                sndbuf: 2304
            }
            .believable()
        );
        assert!(Floors::DEFAULT.believable());
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
        e.locks_before = 0;
        assert!(set_sndbuf_lock(&e), "SO_SNDBUF set the send lock");
        e.locks_before = 1;
        assert!(!set_sndbuf_lock(&e), "already locked");
        e.locks_before = 0;
        e.ret = -1;
        assert!(!set_sndbuf_lock(&e), "a failed call sets nothing");
    }
}
