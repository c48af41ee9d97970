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
    /// that renewed it stopped (crashed, uninstalled); then it fails open. Default 5m; at
    /// least twice --poll-interval (it is renewed on every poll).
    #[arg(long = "guard.lease", value_name = "DURATION", value_parser = crate::values::duration_within(std::time::Duration::from_secs(1), std::time::Duration::from_secs(u32::MAX as u64)))]
    pub lease: Option<std::time::Duration>,
    /// The most receive buffer (bytes, as the kernel counts it: twice the SO_RCVBUF value)
    /// the UDP floor grants to live sockets together; beyond it sockets keep the kernel's
    /// size, counted in bufscope_guard_udp_left_out_total. Default 1 GiB (73 sockets at the
    /// 7 MiB floor).
    #[arg(long = "guard.udp-budget", value_name = "BYTES", value_parser = udp_budget_value)]
    pub udp_budget: Option<u64>,
}

/// `--guard.udp-budget`: a byte size (`1073741824`, `512M`, `1G`), at least one byte.
fn udp_budget_value(s: &str) -> Result<u64, String> {
    match policy::units::parse_bytes(s)? {
        0 => Err("--guard.udp-budget 0 would leave every socket out: give at least 1".into()),
        n => Ok(n),
    }
}

/// `--guard.lease` when not given.
pub const DEFAULT_LEASE: std::time::Duration = std::time::Duration::from_secs(300);

/// `--guard.udp-budget` when not given: 1 GiB of receive buffer, 73 sockets at the policy's
/// 7 MiB floor (each holds twice that, as the kernel counts it). Under a flood every raised
/// socket may fill its buffer: this bounds what the guard can make the node queue, where a
/// host-wide `rmem_default` raise applies to every socket on the node.
pub const DEFAULT_UDP_BUDGET: u64 = 1 << 30;

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
            ("guard.udp-budget", self.udp_budget.is_some()),
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
        if self.persist {
            let lease = self.lease.unwrap_or(DEFAULT_LEASE);
            let least = cx.poll_interval.saturating_mul(2);
            if lease < least {
                return Err(Invalid::new(
                    "guard.lease",
                    format!(
                        "--guard.lease {:?} is less than twice --poll-interval {:?} (the lease \
                         is renewed on every poll: a shorter one lapses between two): give \
                         --guard.lease {:?} or more",
                        lease, cx.poll_interval, least
                    ),
                ));
            }
        }
        if self.mode != GuardMode::Off {
            let offsets = TimeOffsets::read();
            if offsets.boottime_ns != 0 {
                return Err(Invalid::new(
                    "guard.mode",
                    format!(
                        "--guard.mode: bufscope runs in a time namespace whose boot time is \
                         shifted by {} s (/proc/self/timens_offsets): the kernel's process start \
                         times would not match /proc's, so guard decisions could not be given to \
                         their processes; run bufscope in the host's time namespace",
                        offsets.boottime_ns / 1_000_000_000
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The offsets of this process's time namespace (`/proc/self/timens_offsets`; all zero in the
/// host's, or on a kernel without time namespaces): what its `CLOCK_MONOTONIC` and
/// `CLOCK_BOOTTIME` add to the kernel's clocks, which BPF programs read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimeOffsets {
    /// Added to `CLOCK_MONOTONIC` (ns).
    pub monotonic_ns: i64,
    /// Added to `CLOCK_BOOTTIME` (ns).
    pub boottime_ns: i64,
}

impl TimeOffsets {
    /// Reads this process's offsets (zero when the file is absent).
    pub fn read() -> Self {
        std::fs::read_to_string("/proc/self/timens_offsets")
            .map(|t| Self::parse(&t))
            .unwrap_or_default()
    }

    /// Parses `timens_offsets` ("monotonic <s> <ns>" and "boottime <s> <ns>" lines).
    pub fn parse(text: &str) -> Self {
        let mut o = Self::default();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(name), Some(secs), Some(nanos)) = (f.first(), f.get(1), f.get(2)) else {
                continue;
            };
            let (Ok(secs), Ok(nanos)) = (secs.parse::<i64>(), nanos.parse::<i64>()) else {
                continue;
            };
            let ns = secs.saturating_mul(1_000_000_000).saturating_add(nanos);
            match *name {
                "monotonic" => o.monotonic_ns = ns,
                "boottime" => o.boottime_ns = ns,
                _ => {}
            }
        }
        o
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
    /// `--guard.udp-budget` (bytes of receive buffer, as the kernel counts them).
    pub udp_budget: u64,
    /// The policy generation the marks of this run carry (`GuardConfig::generation`).
    pub generation: u32,
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
/// `SO_RCVBUF` are clamped to anyway (so the decision says what the socket really gets). The
/// generation is left 0: [`generation`] fills it once the comms are known.
pub fn bpf_config(
    enforce: bool,
    udp_floor: i64,
    rmem_max: Option<i64>,
    wmem_max: Option<i64>,
    cgroup: Option<(u64, u32)>,
    comm_mode: u32,
    udp_budget: u64,
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
        generation: 0,
        self_tgid: std::process::id(),
        lease_secs: 0,
        _pad: 0,
        udp_budget,
    }
}

/// The policy generation of `c` with the scope's `comms`: a digest (FNV-1a) of everything a
/// decision depends on — mode, rules, floors, scope, budget — never 0 (fresh socket storage).
/// The lease and bufscope's own pid are no part of it.
pub fn generation(c: &GuardConfig, comms: &[[u8; 16]]) -> u32 {
    let mut sorted = comms.to_vec();
    sorted.sort_unstable();
    let mut h: u32 = 0x811c_9dc5;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u32::from(*b);
            h = h.wrapping_mul(0x0100_0193);
        }
    };
    eat(&c.mode.to_le_bytes());
    eat(&c.rules.to_le_bytes());
    eat(&c.udp_rcv_floor.to_le_bytes());
    eat(&c.udp_snd_floor.to_le_bytes());
    eat(&c.cgroup_id.to_le_bytes());
    eat(&c.cgroup_level.to_le_bytes());
    eat(&c.comm_mode.to_le_bytes());
    eat(&c.udp_budget.to_le_bytes());
    for comm in &sorted {
        eat(comm);
    }
    h.max(1)
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
/// room's settings, from the flags and the sysctls as they are now. It changes nothing on the
/// node: `--guard.raise-sysctl` is [`raise_sysctls`], a step of its own before it.
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
    let floor = udp_floor(a);
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
    let comms: Vec<[u8; 16]> = names
        .iter()
        .map(|n| {
            let mut c = [0u8; 16];
            c[..n.len().min(15)].copy_from_slice(&n.as_bytes()[..n.len().min(15)]);
            c
        })
        .collect();
    let enforce = a.mode == GuardMode::Enforce;
    let lease = a.persist.then(|| a.lease.unwrap_or(DEFAULT_LEASE));
    let udp_budget = a.udp_budget.unwrap_or(DEFAULT_UDP_BUDGET);
    let mut config = bpf_config(
        enforce,
        floor,
        limits.rmem_max,
        limits.wmem_max,
        cgroup.as_ref().map(|(_, id, level)| (*id, *level)),
        comm_mode,
        udp_budget,
    );
    config.lease_secs = lease.map_or(0, |l| l.as_secs().clamp(1, u32::MAX as u64) as u32);
    config.generation = generation(&config, &comms);
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
        udp_budget,
        generation = config.generation,
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
            udp_budget,
            generation: config.generation,
        },
    };
    Ok(Some((on, cgroup.map(|(p, _, _)| p))))
}

