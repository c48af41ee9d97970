//! The guard: the buffer policy applied in the kernel (`--guard.mode observe|enforce`).
//!
//! Probe: the guard's decisions are taken in two places. Buffer `setsockopt` calls are decided
//! inside the setsockopt room's `cgroup/setsockopt` program (one program observes and acts):
//! on TCP, `SO_RCVBUF`/`SO_SNDBUF` (and `*FORCE`, and a locking `SO_BUF_LOCK`) are skipped so
//! autotuning stays on (`tcp-autotune`); on UDP, requests below the floor are rewritten to it
//! (`udp-floor`). UDP sockets that never ask are raised by `cgroup/{bind,connect,sendmsg}{4,6}`
//! (this room's probe) with `bpf_setsockopt`. Every decision is a [`GuardEvent`]; this room
//! counts them per process as `bufscope_guard_decisions_total{rule,action}` and tells advice
//! which processes the guard is fixing.
//!
//! The rules come from `bufscope-policy` (the same source as the tunnel and the advice):
//! TCP on Linux is left to autotuning ([`policy::Rule::TcpAutotune`]); UDP gets
//! [`policy::UDP_DEFAULT_BUFFER`] unless `--guard.udp-floor` says otherwise.

mod settings;

use std::collections::BTreeMap;

use anyhow::Context as _;
use aya::Ebpf;
use bufscope_common::{GuardConfig, GuardEvent, event_kind, guard as g};
use prometheus::proto::MetricFamily;

pub use settings::{Flags, GuardMode, Settings, bpf_config, policy_tcp_autotune, policy_udp_floor};
use settings::{Setup, require_enforce, resolve};

use super::{
    AdviceCx, Attached, BuildCx, Part, PollCx, Room, Row, Services, Signal, ValidateCx, decode,
    setsockopt, take_map,
};
use crate::advice::{GuardAct, Inputs};
use crate::bpf::{Hook, LoadPlan, ProbeSpec, Purpose};
use crate::exposition::Spec;
use crate::labels::Proto;
use crate::store::Who;
use crate::values::Invalid;

/// The probe (the setsockopt decisions ride on the setsockopt room's `cgroup/setsockopt`).
/// UDP sockets that never ask are decided at their first bind or connect, one storage lookup
/// per later call; nothing runs per send. Sockets that send before any bind or connect (bound
/// by the kernel at their first `sendto`) are raised only with `--guard.udp-unbound-senders`,
/// the second variant: `cgroup/sendmsg{4,6}` then run on every unconnected UDP send on the
/// node, and the kernel takes the socket lock around them (measured 0.92 of the guard-off
/// `sendto` rate on 6.18). Raising sockets at creation instead would need `bpf_setsockopt` in
/// `cgroup/sock_create`, which neither 6.1 nor 6.18 gives that program type.
pub const PROBE: ProbeSpec = ProbeSpec {
    name: "guard",
    what: "applies the buffer policy in the kernel: TCP buffer requests skipped (autotuning stays on), UDP buffers raised to the floor",
    variants: &[BIND_CONNECT, WITH_SENDMSG],
    is_drop_probe: false,
    attributed: false,
};

/// `--guard.udp-unbound-senders`: also at the first unconnected send of a socket never bound.
const WITH_SENDMSG: &[Hook] = &[
    Hook::CgroupGetsockopt {
        prog: "guard_getsockopt",
    },
    Hook::CgroupSockAddr {
        prog: "guard_bind4",
        attach: "bind4",
    },
    Hook::CgroupSockAddr {
        prog: "guard_bind6",
        attach: "bind6",
    },
    Hook::CgroupSockAddr {
        prog: "guard_connect4",
        attach: "connect4",
    },
    Hook::CgroupSockAddr {
        prog: "guard_connect6",
        attach: "connect6",
    },
    Hook::CgroupSockAddr {
        prog: "guard_sendmsg4",
        attach: "sendmsg4",
    },
    Hook::CgroupSockAddr {
        prog: "guard_sendmsg6",
        attach: "sendmsg6",
    },
];

/// The default variant: UDP sockets decided at their first bind or connect (the hooks of
/// [`WITH_SENDMSG`] but the last two).
const BIND_CONNECT: &[Hook] = WITH_SENDMSG.split_at(WITH_SENDMSG.len() - 2).0;

