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

use bufscope_common::{SockoptEvent, event_kind, sockopt_flags, total_family};

use super::{AdviceCx, GcCx, Part, PollCx, RingRoom, Row, Signal, absorb_counts, decode};
use crate::advice::{Inputs, SocketOpt};
use crate::bpf::{Hook, ProbeSpec};
use crate::exposition::Spec;
use crate::labels::{BufOption, Proto};
use crate::store::{ProcRef, Who};
use crate::totals::Total;

mod derive;
pub use derive::{Floors, clamped, derive, set_rcvbuf_lock};

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
        absorb_counts(&mut self.rcvbuf_locks, &o.rcvbuf_locks);
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

/// The setsockopt room.
pub struct Setsockopt {
    /// Last call per (socket, option), for advice.
    notes: HashMap<(u64, BufOption), SocketOpt>,
    floors: Floors,
    /// Calls whose outcome could not be derived (ceiling unknown) were already logged.
    warned_underived: bool,
}

impl RingRoom for Setsockopt {
    const PROBE: ProbeSpec = PROBE;
    type Part = ProcSockopt;

    fn start() -> Self {
        Self::new()
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
        let owner = cx.recorded(&ev.owner);
        let (who, s) = cx.counters(PROBE.name, owner, 1);
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

    fn families(&self, procs: &[Row], out: &mut Vec<MetricFamily>) {
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
fn families(procs: &[Row], out: &mut Vec<MetricFamily>) {
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
mod tests;
