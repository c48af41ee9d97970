//! The guard: the buffer policy applied in the kernel (`--guard.mode observe|enforce`).
//!
//! Probe: the guard's decisions are taken in two places. Buffer `setsockopt` calls are decided
//! inside the setsockopt room's `cgroup/setsockopt` program (one program observes and acts):
//! on TCP, `SO_RCVBUF`/`SO_SNDBUF` (and `*FORCE`, and a locking `SO_BUF_LOCK`) that would lock
//! a buffer below what autotuning reaches in the socket's network namespace are skipped so
//! autotuning stays on (`tcp-autotune`, `skipped`), larger ones are left to the kernel
//! (`honoured`); on UDP, requests below the floor are rewritten to it (`udp-floor`). UDP
//! sockets that never ask are raised by `cgroup/{bind,connect,sendmsg}{4,6}` (this room's
//! probe) with `bpf_setsockopt`, the receive side within `--guard.udp-budget` (grants given
//! back by `cgroup/sock_release`). Every decision is a [`GuardEvent`]; this room counts them
//! per process as `bufscope_guard_decisions_total{rule,action}`, exports the budget, and
//! tells advice which processes the guard is fixing.
//!
//! The rules come from `bufscope-policy` (the same source as the tunnel and the advice):
//! TCP on Linux is left to autotuning ([`policy::Rule::TcpAutotune`]); UDP gets
//! [`policy::UDP_DEFAULT_BUFFER`] unless `--guard.udp-floor` says otherwise.

mod probe;
mod settings;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use anyhow::Context as _;
use aya::Ebpf;
use bufscope_common::{GuardConfig, GuardEvent, event_kind, guard as g, maps};
use prometheus::proto::MetricFamily;

pub use settings::{
    DEFAULT_UDP_BUDGET, Flags, GuardMode, Settings, TimeOffsets, bpf_config, generation,
    policy_tcp_autotune, policy_udp_floor,
};
use settings::{Setup, raise_sysctls, require_enforce, resolve};

use super::{
    AdviceCx, Attached, BuildCx, Part, PollCx, Room, Row, Services, Signal, ValidateCx, decode,
    setsockopt,
};
use crate::advice::{GuardAct, Inputs};
use crate::bpf::table::{PerCpuSlots, PerCpuTable, Slots};
use crate::bpf::{LoadPlan, ProbeSpec, Purpose, Table};
use crate::exposition::Spec;
use crate::labels::Proto;
use crate::store::Who;
use crate::values::Invalid;
pub use probe::PROBE;
use probe::passed_over;

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
    /// A TCP request at or above autotuning's ceiling, left to the kernel.
    Honoured,
    /// A UDP receive raise the budget had no room for.
    OverBudget,
}

impl Action {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Skipped => "skipped",
            Self::Raised => "raised",
            Self::Observed => "observed",
            Self::Honoured => "honoured",
            Self::OverBudget => "over_budget",
        }
    }

    fn from_bpf(a: u8) -> Option<Self> {
        match a {
            g::ACTION_SKIPPED => Some(Self::Skipped),
            g::ACTION_RAISED => Some(Self::Raised),
            g::ACTION_OBSERVED => Some(Self::Observed),
            g::ACTION_HONOURED => Some(Self::Honoured),
            g::ACTION_OVER_BUDGET => Some(Self::OverBudget),
            _ => None,
        }
    }
}

/// What this signal adds to a process.
#[derive(Clone, Debug, Default)]
pub struct ProcGuard {
    /// Decisions by (rule, action).
    pub decisions: BTreeMap<(Rule, Action), u64>,
    /// Receive bytes the budget did not grant its sockets.
    pub left_out_bytes: u64,
}

impl Part for ProcGuard {
    fn absorb(&mut self, o: &Self) {
        for (k, v) in &o.decisions {
            *self.decisions.entry(*k).or_default() += v;
        }
        self.left_out_bytes += o.left_out_bytes;
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
    /// `GUARD_STATS`: decisions acted on but not reported (ring buffer full), sockets the
    /// budget left out and their bytes, per CPU.
    stats: PerCpuTable<u32, u64>,
    /// `GUARD_STATE`: the granted bytes (read), `rmem_max`/`wmem_max` (kept current).
    state: Box<dyn Table<u32, u64>>,
    /// The ceilings last written into `GUARD_STATE`.
    limits: (u64, u64),
    /// `GUARD_LEASE` of a persisted guard, renewed on every poll.
    lease: Option<(Box<dyn Table<u32, u64>>, std::time::Duration)>,
    /// This process's time-namespace offsets (the lease is in the kernel's clock).
    clock: TimeOffsets,
}

/// `CLOCK_MONOTONIC` in ns as the kernel reads it (`bpf_ktime_get_ns`): this process's, less
/// its time namespace's offset.
fn kernel_monotonic_ns(clock: TimeOffsets) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let ns = ts.tv_sec * 1_000_000_000 + ts.tv_nsec;
    ns.saturating_sub(clock.monotonic_ns).max(0) as u64
}