/// A guard rule, as the `rule` label says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rule {
    /// TCP buffer requests skipped.
    TcpAutotune,
    /// UDP buffers raised to the floor.
    UdpFloor,
}

impl Rule {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TcpAutotune => "tcp-autotune",
            Self::UdpFloor => "udp-floor",
        }
    }

    fn from_bpf(r: u8) -> Option<Self> {
        match r as u32 {
            g::RULE_TCP_AUTOTUNE => Some(Self::TcpAutotune),
            g::RULE_UDP_FLOOR => Some(Self::UdpFloor),
            _ => None,
        }
    }
}

/// A guard action, as the `action` label says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    /// The call was skipped.
    Skipped,
    /// A buffer was raised.
    Raised,
    /// Observe mode: would have acted.
    Observed,
}

impl Action {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Skipped => "skipped",
            Self::Raised => "raised",
            Self::Observed => "observed",
        }
    }

    fn from_bpf(a: u8) -> Option<Self> {
        match a {
            g::ACTION_SKIPPED => Some(Self::Skipped),
            g::ACTION_RAISED => Some(Self::Raised),
            g::ACTION_OBSERVED => Some(Self::Observed),
            _ => None,
        }
    }
}

/// What this signal adds to a process.
#[derive(Clone, Debug, Default)]
pub struct ProcGuard {
    /// Decisions by (rule, action).
    pub decisions: BTreeMap<(Rule, Action), u64>,
}

impl Part for ProcGuard {
    fn absorb(&mut self, o: &Self) {
        for (k, v) in &o.decisions {
            *self.decisions.entry(*k).or_default() += v;
        }
    }

    fn has_counts(&self) -> bool {
        !self.decisions.is_empty()
    }

    fn status(&self, row: &mut bufscope_api::ProcessRow) {
        row.guard = self
            .decisions
            .iter()
            .map(|((rule, action), v)| (format!("{}/{}", rule.as_str(), action.as_str()), *v))
            .collect();
    }

    /// Decisions come from events: kept across a restart (rule in the proto byte, action in
    /// the option byte).
    fn totals(&self, out: &mut Vec<crate::totals::Total>) {
        for ((rule, action), v) in &self.decisions {
            out.push(crate::totals::Total {
                family: bufscope_common::total_family::GUARD_DECISIONS,
                proto: *rule as u8,
                option: *action as u8,
                value: *v,
            });
        }
    }

    fn restore(&mut self, t: &crate::totals::Total) {
        if t.family != bufscope_common::total_family::GUARD_DECISIONS {
            return;
        }
        let rule = [Rule::TcpAutotune, Rule::UdpFloor]
            .into_iter()
            .find(|r| *r as u8 == t.proto);
        let action = [Action::Skipped, Action::Raised, Action::Observed]
            .into_iter()
            .find(|a| *a as u8 == t.option);
        if let (Some(rule), Some(action)) = (rule, action) {
            *self.decisions.entry((rule, action)).or_default() += t.value;
        }
    }
}

/// The guard room.
pub struct Guard {
    settings: Settings,
    /// `GUARD_STATS`: decisions acted on but not reported (ring buffer full), per CPU.
    stats: aya::maps::PerCpuArray<aya::maps::MapData, u64>,
    /// `GUARD_LEASE` of a persisted guard, renewed on every poll.
    lease: Option<(
        aya::maps::Array<aya::maps::MapData, u64>,
        std::time::Duration,
    )>,
}

/// `CLOCK_MONOTONIC` in ns: the clock of `bpf_ktime_get_ns`.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sets a persisted guard's lease to `lease` from now.
fn renew(
    map: &mut aya::maps::Array<impl std::borrow::BorrowMut<aya::maps::MapData>, u64>,
    lease: std::time::Duration,
) -> anyhow::Result<()> {
    let deadline = monotonic_ns().saturating_add(lease.as_nanos() as u64);
    map.set(0, deadline, 0)
        .context("renewing the guard's lease (GUARD_LEASE)")
}

impl Guard {
    /// `GUARD_STATS[idx]` summed over CPUs (0 when unreadable).
    fn stat(&self, idx: u32) -> u64 {
        self.stats.get(&idx, 0).map(|v| v.iter().sum()).unwrap_or(0)
    }
}

