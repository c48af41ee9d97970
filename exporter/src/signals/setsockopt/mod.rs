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
//! Each event is counted per (proto, option); every socket's calls are kept in order for
//! advice (its story: [`story`], bounded), with, for locked TCP sockets, what sock_diag says of
//! the connection. A successful `SO_RCVBUF`/`SO_SNDBUF` on TCP sets `SOCK_RCVBUF_LOCK` /
//! `SOCK_SNDBUF_LOCK` (that direction's autotuning off): counted as
//! `bufscope_rcvbuf_locks_total` and `bufscope_sndbuf_locks_total`.

use std::collections::BTreeMap;

use foldhash::{HashMap, HashMapExt as _};
use prometheus::proto::MetricFamily;

use bufscope_common::{SockoptEvent, event_kind, sockopt_flags, total_family};

use super::{AdviceCx, GcCx, Part, PollCx, RingRoom, Row, Signal, absorb_counts, decode};
use crate::advice::{CallRec, Inputs, LimitScope, NsLimits, SocketStory};
use crate::bpf::{Hook, ProbeSpec};
use crate::exposition::Spec;
use crate::labels::{BufOption, Proto};
use crate::store::{ProcRef, Who};
use crate::totals::Total;

mod derive;
mod story;
pub use derive::{Floors, clamped, derive, set_rcvbuf_lock, set_sndbuf_lock};
pub use story::{DIAG_EVERY, MAX_STORIES};

/// How soon a network namespace whose limits could not be read is tried again.
const NS_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether a namespace's view of the limits must be read (again) for a call of process `pid`:
/// never read; or not readable because the process looked through had exited by then (a
/// short-lived `ip -n <ns> …` that sized its netlink socket while configuring the namespace
/// before the daemon started: its events are decoded after it is gone) — at once through
/// another process —; or not readable for another reason (`EPERM`) — at most every
/// [`NS_RETRY`].
fn ns_stale(
    limits: Option<&NsLimits>,
    tried: Option<(std::time::Instant, u32)>,
    pid: u32,
    now: std::time::Instant,
) -> bool {
    let Some(l) = limits else {
        return true;
    };
    if l.scope != LimitScope::Unknown {
        return false;
    }
    let Some((at, by)) = tried else {
        return true;
    };
    let exited = matches!(l.unreadable, Some(libc::ENOENT | libc::ESRCH));
    (exited && by != pid) || now.duration_since(at) >= NS_RETRY
}

/// How the network namespaces of sockets that were never sized see the buffer limits: read
/// once per namespace through a process holding such a socket (another room's sockets — e.g.
/// one that drops — whose namespace no sized socket brought in), with [`ns_stale`]'s retries.
#[derive(Debug, Default)]
pub struct NsLimitCache {
    limits: BTreeMap<u32, NsLimits>,
    tried: BTreeMap<u32, (std::time::Instant, u32)>,
    own: Option<u32>,
}

impl NsLimitCache {
    /// Empty; bufscope's own namespace is the host's view.
    pub fn new() -> Self {
        Self {
            own: story::own_netns(),
            ..Self::default()
        }
    }

    /// Reads namespace `netns`'s view through process `pid` unless it is known already.
    pub fn note(&mut self, procfs: &crate::attribution::Procfs, netns: u32, pid: u32) {
        let now = std::time::Instant::now();
        if netns == 0
            || !ns_stale(
                self.limits.get(&netns),
                self.tried.get(&netns).copied(),
                pid,
                now,
            )
        {
            return;
        }
        let l = story::ns_limits(procfs, pid, self.own);
        self.tried.insert(netns, (now, pid));
        self.limits.insert(netns, l);
    }

