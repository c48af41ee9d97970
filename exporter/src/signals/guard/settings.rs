//! The guard's settings: its flags, what they resolve to (`GUARD` for the BPF side, the scope's
//! comms and cgroup, the floors capped at what the kernel will give), and the policy they come
//! from.

use std::path::PathBuf;

use anyhow::Context as _;
use bufscope_common::{GuardConfig, guard as g};
use bufscope_policy as policy;
use clap::ValueEnum;

use super::PROBE;
use crate::signals::{ValidateCx, setsockopt};
use crate::values::Invalid;

/// `--guard.mode`.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GuardMode {
    /// No guard.
    #[default]
    Off,
    /// Count what the guard would do; change nothing.
    Observe,
    /// Apply the buffer policy in the kernel.
    Enforce,
}

/// The guard: the buffer policy applied in the kernel, without touching the applications.
#[derive(clap::Args, Debug, Clone, Default)]
#[group(skip)]
pub struct Flags {
    /// off | observe (count what it would do) | enforce (TCP SO_RCVBUF/SO_SNDBUF skipped so
    /// autotuning stays on; UDP buffers raised to the floor).
    #[arg(long = "guard.mode", value_enum, default_value_t = GuardMode::Off)]
    pub mode: GuardMode,
    /// The cgroup (v2 directory) whose processes the guard acts for (default: the cgroup2
    /// root, i.e. every process).
    #[arg(long = "guard.cgroup", value_name = "PATH")]
    pub cgroup: Option<PathBuf>,
    /// Act only for processes with these names (comm).
    #[arg(long = "guard.comm", value_delimiter = ',', value_name = "NAME")]
    pub comm: Vec<String>,
    /// Never act for processes with these names (comm).
    #[arg(
        long = "guard.exclude-comm",
        value_delimiter = ',',
        value_name = "NAME"
    )]
    pub exclude_comm: Vec<String>,
    /// UDP buffer floor in bytes (the SO_RCVBUF/SO_SNDBUF value; the kernel doubles it).
    /// Default: the policy's (7 MiB); at most 2147483647 (`SO_RCVBUF` takes an `int`).
    #[arg(long = "guard.udp-floor", value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..=i32::MAX as u64))]
    pub udp_floor: Option<u64>,
    /// Also raise UDP sockets that send before any bind or connect (bound by the kernel at
    /// their first sendto). Attaches cgroup/sendmsg4/6, which run on every unconnected UDP
    /// send on the node with the socket locked: measured 0.92 of the guard-off sendto rate
    /// on 6.18. Without it, sockets are raised at bind or connect and sends pay nothing.
    #[arg(long = "guard.udp-unbound-senders")]
    pub udp_unbound_senders: bool,
    /// Raise net.core.rmem_max/wmem_max to the floor at start (host-wide; never lowered).
    #[arg(long = "guard.raise-sysctl")]
    pub raise_sysctl: bool,
    /// With --bpf.pin-path: keep the guard (and the setsockopt program it shares) attached
    /// while bufscope is not running. Without it the guard stops with bufscope.
    #[arg(long = "guard.persist")]
    pub persist: bool,
    /// With --guard.persist: how long the pinned guard keeps acting after the last bufscope
    /// that renewed it stopped (crashed, uninstalled); then it fails open. Default 5m.
    #[arg(long = "guard.lease", value_name = "DURATION", value_parser = crate::values::duration_within(std::time::Duration::from_secs(1), std::time::Duration::from_secs(u32::MAX as u64)))]
    pub lease: Option<std::time::Duration>,
}

/// `--guard.lease` when not given.
pub const DEFAULT_LEASE: std::time::Duration = std::time::Duration::from_secs(300);