/// A persisted guard's deadline: `lease` from now, in the kernel's clock.
fn deadline(lease: std::time::Duration, clock: TimeOffsets) -> u64 {
    kernel_monotonic_ns(clock).saturating_add(lease.as_nanos() as u64)
}

/// Sets a persisted guard's lease (`GUARD_LEASE`) to `lease` from now.
fn renew(
    map: &mut dyn Table<u32, u64>,
    lease: std::time::Duration,
    clock: TimeOffsets,
) -> anyhow::Result<()> {
    map.insert(0, deadline(lease, clock))
        .context("renewing the guard's lease (GUARD_LEASE)")
}

/// `net.core.rmem_max`/`wmem_max` of `limits` (0: unreadable, which makes the TCP rule skip
/// rather than honour).
fn ceilings(l: &crate::kernel::BufferLimits) -> (u64, u64) {
    let v = |x: Option<i64>| x.map_or(0, |v| v.max(0) as u64);
    (v(l.rmem_max), v(l.wmem_max))
}

/// Writes the ceilings into `GUARD_STATE` (the other slot, the granted bytes, is the
/// programs').
fn write_ceilings(map: &mut dyn Table<u32, u64>, (rmem, wmem): (u64, u64)) -> anyhow::Result<()> {
    map.insert(g::STATE_RMEM_MAX, rmem)
        .and_then(|()| map.insert(g::STATE_WMEM_MAX, wmem))
        .context("writing rmem_max/wmem_max into GUARD_STATE")
}

impl Guard {
    /// The room over its maps (taken from the object, or fakes in tests).
    fn new(
        settings: Settings,
        stats: PerCpuTable<u32, u64>,
        state: Box<dyn Table<u32, u64>>,
        lease: Option<Box<dyn Table<u32, u64>>>,
        limits: (u64, u64),
        clock: TimeOffsets,
    ) -> Self {
        Self {
            lease: lease.zip(settings.lease),
            settings,
            stats,
            state,
            limits,
            clock,
        }
    }

    /// `GUARD_STATS[idx]` summed over CPUs (0 when unreadable).
    fn stat(&self, idx: u32) -> u64 {
        self.stats.get(&idx).map_or(0, |v| v.iter().sum())
    }

    /// The receive bytes granted to live sockets.
    fn granted(&self) -> u64 {
        self.state.get(&g::STATE_GRANTED).unwrap_or(0)
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
            // Every program attaches (the variant with all of them) as `enforce` would load
            // it — both rules on, so the verifier sees every path and the socket-option and
            // socket-storage helpers a kernel may refuse a program type — with a scope nothing
            // is in (only the comms of an empty list): it acts on nothing.
            let config = GuardConfig {
                mode: g::MODE_ENFORCE,
                rules: g::RULE_UDP_FLOOR | g::RULE_TCP_AUTOTUNE,
                udp_rcv_floor: 1,
                udp_snd_floor: 1,
                comm_mode: g::COMM_ONLY,
                generation: 1,
                udp_budget: 1,
                ..Default::default()
            };
            plan.global("GUARD", &config);
            return Ok(Setup(None));
        }
        // The one step that writes to the node, before the ceilings are read.
        raise_sysctls(flags)?;
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
        for (i, why) in passed_over(on.settings.enforce, flags.udp_unbound_senders) {
            plan.pass_over(PROBE.name, i, why);
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
        // The ceilings the TCP rule compares with, before any program decides.
        if setup.0.is_some() {
            let mut map: aya::maps::Array<_, u64> = aya::maps::Array::try_from(
                ebpf.map_mut("GUARD_STATE")
                    .context("map GUARD_STATE missing from the BPF object")?,
            )?;
            let (rmem, wmem) = ceilings(&crate::kernel::BufferLimits::read());
            map.set(g::STATE_RMEM_MAX, rmem, 0)
                .and_then(|()| map.set(g::STATE_WMEM_MAX, wmem, 0))
                .context("writing rmem_max/wmem_max into GUARD_STATE")?;
        }
        // A persisted guard acts only while its lease lies ahead: set it before it attaches.
        if let Some(lease) = setup.0.as_ref().and_then(|on| on.settings.lease) {
            let mut map: aya::maps::Array<_, u64> = aya::maps::Array::try_from(
                ebpf.map_mut("GUARD_LEASE")
                    .context("map GUARD_LEASE missing from the BPF object")?,
            )?;
            map.set(0, deadline(lease, TimeOffsets::read()), 0)
                .context("setting the guard's lease (GUARD_LEASE)")?;
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
            Some(on) if env.attached(PROBE.name) => {
                let lease = match on.settings.lease {
                    Some(_) => Some(Slots::take(ebpf, maps::GUARD_LEASE)?),
                    None => None,
                };
                Some(Box::new(Self::new(
                    on.settings,
                    PerCpuSlots::take(ebpf, maps::GUARD_STATS)?,
                    Slots::take(ebpf, maps::GUARD_STATE)?,
                    lease,
                    ceilings(&crate::kernel::BufferLimits::read()),
                    TimeOffsets::read(),
                )))
            }
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
        let mut f = GRANTED.family();
        f.push(&[], self.granted() as f64);
        f.done(out);
        let mut f = BUDGET.family();
        f.push(&[], self.settings.udp_budget as f64);
        f.done(out);
        let mut f = LEFT_OUT.family();
        f.push(&[], self.stat(g::STAT_LEFT_OUT) as f64);
        f.done(out);
        let mut f = LEFT_OUT_BYTES.family();
        f.push(&[], self.stat(g::STAT_LEFT_OUT_BYTES) as f64);
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
                &self.settings.generation.to_string(),
            ],
            1.0,
        );
        f.done(out);
    }

    /// Renews a persisted guard's lease; keeps the ceilings the TCP rule compares with current.
    fn poll(&mut self, cx: &mut PollCx<'_>) -> bool {
        if let Some((map, lease)) = &mut self.lease
            && let Err(e) = renew(map.as_mut(), *lease, self.clock)
        {
            tracing::warn!(error = %e, "guard: could not renew the lease; it fails open when it runs out");
        }
        let now = ceilings(&cx.limits);
        if now != self.limits {
            match write_ceilings(self.state.as_mut(), now) {
                Ok(()) => {
                    tracing::info!(
                        rmem_max = now.0,
                        wmem_max = now.1,
                        "guard: net.core.rmem_max/wmem_max changed; TCP requests are judged by the new values"
                    );
                    self.limits = now;
                }
                Err(e) => tracing::warn!(error = %e, "guard: could not update the ceilings"),
            }
        }
        false
    }

    fn map_counters(&self) -> &'static [&'static str] {
        &[UNREPORTED.name, LEFT_OUT.name, LEFT_OUT_BYTES.name]
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
        if action == Action::OverBudget {
            s.parts.guard.left_out_bytes += ev.applied.max(0) as u64;
        }
    }

    fn advise(&self, cx: &AdviceCx<'_>, inputs: &mut Inputs) {
        for (p, s) in cx.store.procs() {
            let part = &s.parts.guard;
            for ((rule, action), n) in &part.decisions {
                // A request left to the kernel is nothing the guard fixes.
                if *action == Action::Honoured {
                    continue;
                }
                let over = *action == Action::OverBudget;
                inputs.guard.push(GuardAct {
                    owner: *p,
                    rule: rule.as_str(),
                    enforced: *action != Action::Observed,
                    decisions: if over { 0 } else { *n },
                    floor: self.settings.applied_floor.0,
                    floor_capped: self.settings.applied_floor.0 < self.settings.udp_floor,
                    left_out: if over { *n } else { 0 },
                    left_out_bytes: if over { part.left_out_bytes } else { 0 },
                    budget: self.settings.udp_budget,
                });
            }
        }
    }
}

