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

use std::collections::BTreeMap;

use bufscope_common::{GuardConfig, GuardEvent, event_kind, guard as g};
use bufscope_policy as policy;
use prometheus::proto::MetricFamily;

use super::{AdviceCx, BuildEnv, Cx, Signal, decode};
use crate::advice::{GuardAct, Inputs};
use crate::metrics::per_process;
use crate::probes::{Hook, ProbeSpec};
use crate::store::{ProcStats, Proto, Who};

/// The probe (only the bind/connect/sendmsg part: the setsockopt decisions ride on the
/// setsockopt room's `cgroup/setsockopt`).
pub const PROBE: ProbeSpec = ProbeSpec {
    name: "guard",
    what: "applies the buffer policy in the kernel: TCP buffer requests skipped (autotuning stays on), UDP buffers raised to the floor",
    variants: &[&[
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
    ]],
    is_drop_probe: false,
};

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

impl ProcGuard {
    /// Adds `o` (a folded process) to `self`.
    pub fn absorb(&mut self, o: &Self) {
        for (k, v) in &o.decisions {
            *self.decisions.entry(*k).or_default() += v;
        }
    }

    /// Whether anything was counted.
    pub fn has_counts(&self) -> bool {
        !self.decisions.is_empty()
    }

    /// Status-page columns.
    pub fn status(&self, row: &mut bufscope_api::ProcessRow) {
        row.guard = self
            .decisions
            .iter()
            .map(|((rule, action), v)| (format!("{}/{}", rule.as_str(), action.as_str()), *v))
            .collect();
    }
}

/// The guard's settings, resolved from flags and the policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// observe or enforce (the room is not built when off).
    pub enforce: bool,
    /// The floor requested for UDP receive buffers (before the kernel doubles it).
    pub udp_floor: i64,
    /// The floor actually applied (capped at `rmem_max`/`wmem_max`): (receive, send).
    pub applied_floor: (i64, i64),
}

/// The policy's UDP floor: [`policy::UDP_DEFAULT_BUFFER`] (its plan for UDP on Linux without
/// a known path).
pub fn policy_udp_floor() -> i64 {
    match policy::plan(policy::Transport::Udp, policy::Platform::Linux, None).buffers {
        policy::Buffers::Set { receive, .. } => receive as i64,
        policy::Buffers::LeaveAlone => policy::UDP_DEFAULT_BUFFER as i64,
    }
}

/// Whether the policy leaves TCP to autotuning on Linux (the `tcp-autotune` rule is on).
pub fn policy_tcp_autotune() -> bool {
    matches!(
        policy::plan(policy::Transport::Tcp, policy::Platform::Linux, None).buffers,
        policy::Buffers::LeaveAlone
    )
}

/// `GUARD` for the BPF side: the floors capped at the ceilings `bpf_setsockopt` and
/// `SO_RCVBUF` are clamped to anyway (so the decision says what the socket really gets).
pub fn bpf_config(
    enforce: bool,
    udp_floor: i64,
    rmem_max: Option<i64>,
    wmem_max: Option<i64>,
    cgroup: Option<(u64, u32)>,
    comm_mode: u32,
) -> GuardConfig {
    let cap = |max: Option<i64>| {
        udp_floor
            .min(max.unwrap_or(udp_floor))
            .clamp(0, i32::MAX as i64) as i32
    };
    let mut rules = g::RULE_UDP_FLOOR;
    if policy_tcp_autotune() {
        rules |= g::RULE_TCP_AUTOTUNE;
    }
    GuardConfig {
        mode: if enforce {
            g::MODE_ENFORCE
        } else {
            g::MODE_OBSERVE
        },
        rules,
        udp_rcv_floor: cap(rmem_max),
        udp_snd_floor: cap(wmem_max),
        cgroup_id: cgroup.map_or(0, |c| c.0),
        cgroup_level: cgroup.map_or(0, |c| c.1),
        comm_mode,
        tcp_rmem_ceiling: rmem_max
            .unwrap_or(i32::MAX as i64)
            .clamp(0, i32::MAX as i64) as i32,
        tcp_wmem_ceiling: wmem_max
            .unwrap_or(i32::MAX as i64)
            .clamp(0, i32::MAX as i64) as i32,
        self_tgid: std::process::id(),
        _pad: 0,
    }
}

