//! Buffer-size `setsockopt` calls: requested vs effective, clamps, failures, locks.
//!
//! Probe, where cgroup2 exists: `cgroup/setsockopt` at the cgroup2 root runs only for
//! setsockopt calls, before the kernel's handler, and sends one [`SockoptEvent`] per buffer
//! call with the request and the socket's state before it (process context: the caller is
//! exact). The outcome — return value, effective size, lock bits — is then derived here from
//! the kernel's own rules ([`derive`]: `sk_setsockopt` in net/core/sock.c), with the floors
//! measured from this kernel at start-up and `rmem_max`/`wmem_max` as read at the poll; the
//! integration tests check it against `getsockopt` readbacks. Fallback (no cgroup2):
//! `sys_enter_setsockopt` + `sys_exit_setsockopt`, which read the outcome itself but tax
//! every syscall of every task while attached.
//!
//! Each event is counted per (proto, option); the last call per (socket, option) is kept for
//! advice.

use std::collections::BTreeMap;

use foldhash::{HashMap, HashMapExt as _};
use prometheus::proto::MetricFamily;

use bufscope_common::{
    SOCK_RCVBUF_LOCK, SOCK_SNDBUF_LOCK, SockoptEvent, event_kind, sockopt_flags, total_family,
};

use super::{
    AdviceCx, BuildCx, GcCx, NoFlags, Part, PollCx, ProcStats, Room, Services, Signal, decode,
    when_attached,
};
use crate::advice::{Inputs, SocketOpt};
use crate::bpf::{Hook, LoadPlan, ProbeSpec};
use crate::exposition::Spec;
use crate::kernel::BufferLimits;
use crate::labels::{BufOption, Proto};
use crate::store::{ProcRef, Who};
use crate::totals::Total;

/// The probe.
pub const PROBE: ProbeSpec = ProbeSpec {
    name: "setsockopt",
    what: "SO_RCVBUF/SO_SNDBUF/*FORCE/SO_BUF_LOCK calls: requested vs effective, clamps, failures, locks",
    variants: &[
        // Runs only for setsockopt calls: no cost to any other syscall.
        &[Hook::CgroupSetsockopt {
            prog: "cgroup_setsockopt",
        }],
        // Without cgroup2: the syscall tracepoints, which put every syscall of every task on
        // the tracing slow path while attached.
        &[
            Hook::Tracepoint {
                prog: "sys_enter_setsockopt",
                category: "syscalls",
                name: "sys_enter_setsockopt",
            },
            Hook::Tracepoint {
                prog: "sys_exit_setsockopt",
                category: "syscalls",
                name: "sys_exit_setsockopt",
            },
        ],
    ],
    is_drop_probe: false,
    attributed: true,
};

/// Most per-socket notes kept for advice (an arbitrary old one goes first).
const MAX_NOTES: usize = 20_000;

/// Counts of one (proto, option) pair.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockoptCounts {
    /// Calls.
    pub calls: u64,
    /// Calls whose value the kernel clamped to `rmem_max`/`wmem_max`.
    pub clamped: u64,
    /// Calls that failed (e.g. `*FORCE` without CAP_NET_ADMIN: EPERM).
    pub failed: u64,
}

/// What this signal adds to a process.
#[derive(Clone, Debug, Default)]
pub struct ProcSockopt {
    /// Buffer setsockopt calls by (proto, option).
    pub calls: BTreeMap<(Proto, BufOption), SockoptCounts>,
    /// Sockets that got `SOCK_RCVBUF_LOCK`, by proto (by setsockopt here, or inherited from a
    /// locked listener: [`crate::signals::tcp_state`] adds those).
    pub rcvbuf_locks: BTreeMap<Proto, u64>,
}

impl Part for ProcSockopt {
    fn absorb(&mut self, o: &Self) {
        for (k, v) in &o.calls {
            let c = self.calls.entry(*k).or_default();
            c.calls += v.calls;
            c.clamped += v.clamped;
            c.failed += v.failed;
        }
        for (k, v) in &o.rcvbuf_locks {
            *self.rcvbuf_locks.entry(*k).or_default() += v;
        }
    }