    /// Forgets namespaces `keep` rejects.
    pub fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        self.limits.retain(|ns, _| keep(*ns));
        self.tried.retain(|ns, _| keep(*ns));
    }

    /// Adds the namespaces no other room has read to the advice's inputs.
    pub fn advise(&self, inputs: &mut Inputs) {
        for (ns, l) in &self.limits {
            inputs.ns_limits.entry(*ns).or_insert(*l);
        }
    }
}

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
    /// Sockets that got `SOCK_SNDBUF_LOCK` by setsockopt, by proto (send autotuning off).
    pub sndbuf_locks: BTreeMap<Proto, u64>,
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
        absorb_counts(&mut self.sndbuf_locks, &o.sndbuf_locks);
    }

    fn has_counts(&self) -> bool {
        !self.calls.is_empty() || !self.rcvbuf_locks.is_empty() || !self.sndbuf_locks.is_empty()
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
        for (family, locks) in [
            (total_family::RCVBUF_LOCKS, &self.rcvbuf_locks),
            (total_family::SNDBUF_LOCKS, &self.sndbuf_locks),
        ] {
            for (proto, value) in locks {
                out.push(Total {
                    family,
                    proto: proto.to_ip(),
                    option: 0,
                    value: *value,
                });
            }
        }
    }

    fn restore(&mut self, t: &Total) {
        let proto = Proto::from_ip(t.proto);
        if t.family == total_family::RCVBUF_LOCKS {
            *self.rcvbuf_locks.entry(proto).or_default() += t.value;
            return;
        }
        if t.family == total_family::SNDBUF_LOCKS {
            *self.sndbuf_locks.entry(proto).or_default() += t.value;
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
        row.sndbuf_locks = self.sndbuf_locks.values().sum();
    }
}