/// Resolves `--guard.*` into what the loader patches and attaches (mode off: nothing) and the
/// room's settings. Raises `rmem_max`/`wmem_max` first with `--guard.raise-sysctl`.
pub fn setup(
    a: &crate::cli::GuardArgs,
) -> anyhow::Result<(crate::probes::GuardSetup, Option<Settings>)> {
    use crate::cli::GuardMode;
    use anyhow::Context as _;
    if a.mode == GuardMode::Off {
        return Ok((crate::probes::GuardSetup::default(), None));
    }
    let root = crate::kernel::cgroup2_root().context(
        "the guard needs a cgroup2 hierarchy and none is mounted (see /proc/self/mountinfo)",
    )?;
    let cgroup = match &a.cgroup {
        None => None,
        Some(p) => {
            let p = std::fs::canonicalize(p)
                .with_context(|| format!("--guard.cgroup {}", p.display()))?;
            let rel = p.strip_prefix(&root).map_err(|_| {
                anyhow::anyhow!(
                    "--guard.cgroup {} is not under the cgroup2 mount {}",
                    p.display(),
                    root.display()
                )
            })?;
            let level = rel.components().count() as u32;
            let id = std::os::unix::fs::MetadataExt::ino(
                &std::fs::metadata(&p)
                    .with_context(|| format!("--guard.cgroup {}", p.display()))?,
            );
            (level > 0).then_some((p, id, level))
        }
    };
    let floor = a
        .udp_floor
        .map_or_else(policy_udp_floor, |f| f.min(i32::MAX as u64) as i64);
    if a.raise_sysctl {
        for name in ["net/core/rmem_max", "net/core/wmem_max"] {
            raise_sysctl(name, floor)?;
        }
    }
    let limits = crate::kernel::BufferLimits::read();
    let (comm_mode, names) = if !a.comm.is_empty() {
        (g::COMM_ONLY, &a.comm)
    } else {
        (g::COMM_EXCEPT, &a.exclude_comm)
    };
    let comm_mode = if names.is_empty() {
        g::COMM_ALL
    } else {
        comm_mode
    };
    let comms = names
        .iter()
        .map(|n| {
            let mut c = [0u8; 16];
            c[..n.len().min(15)].copy_from_slice(&n.as_bytes()[..n.len().min(15)]);
            c
        })
        .collect();
    let enforce = a.mode == GuardMode::Enforce;
    let config = bpf_config(
        enforce,
        floor,
        limits.rmem_max,
        limits.wmem_max,
        cgroup.as_ref().map(|(_, id, level)| (*id, *level)),
        comm_mode,
    );
    let applied = (config.udp_rcv_floor as i64, config.udp_snd_floor as i64);
    if applied.0 < floor {
        tracing::warn!(
            floor,
            rmem_max = limits.rmem_max,
            "guard: the UDP floor is capped at net.core.rmem_max ({applied:?} applied): raise it \
             (sysctl -w net.core.rmem_max={floor}) or run with --guard.raise-sysctl"
        );
    }
    tracing::info!(
        mode = if enforce { "enforce" } else { "observe" },
        udp_floor = floor,
        applied_rcv = applied.0,
        applied_snd = applied.1,
        cgroup = %cgroup.as_ref().map_or(root.display().to_string(), |(p, _, _)| p.display().to_string()),
        comm = ?names,
        "guard on"
    );
    Ok((
        crate::probes::GuardSetup {
            config,
            comms,
            cgroup: cgroup.map(|(p, _, _)| p),
            persist: a.persist,
        },
        Some(Settings {
            enforce,
            udp_floor: floor,
            applied_floor: applied,
        }),
    ))
}

/// Raises sysctl `name` to `to` (never lowers it); logs what it did.
fn raise_sysctl(name: &str, to: i64) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let now = crate::kernel::sysctl_i64(name).unwrap_or(0);
    if now >= to {
        return Ok(());
    }
    let path = std::path::Path::new("/proc/sys").join(name);
    std::fs::write(&path, to.to_string()).with_context(|| {
        format!(
            "--guard.raise-sysctl: writing {} (needs CAP_NET_ADMIN in the host network namespace)",
            path.display()
        )
    })?;
    tracing::warn!(
        sysctl = name,
        from = now,
        to,
        "guard: raised a host-wide sysctl (--guard.raise-sysctl); it stays raised after bufscope exits"
    );
    Ok(())
}