    fn has_counts(&self) -> bool {
        !self.calls.is_empty() || !self.rcvbuf_locks.is_empty()
    }

    fn totals(&self, out: &mut Vec<Total>) {
        for ((proto, option), c) in &self.calls {
            for (family, value) in [
                (total_family::SETSOCKOPT_CALLS, c.calls),
                (total_family::SETSOCKOPT_CLAMPED, c.clamped),
                (total_family::SETSOCKOPT_FAILED, c.failed),
            ] {
                if value > 0 {
                    out.push(Total {
                        family,
                        proto: proto.to_ip(),
                        option: option.optname() as u8,
                        value,
                    });
                }
            }
        }
        for (proto, value) in &self.rcvbuf_locks {
            out.push(Total {
                family: total_family::RCVBUF_LOCKS,
                proto: proto.to_ip(),
                option: 0,
                value: *value,
            });
        }
    }

    fn restore(&mut self, t: &Total) {
        let proto = Proto::from_ip(t.proto);
        if t.family == total_family::RCVBUF_LOCKS {
            *self.rcvbuf_locks.entry(proto).or_default() += t.value;
            return;
        }
        let Some(option) = BufOption::from_optname(t.option as i32) else {
            return;
        };
        let c = self.calls.entry((proto, option)).or_default();
        match t.family {
            total_family::SETSOCKOPT_CALLS => c.calls += t.value,
            total_family::SETSOCKOPT_CLAMPED => c.clamped += t.value,
            total_family::SETSOCKOPT_FAILED => c.failed += t.value,
            _ => {}
        }
    }

    fn status(&self, row: &mut bufscope_api::ProcessRow) {
        row.setsockopt = self.calls.values().map(|c| c.calls).sum();
        row.clamped = self.calls.values().map(|c| c.clamped).sum();
        row.failed = self.calls.values().map(|c| c.failed).sum();
        row.rcvbuf_locks = self.rcvbuf_locks.values().sum();
    }
}

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

/// `EINVAL`.
const EINVAL: i32 = 22;
/// `EPERM`.
const EPERM: i32 = 1;

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
    /// Measures them with a UDP socket of this process: `SO_RCVBUF`/`SO_SNDBUF` of 0 read
    /// back as the floors (the defaults of 6.x x86_64 kernels when that fails).
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
        measured.unwrap_or(Self {
            rcvbuf: 2304,
            sndbuf: 4608,
        })
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

/// The setsockopt room.
pub struct Setsockopt {
    /// Last call per (socket, option), for advice.
    notes: HashMap<(u64, BufOption), SocketOpt>,
    floors: Floors,
    /// Calls whose outcome could not be derived (ceiling unknown) were already logged.
    warned_underived: bool,
}

impl Room for Setsockopt {
    const PROBE: ProbeSpec = PROBE;
    type Part = ProcSockopt;
    type Flags = NoFlags;
    type Setup = ();

    fn prepare(_flags: &NoFlags, _plan: &mut LoadPlan) -> anyhow::Result<()> {
        Ok(())
    }

    /// The room, when its probe attached (it reads only the ring buffer).
    fn take(
        _setup: (),
        _ebpf: &mut aya::Ebpf,
        env: &BuildCx<'_>,
        _services: &mut Services,
    ) -> anyhow::Result<Option<Box<dyn Signal>>> {
        when_attached(env, PROBE.name, Self::new)
    }
}

impl Default for Setsockopt {
    fn default() -> Self {
        Self::new()
    }
}

impl Setsockopt {
    /// The room, with this kernel's buffer floors.
    pub fn new() -> Self {
        Self {
            notes: HashMap::new(),
            floors: Floors::measure(),
            warned_underived: false,
        }
    }

