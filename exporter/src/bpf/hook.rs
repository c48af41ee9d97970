//! What a probe is, as data: its hooks ([`Hook`]), the ways it can attach ([`ProbeSpec`]'s
//! variants, best first) and what attaching it gave ([`ProbeStatus`]). Each signal's room
//! declares its [`ProbeSpec`]; the loader ([`super::load`]) and `bufscope check` work from
//! these descriptions alone.

use super::choice::BtfNeed;

/// One hook of a probe: a program of the object (by name) and where it attaches.
#[derive(Clone, Copy, Debug)]
pub enum Hook {
    /// A classic tracepoint (`/sys/kernel/tracing/events/<category>/<name>`).
    Tracepoint {
        /// Program name in the object.
        prog: &'static str,
        /// Tracepoint category.
        category: &'static str,
        /// Tracepoint name.
        name: &'static str,
    },
    /// A BTF tracepoint (`tp_btf/<name>`): typed arguments.
    BtfTracepoint {
        /// Program name in the object.
        prog: &'static str,
        /// Tracepoint name.
        name: &'static str,
    },
    /// A BTF tracepoint used only where the kernel's BTF shows what its program relies on
    /// (e.g. `kfree_skb` with a 4th argument, `rx_sk`): chosen from BTF, not from versions.
    BtfTracepointWhere {
        /// Program name in the object.
        prog: &'static str,
        /// Tracepoint name.
        name: &'static str,
        /// What the kernel's BTF must show.
        needs: &'static [BtfNeed],
    },
    /// An `fentry` program on kernel function `func` (needs the function in BTF, i.e. not
    /// inlined, and a kernel that allows BPF trampolines: some refuse them with EPERM).
    Fentry {
        /// Program name in the object.
        prog: &'static str,
        /// Kernel function.
        func: &'static str,
    },
    /// An `fexit` program on kernel function `func` (as [`Hook::Fentry`]).
    Fexit {
        /// Program name in the object.
        prog: &'static str,
        /// Kernel function.
        func: &'static str,
    },
    /// A `cgroup/setsockopt` program, attached at the probe's cgroup (the cgroup2 root unless
    /// its room names another): runs only for setsockopt calls, before the kernel's handler.
    CgroupSetsockopt {
        /// Program name in the object.
        prog: &'static str,
    },
    /// A `cgroup/getsockopt` program, attached at the probe's cgroup.
    CgroupGetsockopt {
        /// Program name in the object.
        prog: &'static str,
    },
    /// A `cgroup/sock_create` program, attached at the probe's cgroup: runs in process
    /// context for every new AF_INET/AF_INET6 socket.
    CgroupSockCreate {
        /// Program name in the object.
        prog: &'static str,
    },
    /// A `cgroup/sock_release` program, attached at the probe's cgroup: runs when an
    /// AF_INET/AF_INET6 socket created in that cgroup is released (its last close).
    CgroupSockRelease {
        /// Program name in the object.
        prog: &'static str,
    },
    /// A `cgroup/<attach>` socket-address program (`bind4`, `connect6`, `sendmsg4`, …),
    /// attached at the probe's cgroup.
    CgroupSockAddr {
        /// Program name in the object.
        prog: &'static str,
        /// The attach point (`bind4`, `bind6`, `connect4`, `connect6`, `sendmsg4`, `sendmsg6`).
        attach: &'static str,
    },
    /// No program: a counter the kernel keeps per network namespace and shows only in procfs
    /// (`/proc/<pid>/<file>` of a process in each namespace), for events no hook fires on
    /// (a netlink overrun, an XFRM error). "Attaching" checks the file is readable here; the
    /// room reads it on every poll. Never pinned (nothing runs while bufscope does not).
    Procfs {
        /// The file under `/proc/<pid>/` (`net/netlink`, `net/xfrm_stat`).
        file: &'static str,
    },
}