/// Refuses `enforce` when the guard cannot act (fails open otherwise would be silent).
pub fn require_enforce(status: &[crate::probes::ProbeStatus]) -> anyhow::Result<()> {
    let find = |n: &str| status.iter().find(|s| s.spec.name == n);
    let cap = if crate::kernel::caps::has(crate::kernel::caps::CAP_NET_ADMIN) {
        ""
    } else {
        " (CAP_NET_ADMIN is missing: loading cgroup socket programs needs it)"
    };
    match find(PROBE.name) {
        Some(s) if s.attached => {}
        s => anyhow::bail!(
            "--guard.mode enforce: the guard's hooks cannot attach{cap}: {}",
            s.and_then(|s| s.error.clone())
                .unwrap_or_else(|| "not attached".into())
        ),
    }
    match find(super::setsockopt::PROBE.name) {
        Some(s) if s.uses("cgroup/setsockopt") => Ok(()),
        s => anyhow::bail!(
            "--guard.mode enforce needs the setsockopt probe on cgroup/setsockopt{cap}: {}",
            s.and_then(|s| s.error.clone())
                .unwrap_or_else(|| "it is disabled".into())
        ),
    }
}

/// The guard room.
pub struct Guard {
    settings: Settings,
}

impl Guard {
    /// The room, when the guard is on and its probe attached.
    pub fn take(env: &BuildEnv<'_>) -> Option<Self> {
        let settings = env.guard.clone()?;
        env.attached(PROBE.name).then_some(Self { settings })
    }
}

impl Signal for Guard {
    fn name(&self) -> &'static str {
        PROBE.name
    }

    fn event_kinds(&self) -> &'static [u32] {
        &[event_kind::GUARD]
    }

    fn on_event(&mut self, _kind: u32, bytes: &[u8], cx: &mut Cx<'_>) {
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
        *s.guard.decisions.entry((rule, action)).or_default() += 1;
    }

    fn advise(&self, cx: &AdviceCx<'_>, inputs: &mut Inputs) {
        for (p, s) in cx.store.procs() {
            for ((rule, action), n) in &s.guard.decisions {
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

/// The guard family.
pub fn families(procs: &[(String, &ProcStats)], out: &mut Vec<MetricFamily>) {
    per_process(
        "bufscope_guard_decisions_total",
        "Decisions of the guard (--guard.mode): TCP buffer requests skipped so autotuning stays on (rule tcp-autotune), UDP buffers raised to the floor (udp-floor); action observed = what enforce would have done.",
        procs,
        out,
        |s, emit| {
            for ((rule, action), v) in &s.guard.decisions {
                emit(
                    &[("rule", rule.as_str()), ("action", action.as_str())],
                    *v as f64,
                );
            }
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_come_from_the_policy() {
        assert_eq!(policy_udp_floor(), 7 << 20);
        assert!(policy_tcp_autotune());
        let c = bpf_config(
            true,
            7 << 20,
            Some(4 << 20),
            Some(8 << 20),
            None,
            g::COMM_ALL,
        );
        assert_eq!(c.mode, g::MODE_ENFORCE);
        assert_eq!(c.rules, g::RULE_UDP_FLOOR | g::RULE_TCP_AUTOTUNE);
        assert_eq!(c.udp_rcv_floor, 4 << 20, "capped at rmem_max");
        assert_eq!(c.udp_snd_floor, 7 << 20, "wmem_max is above the floor");
        let o = bpf_config(false, 1 << 20, None, None, Some((42, 2)), g::COMM_ONLY);
        assert_eq!(
            (o.mode, o.cgroup_id, o.cgroup_level),
            (g::MODE_OBSERVE, 42, 2)
        );
        assert_eq!(
            o.udp_rcv_floor,
            1 << 20,
            "unknown ceilings: the floor as asked"
        );
    }
}