impl Room for Guard {
    const PROBE: ProbeSpec = PROBE;
    type Part = ProcGuard;
    type Flags = Flags;
    type Setup = Setup;

    fn validate(flags: &Flags, cx: &ValidateCx<'_>) -> Result<(), Invalid> {
        flags.validate(cx)
    }

    fn prepare(flags: &Flags, plan: &mut LoadPlan) -> anyhow::Result<Setup> {
        if plan.purpose == Purpose::Check {
            // Every hook attaches in observe mode (it changes nothing) with the UDP floor on
            // at 1 byte (no socket is below it), so the verifier sees the socket-option
            // helpers a kernel may refuse a program type and check names what run would use.
            let config = GuardConfig {
                mode: g::MODE_OBSERVE,
                rules: g::RULE_UDP_FLOOR,
                udp_rcv_floor: 1,
                udp_snd_floor: 1,
                ..Default::default()
            };
            plan.global("GUARD", &config);
            return Ok(Setup(None));
        }
        let Some((on, cgroup)) = resolve(flags)? else {
            plan.global("GUARD", &GuardConfig::default());
            plan.leave_off(PROBE.name, "off (--guard.mode off)");
            return Ok(Setup(None));
        };
        plan.global("GUARD", &on.config);
        if let Some(c) = cgroup {
            plan.cgroup(PROBE.name, c);
        }
        // The guard decides in the setsockopt probe's program: neither outlives bufscope
        // unless --guard.persist.
        if !flags.persist {
            plan.unpinned(PROBE.name);
            plan.unpinned(setsockopt::PROBE.name);
        }
        if flags.udp_unbound_senders {
            plan.pass_over(
                PROBE.name,
                0,
                "--guard.udp-unbound-senders needs cgroup/sendmsg{4,6}",
            );
        }
        // The comms are part of what the programs do (pinned programs are adopted only when
        // the same).
        plan.note(PROBE.name, format!("{:?}", on.comms));
        Ok(Setup(Some(on)))
    }

    /// Writes the scope's comms into `GUARD_COMMS` (exactly them: entries an earlier run
    /// pinned there are removed) before any guard program runs.
    fn before_attach(setup: &mut Setup, ebpf: &mut Ebpf) -> anyhow::Result<()> {
        let comms = setup.0.as_ref().map_or(&[][..], |on| on.comms.as_slice());
        let mut map: aya::maps::HashMap<_, [u8; 16], u8> = aya::maps::HashMap::try_from(
            ebpf.map_mut("GUARD_COMMS")
                .context("map GUARD_COMMS missing from the BPF object")?,
        )?;
        let stale: Vec<[u8; 16]> = map
            .keys()
            .filter_map(Result::ok)
            .filter(|k| !comms.contains(k))
            .collect();
        for k in &stale {
            map.remove(k).context("clearing GUARD_COMMS")?;
        }
        for c in comms {
            map.insert(c, 1, 0).context("filling GUARD_COMMS")?;
        }
        // A persisted guard acts only while its lease lies ahead: set it before it attaches.
        if let Some(lease) = setup.0.as_ref().and_then(|on| on.settings.lease) {
            let mut map: aya::maps::Array<_, u64> = aya::maps::Array::try_from(
                ebpf.map_mut("GUARD_LEASE")
                    .context("map GUARD_LEASE missing from the BPF object")?,
            )?;
            renew(&mut map, lease)?;
        }
        Ok(())
    }

    /// Refuses `enforce` when the guard cannot act.
    fn after_attach(setup: &mut Setup, _ebpf: &mut Ebpf, cx: &Attached<'_>) -> anyhow::Result<()> {
        match &setup.0 {
            Some(on) if on.settings.enforce => require_enforce(cx.status),
            _ => Ok(()),
        }
    }

    /// The room, when the guard is on and its probe attached.
    fn take(
        setup: Setup,
        ebpf: &mut Ebpf,
        env: &BuildCx<'_>,
        _services: &mut Services,
    ) -> anyhow::Result<Option<Box<dyn Signal>>> {
        Ok(match setup.0 {
            Some(on) if env.attached(PROBE.name) => Some(Box::new(Self {
                lease: match on.settings.lease {
                    Some(l) => Some((take_map(ebpf, "GUARD_LEASE")?, l)),
                    None => None,
                },
                settings: on.settings,
                stats: take_map(ebpf, "GUARD_STATS")?,
            })),
            _ => None,
        })
    }
}