impl Flags {
    /// Checks the guard flags that clap cannot, with the rest of the command line (`cx`).
    pub fn validate(&self, cx: &ValidateCx<'_>) -> Result<(), Invalid> {
        if !self.comm.is_empty() && !self.exclude_comm.is_empty() {
            return Err(Invalid::new(
                "guard.exclude-comm",
                "--guard.comm and --guard.exclude-comm cannot be combined: use one list",
            ));
        }
        for (flag, list) in [
            ("guard.comm", &self.comm),
            ("guard.exclude-comm", &self.exclude_comm),
        ] {
            if let Some(c) = list.iter().find(|c| c.is_empty() || c.len() > 15) {
                return Err(Invalid::new(
                    flag,
                    format!(
                        "invalid comm {c:?} in --{flag}: a process name is 1 to 15 bytes (the \
                         kernel's comm)"
                    ),
                ));
            }
        }
        if let Some(p) = &self.cgroup
            && !crate::kernel::is_cgroup2(p).unwrap_or(false)
        {
            return Err(Invalid::new(
                "guard.cgroup",
                format!(
                    "--guard.cgroup {}: not a cgroup v2 directory (give one under the cgroup2 \
                     mount, e.g. /sys/fs/cgroup/system.slice)",
                    p.display()
                ),
            ));
        }
        let given = [
            ("guard.cgroup", self.cgroup.is_some()),
            ("guard.comm", !self.comm.is_empty()),
            ("guard.exclude-comm", !self.exclude_comm.is_empty()),
            ("guard.udp-floor", self.udp_floor.is_some()),
            ("guard.raise-sysctl", self.raise_sysctl),
            ("guard.udp-unbound-senders", self.udp_unbound_senders),
            ("guard.persist", self.persist),
            ("guard.lease", self.lease.is_some()),
        ];
        if self.mode == GuardMode::Off
            && let Some((flag, _)) = given.iter().find(|(_, set)| *set)
        {
            return Err(Invalid::new(
                flag,
                format!(
                    "--{flag} is a guard flag but --guard.mode is off: add --guard.mode \
                     observe or enforce"
                ),
            ));
        }
        let disabled = |name: &str| cx.disabled.iter().any(|d| d == name);
        let guard = PROBE.name;
        if self.mode != GuardMode::Off && disabled(guard) {
            return Err(Invalid::new(
                "probe.disable",
                format!(
                    "--probe.disable {guard} turns off what --guard.mode asks for: remove {guard} \
                     from --probe.disable, or leave --guard.mode off"
                ),
            ));
        }
        let setsockopt = setsockopt::PROBE.name;
        if self.mode == GuardMode::Enforce && disabled(setsockopt) {
            return Err(Invalid::new(
                "probe.disable",
                format!(
                    "--guard.mode enforce needs the setsockopt probe on cgroup/setsockopt: \
                     remove {setsockopt} from --probe.disable"
                ),
            ));
        }
        if self.lease.is_some() && !self.persist {
            return Err(Invalid::new(
                "guard.lease",
                "--guard.lease is how long a persisted guard outlives bufscope: add \
                 --guard.persist (with --bpf.pin-path), or drop --guard.lease",
            ));
        }
        if self.persist && !cx.pinned {
            return Err(Invalid::new(
                "guard.persist",
                "--guard.persist keeps the guard attached through pins: add --bpf.pin-path DIR \
                 (e.g. /sys/fs/bpf/bufscope)",
            ));
        }
        Ok(())
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
    /// A persisted guard's lease (None: the guard stops with bufscope).
    pub lease: Option<std::time::Duration>,
    /// The scope, as `bufscope_guard_scope_info` says it: the cgroup (the cgroup2 root's
    /// path for every process), `all`/`only`/`except` and the comms.
    pub scope: (String, &'static str, String),
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
        lease_secs: 0,
    }
}

/// What the guard resolved from its flags (None: `--guard.mode off`).
pub struct Setup(pub(super) Option<On>);

/// The guard, on.
pub(super) struct On {
    /// `GUARD` for the BPF side.
    pub(super) config: GuardConfig,
    /// The `comm`s of `--guard.comm` / `--guard.exclude-comm`, as the kernel stores them.
    pub(super) comms: Vec<[u8; 16]>,
    /// The room's settings.
    pub(super) settings: Settings,
}

/// Resolves `--guard.*` (mode off: nothing) into `GUARD`, the comms, the cgroup and the
/// room's settings. Raises `rmem_max`/`wmem_max` first with `--guard.raise-sysctl`.
pub(super) fn resolve(a: &Flags) -> anyhow::Result<Option<(On, Option<PathBuf>)>> {
    if a.mode == GuardMode::Off {
        return Ok(None);
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
    let lease = a.persist.then(|| a.lease.unwrap_or(DEFAULT_LEASE));
    let mut config = bpf_config(
        enforce,
        floor,
        limits.rmem_max,
        limits.wmem_max,
        cgroup.as_ref().map(|(_, id, level)| (*id, *level)),
        comm_mode,
    );
    config.lease_secs = lease.map_or(0, |l| l.as_secs().clamp(1, u32::MAX as u64) as u32);
    let applied = (config.udp_rcv_floor as i64, config.udp_snd_floor as i64);
    if applied.0 < floor {
        tracing::warn!(
            floor,
            rmem_max = limits.rmem_max,
            "guard: the UDP floor is capped at net.core.rmem_max ({applied:?} applied): raise it \
             (sysctl -w net.core.rmem_max={floor}) or run with --guard.raise-sysctl"
        );
    }
    let cgroup_path = cgroup
        .as_ref()
        .map_or(root.display().to_string(), |(p, _, _)| {
            p.display().to_string()
        });
    let comm_scope = match comm_mode {
        g::COMM_ONLY => "only",
        g::COMM_EXCEPT => "except",
        _ => "all",
    };
    if enforce && cgroup.is_none() && comm_mode == g::COMM_ALL {
        tracing::warn!(
            cgroup = %cgroup_path,
            "guard: enforce at node scope: every process on this node (kubelet, CoreDNS, the \
             CNI, …) gets the buffer policy; narrow it with --guard.cgroup, --guard.comm or \
             --guard.exclude-comm (bufscope_guard_scope_info says which scope is in force)"
        );
    }
    tracing::info!(
        mode = if enforce { "enforce" } else { "observe" },
        udp_floor = floor,
        applied_rcv = applied.0,
        applied_snd = applied.1,
        cgroup = %cgroup_path,
        comm = ?names,
        lease = ?lease,
        "guard on"
    );
    let on = On {
        config,
        comms,
        settings: Settings {
            enforce,
            udp_floor: floor,
            applied_floor: applied,
            lease,
            scope: (cgroup_path, comm_scope, names.join(",")),
        },
    };
    Ok(Some((on, cgroup.map(|(p, _, _)| p))))
}

/// Raises sysctl `name` to `to` (never lowers it); logs what it did.
fn raise_sysctl(name: &str, to: i64) -> anyhow::Result<()> {
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
pub(super) fn require_enforce(status: &[crate::bpf::ProbeStatus]) -> anyhow::Result<()> {
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
    match find(setsockopt::PROBE.name) {
        Some(s) if s.uses("cgroup/setsockopt") => Ok(()),
        s => anyhow::bail!(
            "--guard.mode enforce needs the setsockopt probe on cgroup/setsockopt{cap}: {}",
            s.and_then(|s| s.error.clone())
                .unwrap_or_else(|| "it is disabled".into())
        ),
    }
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