const DECISIONS: Spec = Spec::counter(
    "bufscope_guard_decisions_total",
    "Decisions of the guard (--guard.mode), one per socket and rule: TCP buffer requests that would lock less than autotuning reaches skipped (rule tcp-autotune, action skipped), larger ones left to the kernel (honoured); UDP buffers raised to the floor (udp-floor, raised) or left at the kernel's size because --guard.udp-budget is spent (over_budget); observed = what enforce would have done.",
    &["rule", "action"],
);
const GRANTED: Spec = Spec::gauge(
    "bufscope_guard_udp_granted_bytes",
    "Receive buffer the guard's UDP floor has granted to live sockets (bytes as the kernel counts them: twice the SO_RCVBUF value), given back when a socket closes or sizes itself; at most bufscope_guard_udp_budget_bytes.",
    &[],
);
const BUDGET: Spec = Spec::gauge(
    "bufscope_guard_udp_budget_bytes",
    "--guard.udp-budget: the most receive buffer the guard grants to live UDP sockets together.",
    &[],
);
const LEFT_OUT: Spec = Spec::counter(
    "bufscope_guard_udp_left_out_total",
    "UDP sockets below the floor the guard did not raise because --guard.udp-budget had no room: they keep the kernel's receive buffer.",
    &[],
);
const LEFT_OUT_BYTES: Spec = Spec::counter(
    "bufscope_guard_udp_left_out_bytes_total",
    "Receive buffer (bytes, as the kernel counts them) those sockets would have been granted.",
    &[],
);
const UNREPORTED: Spec = Spec::counter(
    "bufscope_guard_unreported_total",
    "Guard decisions taken and acted on in the kernel that could not be reported (the event ring buffer was full, e.g. while bufscope was stopped): not in bufscope_guard_decisions_total.",
    &[],
);
const SCOPE: Spec = Spec::gauge(
    "bufscope_guard_scope_info",
    "The guard's scope (1 while it is on): mode, the cgroup whose processes it acts for (the cgroup2 root: the whole node), comm_mode all/only/except with comms, lease_seconds of a persisted guard (empty: it stops with bufscope), and the policy generation its per-socket marks carry (a socket marked under another is decided again).",
    &[
        "mode",
        "cgroup",
        "comm_mode",
        "comms",
        "lease_seconds",
        "generation",
    ],
);