    /// Counts one call and returns whom it was attributed to.
    fn count(ev: &SockoptEvent, option: BufOption, clamped: bool, cx: &mut PollCx<'_>) -> Who {
        let proto = Proto::from_ip(ev.proto);
        let who = if ev.owner.tgid == 0 {
            cx.store.count_unknown(PROBE.name, 1);
            Who::Unknown
        } else {
            let p = cx.attr.owner(&ev.owner);
            // An exec since its last event: this call already counts under the new name.
            cx.attr.apply_renames(cx.store);
            Who::Proc(p)
        };
        let attr = &*cx.attr;
        let s = cx.store.proc_mut(who, || match who {
            Who::Proc(p) => attr.meta(&p),
            Who::Unknown => Default::default(),
        });
        let c = s.parts.setsockopt.calls.entry((proto, option)).or_default();
        c.calls += 1;
        if ev.ret != 0 {
            c.failed += 1;
        }
        if clamped {
            c.clamped += 1;
        }
        if set_rcvbuf_lock(ev) {
            *s.parts.setsockopt.rcvbuf_locks.entry(proto).or_default() += 1;
        }
        who
    }

    fn note(&mut self, ev: &SockoptEvent, option: BufOption, clamped: bool, owner: ProcRef) {
        let key = (ev.inode, option);
        if self.notes.len() >= MAX_NOTES && !self.notes.contains_key(&key) {
            // Bounded: forget an arbitrary old note rather than grow without limit.
            if let Some(k) = self.notes.keys().next().copied() {
                self.notes.remove(&k);
            }
        }
        let effective = if option.is_send() {
            ev.sndbuf_after
        } else {
            ev.rcvbuf_after
        };
        self.notes.insert(
            key,
            SocketOpt {
                owner,
                inode: ev.inode,
                proto: Proto::from_ip(ev.proto),
                option,
                requested: ev.requested as i64,
                effective: effective as i64,
                ret: ev.ret,
                clamped,
            },
        );
    }
}

impl Signal for Setsockopt {
    fn name(&self) -> &'static str {
        PROBE.name
    }

    fn families(&self, procs: &[(String, &ProcStats)], out: &mut Vec<MetricFamily>) {
        families(procs, out);
    }

    fn event_kinds(&self) -> &'static [u32] {
        &[event_kind::SOCKOPT]
    }

    /// Built from events, kept in the pinned `TOTALS` ([`Part::totals`]): they go on across
    /// a restart like the families read from maps.
    fn map_counters(&self) -> &'static [&'static str] {
        FAMILIES
    }

    fn on_event(&mut self, _kind: u32, bytes: &[u8], cx: &mut PollCx<'_>) {
        let Some(mut ev) = decode::<SockoptEvent>(bytes) else {
            return;
        };
        let derived = derive(&mut ev, &cx.limits, self.floors);
        let Some(option) = BufOption::from_optname(ev.optname) else {
            return;
        };
        if !derived {
            // The ceiling is unknown: the size is reported as requested, no clamp is claimed.
            if option.is_send() {
                ev.sndbuf_after = ev.applied;
            } else {
                ev.rcvbuf_after = ev.applied;
            }
            if !self.warned_underived {
                self.warned_underived = true;
                tracing::warn!(
                    "net.core.rmem_max/wmem_max are not readable here: the effective size of \
                     SO_RCVBUF/SO_SNDBUF calls is reported as requested and clamps are not \
                     counted"
                );
            }
        }
        let clamped = derived && clamped(&ev);
        tracing::debug!(
            pid = ev.owner.tgid,
            inode = ev.inode,
            option = option.as_str(),
            requested = ev.requested,
            ret = ev.ret,
            rcvbuf = ev.rcvbuf_after,
            sndbuf = ev.sndbuf_after,
            locks = ev.locks_after,
            derived = ev.flags & sockopt_flags::BEFORE_HANDLER != 0,
            clamped,
            "setsockopt outcome"
        );
        if let Who::Proc(p) = Self::count(&ev, option, clamped, cx) {
            self.note(&ev, option, clamped, p);
        }
    }

    fn gc(&mut self, cx: &mut GcCx<'_>) -> usize {
        self.notes.retain(|(ino, _), _| cx.live.contains(ino));
        0
    }

    fn advise(&self, _cx: &AdviceCx<'_>, inputs: &mut Inputs) {
        inputs.opts.extend(self.notes.values().cloned());
    }
}

