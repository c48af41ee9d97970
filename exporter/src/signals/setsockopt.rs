//! Buffer-size `setsockopt` calls: requested vs effective, clamps, failures, locks.
//!
//! Probe: `sys_enter_setsockopt` records the request and the lock bits before the call,
//! `sys_exit_setsockopt` the result and the effective sizes after it, and sends one
//! [`SockoptEvent`] per call (process context: the caller is exact). Each event is counted per
//! (proto, option); the last call per (socket, option) is kept for advice.

use std::collections::BTreeMap;

use foldhash::{HashMap, HashMapExt as _};
use prometheus::proto::MetricFamily;

use bufscope_common::{SOCK_RCVBUF_LOCK, SockoptEvent, event_kind};

use super::{AdviceCx, BuildEnv, Cx, GcCx, Signal, decode};
use crate::advice::{Inputs, SocketOpt};
use crate::metrics::per_process;
use crate::probes::{Hook, ProbeSpec};
use crate::store::{ProcRef, ProcStats, Proto, Who};

/// The probe.
pub const PROBE: ProbeSpec = ProbeSpec {
    name: "setsockopt",
    what: "SO_RCVBUF/SO_SNDBUF/*FORCE/SO_BUF_LOCK calls: requested vs effective, clamps, failures, locks",
    hooks: &[
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
    is_drop_probe: false,
};

/// Most per-socket notes kept for advice (an arbitrary old one goes first).
const MAX_NOTES: usize = 20_000;

/// A buffer-size socket option, as the `option` label says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BufOption {
    /// `SO_RCVBUF`.
    Rcvbuf,
    /// `SO_SNDBUF`.
    Sndbuf,
    /// `SO_RCVBUFFORCE`.
    RcvbufForce,
    /// `SO_SNDBUFFORCE`.
    SndbufForce,
    /// `SO_BUF_LOCK`.
    BufLock,
}

impl BufOption {
    /// From the `optname` number.
    pub fn from_optname(o: i32) -> Option<Self> {
        use bufscope_common as c;
        Some(match o {
            c::SO_RCVBUF => Self::Rcvbuf,
            c::SO_SNDBUF => Self::Sndbuf,
            c::SO_RCVBUFFORCE => Self::RcvbufForce,
            c::SO_SNDBUFFORCE => Self::SndbufForce,
            c::SO_BUF_LOCK => Self::BufLock,
            _ => return None,
        })
    }

    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rcvbuf => "SO_RCVBUF",
            Self::Sndbuf => "SO_SNDBUF",
            Self::RcvbufForce => "SO_RCVBUFFORCE",
            Self::SndbufForce => "SO_SNDBUFFORCE",
            Self::BufLock => "SO_BUF_LOCK",
        }
    }

    /// True for the options that size the send buffer.
    pub fn is_send(self) -> bool {
        matches!(self, Self::Sndbuf | Self::SndbufForce)
    }
}

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

impl ProcSockopt {
    /// Adds `o` (a folded process) to `self`.
    pub fn absorb(&mut self, o: &Self) {
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

    /// Whether anything was counted.
    pub fn has_counts(&self) -> bool {
        !self.calls.is_empty() || !self.rcvbuf_locks.is_empty()
    }

    /// Status-page columns.
    pub fn status(&self, row: &mut serde_json::Map<String, serde_json::Value>) {
        let (mut calls, mut clamped, mut failed) = (0u64, 0u64, 0u64);
        for c in self.calls.values() {
            calls += c.calls;
            clamped += c.clamped;
            failed += c.failed;
        }
        row.insert("setsockopt".into(), calls.into());
        row.insert("clamped".into(), clamped.into());
        row.insert("failed".into(), failed.into());
        row.insert(
            "rcvbuf_locks".into(),
            self.rcvbuf_locks.values().sum::<u64>().into(),
        );
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

/// The setsockopt room.
pub struct Setsockopt {
    /// Last call per (socket, option), for advice.
    notes: HashMap<(u64, BufOption), SocketOpt>,
}

impl Setsockopt {
    /// The room, when its probe attached (it reads only the ring buffer).
    pub fn take(env: &BuildEnv<'_>) -> Option<Self> {
        env.attached(PROBE.name).then(|| Self {
            notes: HashMap::new(),
        })
    }

    /// Counts one call and returns whom it was attributed to.
    fn count(ev: &SockoptEvent, option: BufOption, clamped: bool, cx: &mut Cx<'_>) -> Who {
        let proto = Proto::from_ip(ev.proto);
        let who = if ev.owner.tgid == 0 {
            cx.store.count_unknown(PROBE.name, 1);
            Who::Unknown
        } else {
            Who::Proc(cx.attr.owner(&ev.owner))
        };
        let attr = &*cx.attr;
        let s = cx.store.proc_mut(who, || match who {
            Who::Proc(p) => attr.meta(&p),
            Who::Unknown => Default::default(),
        });
        let c = s.sockopt.calls.entry((proto, option)).or_default();
        c.calls += 1;
        if ev.ret != 0 {
            c.failed += 1;
        }
        if clamped {
            c.clamped += 1;
        }
        if set_rcvbuf_lock(ev) {
            *s.sockopt.rcvbuf_locks.entry(proto).or_default() += 1;
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

    fn event_kinds(&self) -> &'static [u32] {
        &[event_kind::SOCKOPT]
    }

    fn on_event(&mut self, _kind: u32, bytes: &[u8], cx: &mut Cx<'_>) {
        let Some(ev) = decode::<SockoptEvent>(bytes) else {
            return;
        };
        let Some(option) = BufOption::from_optname(ev.optname) else {
            return;
        };
        let clamped = clamped(&ev);
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

/// The setsockopt families.
pub fn families(procs: &[(String, &ProcStats)], out: &mut Vec<MetricFamily>) {
    type Pick = fn(&SockoptCounts) -> u64;
    let counts: [(&str, &str, Pick); 3] = [
        (
            "bufscope_setsockopt_total",
            "Buffer-size setsockopt(SOL_SOCKET) calls (SO_RCVBUF, SO_SNDBUF, SO_RCVBUFFORCE, SO_SNDBUFFORCE, SO_BUF_LOCK).",
            |c| c.calls,
        ),
        (
            "bufscope_setsockopt_clamped_total",
            "Buffer-size setsockopt calls whose value the kernel clamped to net.core.rmem_max/wmem_max.",
            |c| c.clamped,
        ),
        (
            "bufscope_setsockopt_failed_total",
            "Buffer-size setsockopt calls that failed (e.g. SO_RCVBUFFORCE without CAP_NET_ADMIN).",
            |c| c.failed,
        ),
    ];
    for (name, help, pick) in counts {
        per_process(name, help, procs, out, |s, emit| {
            for ((proto, opt), c) in &s.sockopt.calls {
                emit(
                    &[("proto", proto.as_str()), ("option", opt.as_str())],
                    pick(c) as f64,
                );
            }
        });
    }
    per_process(
        "bufscope_rcvbuf_locks_total",
        "Sockets that got SOCK_RCVBUF_LOCK (receive autotuning off), by setsockopt or inherited from a locked listener.",
        procs,
        out,
        |s, emit| {
            for (proto, v) in &s.sockopt.rcvbuf_locks {
                emit(&[("proto", proto.as_str())], *v as f64);
            }
        },
    );
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