impl Hook {
    /// The program's name in the object (empty for [`Hook::Procfs`], which has none).
    pub fn prog(&self) -> &'static str {
        match *self {
            Hook::Tracepoint { prog, .. }
            | Hook::BtfTracepoint { prog, .. }
            | Hook::BtfTracepointWhere { prog, .. }
            | Hook::Fentry { prog, .. }
            | Hook::Fexit { prog, .. }
            | Hook::CgroupSetsockopt { prog }
            | Hook::CgroupGetsockopt { prog }
            | Hook::CgroupSockCreate { prog }
            | Hook::CgroupSockRelease { prog }
            | Hook::CgroupSockAddr { prog, .. } => prog,
            Hook::Procfs { .. } => "",
        }
    }

    /// The kernel object a BTF-typed program is loaded for (the tracepoint or function),
    /// None for the others.
    pub fn btf_target(&self) -> Option<&'static str> {
        match *self {
            Hook::BtfTracepoint { name, .. } | Hook::BtfTracepointWhere { name, .. } => Some(name),
            Hook::Fentry { func, .. } | Hook::Fexit { func, .. } => Some(func),
            _ => None,
        }
    }

    /// `tp_btf/kfree_skb`, `tracepoint/syscalls/sys_exit_socket`, `cgroup/setsockopt`.
    pub fn describe(&self) -> String {
        match self {
            Hook::Tracepoint { category, name, .. } => format!("tracepoint/{category}/{name}"),
            Hook::BtfTracepoint { name, .. } | Hook::BtfTracepointWhere { name, .. } => {
                format!("tp_btf/{name}")
            }
            Hook::CgroupSetsockopt { .. } => "cgroup/setsockopt".into(),
            Hook::CgroupGetsockopt { .. } => "cgroup/getsockopt".into(),
            Hook::CgroupSockCreate { .. } => "cgroup/sock_create".into(),
            Hook::CgroupSockRelease { .. } => "cgroup/sock_release".into(),
            Hook::CgroupSockAddr { attach, .. } => format!("cgroup/{attach}"),
            Hook::Fentry { func, .. } => format!("fentry/{func}"),
            Hook::Fexit { func, .. } => format!("fexit/{func}"),
            Hook::Procfs { file } => format!("procfs/{file}"),
        }
    }

    /// Whether the hook attaches at a cgroup (needs a cgroup2 hierarchy).
    pub fn needs_cgroup2(&self) -> bool {
        matches!(
            self,
            Hook::CgroupSetsockopt { .. }
                | Hook::CgroupSockCreate { .. }
                | Hook::CgroupSockRelease { .. }
                | Hook::CgroupSockAddr { .. }
                | Hook::CgroupGetsockopt { .. }
        )
    }
}

/// One way of attaching a probe: its hooks, attached all-or-nothing.
pub type Variant = &'static [Hook];

/// A signal's probe: the ways it can attach, best first. The loader uses the first variant
/// whose hooks all load and attach on this kernel; the others are fallbacks.
#[derive(Clone, Copy, Debug)]
pub struct ProbeSpec {
    /// Name used in flags, logs and the `probe` label.
    pub name: &'static str,
    /// What it measures.
    pub what: &'static str,
    /// Its variants, best first (at least one).
    pub variants: &'static [Variant],
    /// Whether counting drops depends on it (for `bufscope check`'s exit code).
    pub is_drop_probe: bool,
    /// Whether its events are attributed to processes (a `probe` of
    /// `bufscope_attribution_unknown_total`).
    pub attributed: bool,
}

/// Hooks as a comma-separated description (the `hook` label).
pub fn describe(hooks: &[Hook]) -> String {
    hooks
        .iter()
        .map(Hook::describe)
        .collect::<Vec<_>>()
        .join(",")
}

/// Outcome of attaching one probe.
#[derive(Clone, Debug)]
pub struct ProbeStatus {
    /// The probe.
    pub spec: ProbeSpec,
    /// Attached and running.
    pub attached: bool,
    /// Index of the variant in use (or, when nothing attached, 0).
    pub variant: usize,
    /// Why not, when not (also `"disabled"` when switched off by configuration); when a
    /// fallback variant attached, why the better ones did not.
    pub error: Option<String>,
    /// The variants passed over before the one in use (or all, when none attached): index
    /// and why (the kernel's BTF lacks what it needs, or the kernel refused it).
    pub skipped: Vec<(usize, String)>,
    /// False when its room's settings leave it off (e.g. the guard without `--guard.mode`): a
    /// choice, not a failure, so it is not listed as a detached probe.
    pub configured: bool,
    /// Its links are pinned (it keeps running while bufscope is not).
    pub pinned: bool,
}

impl ProbeStatus {
    /// A probe that was not attached, for `why`.
    pub fn off(spec: ProbeSpec, why: impl Into<String>, configured: bool) -> Self {
        Self {
            spec,
            attached: false,
            variant: 0,
            error: Some(why.into()),
            skipped: Vec::new(),
            configured,
            pinned: false,
        }
    }

    /// The hooks in use (the best variant's when nothing attached).
    pub fn variant_hooks(&self) -> &'static [Hook] {
        self.spec
            .variants
            .get(self.variant)
            .copied()
            .unwrap_or_default()
    }

    /// Hooks in use as a comma-separated description (the `hook` label).
    pub fn hooks(&self) -> String {
        describe(self.variant_hooks())
    }

    /// Whether the variant in use has hook `h` (by description).
    pub fn uses(&self, h: &str) -> bool {
        self.attached && self.variant_hooks().iter().any(|x| x.describe() == h)
    }
}

/// The status of probe `name` among `all`.
pub fn find<'a>(all: &'a [ProbeStatus], name: &str) -> Option<&'a ProbeStatus> {
    all.iter().find(|s| s.spec.name == name)
}

/// Whether probe `name` attached.
pub fn attached(all: &[ProbeStatus], name: &str) -> bool {
    find(all, name).is_some_and(|s| s.attached)
}