const CALLS: Spec = Spec::counter(
    "bufscope_setsockopt_total",
    "Buffer-size setsockopt(SOL_SOCKET) calls (SO_RCVBUF, SO_SNDBUF, SO_RCVBUFFORCE, SO_SNDBUFFORCE, SO_BUF_LOCK).",
    &["proto", "option"],
);
const CLAMPED: Spec = Spec::counter(
    "bufscope_setsockopt_clamped_total",
    "Buffer-size setsockopt calls whose value the kernel clamped to net.core.rmem_max/wmem_max.",
    &["proto", "option"],
);
const FAILED: Spec = Spec::counter(
    "bufscope_setsockopt_failed_total",
    "Buffer-size setsockopt calls that failed (e.g. SO_RCVBUFFORCE without CAP_NET_ADMIN).",
    &["proto", "option"],
);
/// Every family of this room (all built from events).
const FAMILIES: &[&str] = &[CALLS.name, CLAMPED.name, FAILED.name, LOCKS.name];

const LOCKS: Spec = Spec::counter(
    "bufscope_rcvbuf_locks_total",
    "Sockets that got SOCK_RCVBUF_LOCK (receive autotuning off), by setsockopt or inherited from a locked listener.",
    &["proto"],
);

/// The setsockopt families.
fn families(procs: &[(String, &ProcStats)], out: &mut Vec<MetricFamily>) {
    type Pick = fn(&SockoptCounts) -> u64;
    let counts: [(&Spec, Pick); 3] = [
        (&CALLS, |c| c.calls),
        (&CLAMPED, |c| c.clamped),
        (&FAILED, |c| c.failed),
    ];
    for (spec, pick) in counts {
        spec.per_process(procs, out, |s, emit| {
            for ((proto, opt), c) in &s.parts.setsockopt.calls {
                emit(&[proto.as_str(), opt.as_str()], pick(c) as f64);
            }
        });
    }
    LOCKS.per_process(procs, out, |s, emit| {
        for (proto, v) in &s.parts.setsockopt.rcvbuf_locks {
            emit(&[proto.as_str()], *v as f64);
        }
    });
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

    /// What the kernel gave on 6.18 with rmem_max = wmem_max = 4194304 (`getsockopt` readbacks):
    /// the derivation must give the same for every row.
    #[test]
    fn derived_outcomes_match_the_kernel_table() {
        let limits = BufferLimits {
            rmem_max: Some(4_194_304),
            wmem_max: Some(4_194_304),
            tcp_rmem_max: None,
        };
        let floors = Floors {
            rcvbuf: 2304,
            sndbuf: 4608,
        };
        let before = |optname: i32, requested: i32, flags: u8| SockoptEvent {
            optname,
            requested,
            applied: requested,
            optlen: 4,
            rcvbuf_after: 212_992,
            sndbuf_after: 212_992,
            flags: sockopt_flags::BEFORE_HANDLER | flags,
            ..Default::default()
        };
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
        // A call the guard skipped changed nothing; one it raised is judged by what it applied.
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

    #[test]
    fn floors_are_measured_on_this_kernel() {
        let f = Floors::measure();
        assert!(f.rcvbuf >= 2048 && f.sndbuf == 2 * f.rcvbuf, "{f:?}");
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

#[cfg(test)]
mod room_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::signals::testkit::{Bench, me, my_proc, record};
    use bufscope_common::{IPPROTO_UDP, SO_RCVBUF, SO_RCVBUFFORCE};
    use foldhash::HashSet;

    fn room() -> Setsockopt {
        Setsockopt {
            notes: HashMap::new(),
            floors: Floors {
                rcvbuf: 2304,
                sndbuf: 4608,
            },
            warned_underived: false,
        }
    }

    /// A call as the `cgroup/setsockopt` program reports it: before the kernel's handler.
    fn call(optname: i32, requested: i32, flags: u8) -> SockoptEvent {
        SockoptEvent {
            kind: event_kind::SOCKOPT,
            optname,
            owner: me(),
            inode: 77,
            requested,
            applied: requested,
            optlen: 4,
            rcvbuf_after: 212_992,
            sndbuf_after: 212_992,
            proto: IPPROTO_UDP,
            flags: sockopt_flags::BEFORE_HANDLER | flags,
            ..Default::default()
        }
    }

    fn count(b: &Bench, r: &Setsockopt, family: &str, option: &str) -> f64 {
        b.sample(
            r,
            family,
            my_proc().tgid,
            &[("proto", "udp"), ("option", option)],
        )
    }

    /// Records decoded from the ring buffer's bytes: the outcome derived with this poll's
    /// `rmem_max` (4 MiB), counted per (proto, option) on the caller, noted for advice.
    #[test]
    fn calls_are_derived_counted_and_noted() {
        let mut b = Bench::new();
        let mut r = room();
        let mut again = call(SO_RCVBUF, 65536, 0);
        again.locks_before = SOCK_RCVBUF_LOCK;
        again.locks_after = SOCK_RCVBUF_LOCK;
        for ev in [
            call(SO_RCVBUF, 1 << 30, 0),
            again,
            call(SO_RCVBUFFORCE, 64 << 20, 0),
        ] {
            r.on_event(event_kind::SOCKOPT, &record(&ev), &mut b.poll());
        }
        assert_eq!(count(&b, &r, "bufscope_setsockopt_total", "SO_RCVBUF"), 2.0);
        assert_eq!(
            count(&b, &r, "bufscope_setsockopt_clamped_total", "SO_RCVBUF"),
            1.0
        );
        assert_eq!(
            count(&b, &r, "bufscope_setsockopt_failed_total", "SO_RCVBUFFORCE"),
            1.0,
            "EPERM without CAP_NET_ADMIN"
        );
        let locks = b.sample(
            &r,
            "bufscope_rcvbuf_locks_total",
            my_proc().tgid,
            &[("proto", "udp")],
        );
        assert_eq!(
            locks, 1.0,
            "the first call locked the buffer; the second found it locked"
        );
        let mut inputs = Inputs::default();
        r.advise(&b.advice(), &mut inputs);
        let notes: Vec<_> = inputs
            .opts
            .iter()
            .map(|o| (o.option, o.effective, o.ret))
            .collect();
        assert!(
            notes.contains(&(BufOption::Rcvbuf, 131_072, 0)),
            "{notes:?}"
        );
        assert!(
            notes.contains(&(BufOption::RcvbufForce, 212_992, -EPERM)),
            "{notes:?}"
        );
    }

    /// Without the ceiling the outcome is not made up: the call counts, the clamp does not.
    #[test]
    fn unknown_ceiling_counts_the_call_only() {
        let mut b = Bench::new();
        b.limits = BufferLimits::default();
        let mut r = room();
        let ev = call(SO_RCVBUF, 1 << 30, 0);
        r.on_event(event_kind::SOCKOPT, &record(&ev), &mut b.poll());
        assert_eq!(count(&b, &r, "bufscope_setsockopt_total", "SO_RCVBUF"), 1.0);
        assert_eq!(
            count(&b, &r, "bufscope_setsockopt_clamped_total", "SO_RCVBUF"),
            0.0
        );
        assert!(r.warned_underived);
    }

    /// A call without an owner goes to `_unknown`; GC forgets the notes of closed sockets.
    #[test]
    fn unowned_calls_and_gc() {
        let mut b = Bench::new();
        let mut r = room();
        let mut ev = call(SO_RCVBUF, 65536, 0);
        ev.owner.tgid = 0;
        r.on_event(event_kind::SOCKOPT, &record(&ev), &mut b.poll());
        assert_eq!(b.store.attribution_unknown.get("setsockopt"), Some(&1));
        r.on_event(
            event_kind::SOCKOPT,
            &record(&call(SO_RCVBUF, 65536, 0)),
            &mut b.poll(),
        );
        assert_eq!(r.notes.len(), 1);
        b.gc(&mut r, &[77].into_iter().collect());
        assert_eq!(r.notes.len(), 1, "socket 77 is live");
        b.gc(&mut r, &HashSet::default());
        assert!(r.notes.is_empty());
    }
}