/// The setsockopt room.
pub struct Setsockopt {
    /// Every socket's calls, by inode, for advice.
    stories: HashMap<u64, std::sync::Arc<SocketStory>>,
    /// How each network namespace of those sockets sees the limits (read once per namespace).
    ns_limits: BTreeMap<u32, NsLimits>,
    /// When each namespace's view was last read, and through which process.
    ns_tried: BTreeMap<u32, (std::time::Instant, u32)>,
    /// bufscope's own network namespace.
    own_netns: Option<u32>,
    /// sock_diag sockets, one per namespace.
    diag: crate::kernel::sock_diag::Diag,
    /// The last sock_diag read.
    diag_at: Option<std::time::Instant>,
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
            stories: HashMap::new(),
            ns_limits: BTreeMap::new(),
            ns_tried: BTreeMap::new(),
            own_netns: story::own_netns(),
            diag: crate::kernel::sock_diag::Diag::new(),
            diag_at: None,
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
        if set_sndbuf_lock(ev) {
            *s.parts.setsockopt.sndbuf_locks.entry(proto).or_default() += 1;
        }
        who
    }

    /// Adds the call to its socket's story.
    fn note(
        &mut self,
        ev: &SockoptEvent,
        option: BufOption,
        clamped: bool,
        owner: ProcRef,
        procfs: &crate::attribution::Procfs,
    ) {
        if ev.inode == 0 {
            return;
        }
        if self.stories.len() >= MAX_STORIES && !self.stories.contains_key(&ev.inode) {
            // Bounded: forget an arbitrary old story rather than grow without limit.
            if let Some(k) = self.stories.keys().next().copied() {
                self.stories.remove(&k);
            }
        }
        // Read once per namespace; one that could not be read is read again (ns_stale).
        let now = std::time::Instant::now();
        if ns_stale(
            self.ns_limits.get(&ev.netns),
            self.ns_tried.get(&ev.netns).copied(),
            owner.tgid,
            now,
        ) {
            let l = story::ns_limits(procfs, owner.tgid, self.own_netns);
            self.ns_tried.insert(ev.netns, (now, owner.tgid));
            self.ns_limits.insert(ev.netns, l);
        }
        let effective = if option.is_send() {
            ev.sndbuf_after
        } else {
            ev.rcvbuf_after
        };
        // Shared with the last evaluation of the advice (and the findings it keeps): copied
        // only when one still holds it.
        let story = std::sync::Arc::make_mut(self.stories.entry(ev.inode).or_insert_with(|| {
            std::sync::Arc::new(SocketStory::new(
                owner,
                ev.inode,
                Proto::from_ip(ev.proto),
                ev.netns,
            ))
        }));
        if story.total == 0 {
            story.rcvbuf = ev.rcvbuf_after;
            story.sndbuf = ev.sndbuf_after;
        }
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        story.push(CallRec {
            at,
            option,
            requested: ev.requested,
            applied: ev.applied,
            effective,
            ret: ev.ret,
            clamped,
            locks_before: ev.locks_before,
            locks_after: ev.locks_after,
            state: ev.state,
            flags: ev.flags,
        });
        // Both sizes as the kernel left them (the other direction's is unchanged by a call).
        if ev.ret == 0 {
            story.rcvbuf = ev.rcvbuf_after;
            story.sndbuf = ev.sndbuf_after;
        }
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
            let procfs = cx.attr.procfs().clone();
            self.note(&ev, option, clamped, p, &procfs);
        }
    }

    /// Reads locked TCP sockets through sock_diag (every [`DIAG_EVERY`]).
    fn poll(&mut self, cx: &mut PollCx<'_>) -> bool {
        story::refresh_tcp(
            &mut self.diag,
            &mut self.diag_at,
            &mut self.stories,
            cx.attr.procfs(),
            std::time::Instant::now(),
        )
    }

    fn gc(&mut self, cx: &mut GcCx<'_>) -> usize {
        self.stories.retain(|ino, _| cx.live.contains(ino));
        let namespaces: foldhash::HashSet<u32> = self.stories.values().map(|s| s.netns).collect();
        self.ns_limits.retain(|ns, _| namespaces.contains(ns));
        self.ns_tried.retain(|ns, _| namespaces.contains(ns));
        0
    }

    fn referenced(&self, out: &mut foldhash::HashSet<ProcRef>) {
        out.extend(self.stories.values().map(|s| s.owner));
    }

    fn advise(&self, _cx: &AdviceCx<'_>, inputs: &mut Inputs) {
        inputs.stories.extend(self.stories.values().cloned());
        inputs
            .ns_limits
            .extend(self.ns_limits.iter().map(|(k, v)| (*k, *v)));
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
const FAMILIES: &[&str] = &[
    CALLS.name,
    CLAMPED.name,
    FAILED.name,
    LOCKS.name,
    SND_LOCKS.name,
];

const LOCKS: Spec = Spec::counter(
    "bufscope_rcvbuf_locks_total",
    "Sockets that got SOCK_RCVBUF_LOCK (receive autotuning off), by setsockopt or inherited from a locked listener.",
    &["proto"],
);
const SND_LOCKS: Spec = Spec::counter(
    "bufscope_sndbuf_locks_total",
    "Sockets that got SOCK_SNDBUF_LOCK (send autotuning off) by setsockopt(SO_SNDBUF/SO_SNDBUFFORCE).",
    &["proto"],
);

/// The setsockopt families. A clamp or a failure is shown once it happened, not as a zero
/// series next to every call (a receiver that sizes its buffer once would otherwise have two
/// series that never move: the series budget); the shipped alerts catch a series born
/// non-zero (`x > 0 unless x offset 15m`).
fn families(procs: &[Row], out: &mut Vec<MetricFamily>) {
    type Pick = fn(&SockoptCounts) -> u64;
    let counts: [(&Spec, Pick, bool); 3] = [
        (&CALLS, |c| c.calls, true),
        (&CLAMPED, |c| c.clamped, false),
        (&FAILED, |c| c.failed, false),
    ];
    for (spec, pick, zero) in counts {
        spec.per_process(procs, out, |s, emit| {
            for ((proto, opt), c) in &s.parts.setsockopt.calls {
                let v = pick(c);
                if zero || v > 0 {
                    emit(&[proto.as_str(), opt.as_str()], v as f64);
                }
            }
        });
    }
    LOCKS.per_process(procs, out, |s, emit| {
        for (proto, v) in &s.parts.setsockopt.rcvbuf_locks {
            emit(&[proto.as_str()], *v as f64);
        }
    });
    SND_LOCKS.per_process(procs, out, |s, emit| {
        for (proto, v) in &s.parts.setsockopt.sndbuf_locks {
            emit(&[proto.as_str()], *v as f64);
        }
    });
}

#[cfg(test)]
mod tests;