impl Signal for Guard {
    fn name(&self) -> &'static str {
        PROBE.name
    }

    fn families(&self, procs: &[Row], out: &mut Vec<MetricFamily>) {
        DECISIONS.per_process(procs, out, |s, emit| {
            for ((rule, action), v) in &s.parts.guard.decisions {
                emit(&[rule.as_str(), action.as_str()], *v as f64);
            }
        });
        let mut f = UNREPORTED.family();
        f.push(&[], self.stat(g::STAT_UNREPORTED) as f64);
        f.done(out);
        let (cgroup, comm_mode, comms) = &self.settings.scope;
        let lease = self
            .settings
            .lease
            .map_or(String::new(), |l| l.as_secs().to_string());
        let mut f = SCOPE.family();
        f.push(
            &[
                if self.settings.enforce {
                    "enforce"
                } else {
                    "observe"
                },
                cgroup,
                comm_mode,
                comms,
                &lease,
            ],
            1.0,
        );
        f.done(out);
    }

    /// Renews a persisted guard's lease.
    fn poll(&mut self, _cx: &mut PollCx<'_>) -> bool {
        if let Some((map, lease)) = &mut self.lease
            && let Err(e) = renew(map, *lease)
        {
            tracing::warn!(error = %e, "guard: could not renew the lease; it fails open when it runs out");
        }
        false
    }

    fn map_counters(&self) -> &'static [&'static str] {
        &[UNREPORTED.name]
    }

    fn event_kinds(&self) -> &'static [u32] {
        &[event_kind::GUARD]
    }

    fn on_event(&mut self, _kind: u32, bytes: &[u8], cx: &mut PollCx<'_>) {
        let Some(ev) = decode::<GuardEvent>(bytes) else {
            return;
        };
        let (Some(rule), Some(action)) = (Rule::from_bpf(ev.rule), Action::from_bpf(ev.action))
        else {
            return;
        };
        let who = if ev.owner.tgid == 0 {
            Who::Unknown
        } else {
            Who::Proc(cx.attr.owner(&ev.owner))
        };
        tracing::debug!(
            pid = ev.owner.tgid,
            inode = ev.inode,
            rule = rule.as_str(),
            action = action.as_str(),
            requested = ev.requested,
            applied = ev.applied,
            proto = Proto::from_ip(ev.proto).as_str(),
            ret = ev.ret,
            "guard decision"
        );
        let attr = &*cx.attr;
        let s = cx.store.proc_mut(who, || match who {
            Who::Proc(p) => attr.meta(&p),
            Who::Unknown => Default::default(),
        });
        *s.parts.guard.decisions.entry((rule, action)).or_default() += 1;
    }

    fn advise(&self, cx: &AdviceCx<'_>, inputs: &mut Inputs) {
        for (p, s) in cx.store.procs() {
            for ((rule, action), n) in &s.parts.guard.decisions {
                inputs.guard.push(GuardAct {
                    owner: *p,
                    rule: rule.as_str(),
                    enforced: *action != Action::Observed,
                    decisions: *n,
                    floor: self.settings.applied_floor.0,
                    floor_capped: self.settings.applied_floor.0 < self.settings.udp_floor,
                });
            }
        }
    }
}

const DECISIONS: Spec = Spec::counter(
    "bufscope_guard_decisions_total",
    "Decisions of the guard (--guard.mode): TCP buffer requests skipped so autotuning stays on (rule tcp-autotune), UDP buffers raised to the floor (udp-floor); action observed = what enforce would have done.",
    &["rule", "action"],
);
const UNREPORTED: Spec = Spec::counter(
    "bufscope_guard_unreported_total",
    "Guard decisions taken and acted on in the kernel that could not be reported (the event ring buffer was full, e.g. while bufscope was stopped): not in bufscope_guard_decisions_total.",
    &[],
);
const SCOPE: Spec = Spec::gauge(
    "bufscope_guard_scope_info",
    "The guard's scope (1 while it is on): mode, the cgroup whose processes it acts for (the cgroup2 root: the whole node), comm_mode all/only/except with comms, and lease_seconds of a persisted guard (empty: it stops with bufscope).",
    &["mode", "cgroup", "comm_mode", "comms", "lease_seconds"],
);