/// The UDP floor `--guard.udp-floor` asks (default: the policy's).
fn udp_floor(a: &Flags) -> i64 {
    a.udp_floor
        .map_or_else(policy_udp_floor, |f| f.min(i32::MAX as u64) as i64)
}

/// `--guard.raise-sysctl`: raises `net.core.rmem_max`/`wmem_max` to the UDP floor (host-wide,
/// logged, never lowered). The one step of the guard that writes to the node: `bufscope run`
/// calls it before [`resolve`] reads the ceilings, `bufscope check` never does.
pub(super) fn raise_sysctls(a: &Flags) -> anyhow::Result<()> {
    if a.mode == GuardMode::Off || !a.raise_sysctl {
        return Ok(());
    }
    let floor = udp_floor(a);
    for name in ["net/core/rmem_max", "net/core/wmem_max"] {
        raise_sysctl(name, floor)?;
    }
    Ok(())
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
            DEFAULT_UDP_BUDGET,
        );
        assert_eq!(c.mode, g::MODE_ENFORCE);
        assert_eq!(c.rules, g::RULE_UDP_FLOOR | g::RULE_TCP_AUTOTUNE);
        assert_eq!(c.udp_rcv_floor, 4 << 20, "capped at rmem_max");
        assert_eq!(c.udp_snd_floor, 7 << 20, "wmem_max is above the floor");
        let o = bpf_config(false, 1 << 20, None, None, Some((42, 2)), g::COMM_ONLY, 1);
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

    #[test]
    fn a_policy_change_is_a_new_generation() {
        let base = bpf_config(false, 7 << 20, None, None, None, g::COMM_ALL, 1 << 30);
        let gen_of = |c: &GuardConfig, comms: &[[u8; 16]]| generation(c, comms);
        let g0 = gen_of(&base, &[]);
        assert_ne!(g0, 0);
        let enforce = GuardConfig {
            mode: g::MODE_ENFORCE,
            ..base
        };
        let floor = GuardConfig {
            udp_rcv_floor: 1 << 20,
            ..base
        };
        let budget = GuardConfig {
            udp_budget: 1 << 20,
            ..base
        };
        let cgroup = GuardConfig {
            cgroup_id: 7,
            cgroup_level: 1,
            ..base
        };
        let mut comm = [0u8; 16];
        comm[..7].copy_from_slice(b"openvpn");
        for (what, other) in [
            ("mode", gen_of(&enforce, &[])),
            ("floor", gen_of(&floor, &[])),
            ("budget", gen_of(&budget, &[])),
            ("cgroup", gen_of(&cgroup, &[])),
            ("comms", gen_of(&base, &[comm])),
        ] {
            assert_ne!(other, g0, "{what} changes the generation");
        }
        // What is no policy: the lease, bufscope's own pid; the order of the comms.
        let leased = GuardConfig {
            lease_secs: 300,
            self_tgid: 1,
            ..base
        };
        assert_eq!(gen_of(&leased, &[]), g0);
        let mut other = [0u8; 16];
        other[..4].copy_from_slice(b"wg-q");
        assert_eq!(gen_of(&base, &[comm, other]), gen_of(&base, &[other, comm]));
    }

    #[test]
    fn time_namespace_offsets() {
        let t = TimeOffsets::parse("monotonic      3600         5\nboottime      -10         0\n");
        assert_eq!(t.monotonic_ns, 3_600_000_000_005);
        assert_eq!(t.boottime_ns, -10_000_000_000);
        assert_eq!(TimeOffsets::parse(""), TimeOffsets::default());
    }
}
