//! Loading the BPF object and attaching its programs, probe by probe.
//!
//! A *probe* is one signal's set of hooks (e.g. `setsockopt` = `sys_enter_setsockopt` +
//! `sys_exit_setsockopt`). Probes attach independently: if one cannot (a kernel without the
//! tracepoint, a verifier refusal), it is detached entirely, the others keep working, and
//! `bufscope_probe_attached{probe}` says 0 with the reason in the log. Each signal's room
//! declares its probe ([`crate::signals::PROBES`]); this module loads the object, attaches
//! them, and offers the map readers the rooms share ([`BatchReader`], [`Stats`]).

pub mod armed;
mod attach;
mod batch;
mod choice;
#[cfg(test)]
mod object_test;
pub mod pins;
mod stats;

use std::collections::HashSet;

use anyhow::Context as _;
use aya::{Btf, Ebpf, EbpfLoader};

use crate::kernel::KernelInfo;
use crate::signals::PROBES;

use attach::{AttachEnv, Attached, attach, program};
pub use batch::BatchReader;
pub use choice::{BtfNeed, usable};
pub use stats::Stats;

/// One hook of a probe.
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
    /// A `cgroup/setsockopt` program attached at the cgroup2 root: runs only for setsockopt
    /// calls (no cost to other syscalls), before the kernel's handler.
    CgroupSetsockopt {
        /// Program name in the object.
        prog: &'static str,
    },
    /// A `cgroup/sock_create` program attached at the cgroup2 root: runs in process context
    /// for every new AF_INET/AF_INET6 socket.
    CgroupSockCreate {
        /// Program name in the object.
        prog: &'static str,
    },
    /// The guard's `cgroup/getsockopt` program (attached at the guard's cgroup): buffer
    /// readbacks of TCP requests the guard skipped.
    CgroupGetsockopt {
        /// Program name in the object.
        prog: &'static str,
    },
    /// A `cgroup/<attach>` socket-address program (`bind4`, `connect6`, `sendmsg4`, …) of the
    /// guard, attached at the guard's cgroup (`--guard.cgroup`, default the cgroup2 root).
    CgroupSockAddr {
        /// Program name in the object.
        prog: &'static str,
        /// The attach point (`bind4`, `bind6`, `connect4`, `connect6`, `sendmsg4`, `sendmsg6`).
        attach: &'static str,
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
}

impl Hook {
    /// `tp_btf/kfree_skb`, `tracepoint/syscalls/sys_exit_socket`, `cgroup/setsockopt`.
    pub fn describe(&self) -> String {
        match self {
            Hook::Tracepoint { category, name, .. } => format!("tracepoint/{category}/{name}"),
            Hook::BtfTracepoint { name, .. } => format!("tp_btf/{name}"),
            Hook::CgroupSetsockopt { .. } => "cgroup/setsockopt".into(),
            Hook::CgroupSockCreate { .. } => "cgroup/sock_create".into(),
            Hook::CgroupSockAddr { attach, .. } => format!("cgroup/{attach}"),
            Hook::CgroupGetsockopt { .. } => "cgroup/getsockopt".into(),
            Hook::BtfTracepointWhere { name, .. } => format!("tp_btf/{name}"),
            Hook::Fentry { func, .. } => format!("fentry/{func}"),
            Hook::Fexit { func, .. } => format!("fexit/{func}"),
        }
    }

    /// Whether the hook needs a cgroup2 hierarchy.
    pub fn needs_cgroup2(&self) -> bool {
        matches!(
            self,
            Hook::CgroupSetsockopt { .. }
                | Hook::CgroupSockCreate { .. }
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
}

impl ProbeStatus {
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

/// Map sizes (entries).
#[derive(Clone, Copy, Debug)]
pub struct MapSizes {
    /// `DROPS`: (socket, reason) pairs.
    pub drops: u32,
    /// `OWNERS`: socket inode → owner (LRU).
    pub owners: u32,
    /// `AUTOTUNE`: TCP sockets.
    pub autotune: u32,
    /// `EVENTS` ring buffer size in bytes (a power of two, at least one page).
    pub events_bytes: u32,
}

impl Default for MapSizes {
    fn default() -> Self {
        Self {
            drops: 16384,
            owners: 65536,
            autotune: 16384,
            events_bytes: 1 << 20,
        }
    }
}

/// The loaded object and what attached.
pub struct Probes {
    /// The object (programs and the maps not taken out by the collector).
    pub ebpf: Ebpf,
    /// Per-probe outcome, in [`PROBES`] order.
    pub status: Vec<ProbeStatus>,
    /// `--bpf.pin-path`: what was pinned or adopted (None: nothing is pinned).
    pub pins: Option<pins::PinDir>,
}

/// Context naming the cause when a seccomp filter, not the kernel, refuses `bpf(2)`: container
/// runtimes whose default profile predates CAP_BPF allow it only with CAP_SYS_ADMIN, and the
/// EPERM they return reads like a missing capability.
const SECCOMP_BLOCKS_BPF: &str = "seccomp filter blocks bpf(): see docs/kubernetes.md \
     (\"seccomp\"): this runtime's default profile allows bpf() only with CAP_SYS_ADMIN; use \
     the Localhost profile deploy/seccomp/bufscope.json or a runtime that allows it with CAP_BPF";

/// `e`, with [`SECCOMP_BLOCKS_BPF`] in front when a seccomp filter is what refuses `bpf()`.
fn name_seccomp(e: aya::EbpfError) -> anyhow::Error {
    let e = anyhow::Error::new(e);
    if seccomp_blocks_bpf() {
        e.context(SECCOMP_BLOCKS_BPF)
    } else {
        e
    }
}

/// True when this process runs under a seccomp filter (`Seccomp: 2` in /proc/self/status),
/// holds CAP_BPF or CAP_SYS_ADMIN, and still cannot get the kernel's EINVAL for a `bpf()` with
/// an unknown command (which needs no capability): the filter answered first.
fn seccomp_blocks_bpf() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    let filtered = field("Seccomp:") == Some("2");
    // CAP_SYS_ADMIN is bit 21, CAP_BPF bit 39.
    let capable = field("CapEff:")
        .and_then(|v| u64::from_str_radix(v, 16).ok())
        .is_some_and(|eff| eff & (1 << 21 | 1 << 39) != 0);
    if !filtered || !capable {
        return false;
    }
    // SAFETY: bpf(2) with an unknown command, a null attribute pointer and size 0: the kernel
    // reads nothing and returns EINVAL.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            libc::c_int::MAX,
            std::ptr::null::<libc::c_void>(),
            0 as libc::c_uint,
        )
    };
    r == -1 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL)
}

/// The compiled BPF object.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/bufscope"));

/// Loads the object with this kernel's layout and attaches every enabled probe; with
/// `pin_path`, pins (or adopts) the persistent maps and the probes' links ([`pins`]).
#[allow(clippy::too_many_arguments)]
pub fn load(
    kernel: &KernelInfo,
    btf_path: &std::path::Path,
    disabled: &HashSet<String>,
    sizes: MapSizes,
    log_level: tracing::Level,
    guard: &GuardSetup,
    pin_path: Option<&std::path::Path>,
) -> anyhow::Result<Probes> {
    let btf = Btf::parse_file(btf_path, aya::Endianness::default())
        .with_context(|| format!("parsing {}", btf_path.display()))?;
    // aya-log's level filter: 0 off … 5 trace (aya_log_common::Level as u8).
    let aya_level: u8 = match log_level {
        tracing::Level::ERROR => 1,
        tracing::Level::WARN => 2,
        tracing::Level::INFO => 3,
        tracing::Level::DEBUG => 4,
        tracing::Level::TRACE => 5,
    };
    let config = fast_path_config(kernel);
    let compat = crate::kernel::compat::build(&kernel.btf, &kernel.reasons).unwrap_or_else(|e| {
        tracing::warn!("older-kernel hooks unusable: {e}");
        bufscope_common::CompatConfig::zeroed()
    });
    let cgroup_root = crate::kernel::cgroup2_root();
    let overrides = [
        ("DROPS", sizes.drops),
        ("OWNERS", sizes.owners),
        ("AUTOTUNE", sizes.autotune),
        ("EVENTS", sizes.events_bytes),
    ];
    let maps = match pin_path {
        Some(_) => pins::persistent_maps(OBJECT, &overrides)?,
        None => Vec::new(),
    };
    let mut pins = match pin_path {
        None => None,
        Some(dir) => {
            let mut fp = pins::Fingerprint::default();
            let mut off: Vec<&String> = disabled.iter().collect();
            off.sort();
            let settings = format!(
                "{config:?}|{:?}|{:?}|{:?}|{}|{compat:?}|{aya_level}|{off:?}|{cgroup_root:?}|{:?}",
                guard.config,
                guard.comms,
                guard.cgroup,
                guard.persist,
                std::env::var(choice::REFUSE_ENV).ok(),
            );
            fp.add(OBJECT).add(settings.as_bytes());
            for m in &maps {
                fp.add(format!("{m:?}").as_bytes());
            }
            Some(pins::prepare(dir, &maps, fp.value(), guard.persist)?)
        }
    };
    let map_paths: Vec<(&str, std::path::PathBuf)> = match &pins {
        Some(p) => maps
            .iter()
            .map(|m| (m.name.as_str(), p.map_path(&m.name)))
            .collect(),
        None => Vec::new(),
    };
    let mut loader = EbpfLoader::new();
    loader
        .btf(Some(&btf))
        .override_global("CONFIG", &config, true)
        .override_global("GUARD", &guard.config, true)
        .override_global("COMPAT", &compat, true)
        .override_global("AYA_LOG_LEVEL", &aya_level, false);
    for (name, size) in overrides {
        loader.map_max_entries(name, size);
    }
    for (name, path) in &map_paths {
        loader.map_pin_path(name, path.as_path());
    }
    let mut ebpf = loader
        .load(OBJECT)
        .map_err(name_seccomp)
        .context("loading the BPF object (maps) failed")?;

    let cgroup = cgroup_root.map(|root| {
        std::fs::File::open(&root)
            .with_context(|| format!("opening cgroup2 root {}", root.display()))
    });
    let mut status = Vec::new();
    let mut loaded: HashSet<&'static str> = HashSet::new();
    fill_guard_comms(&mut ebpf, guard)?;
    let guard_cgroup = guard_cgroup(guard, cgroup.as_ref());
    let guard_on = guard.config.mode != bufscope_common::guard::MODE_OFF;
    for (index, spec) in PROBES.iter().enumerate() {
        let off = (spec.name == crate::signals::guard::PROBE.name && !guard_on)
            .then_some("off (--guard.mode off)");
        if let Some(p) = pins.as_mut() {
            // Set again below when this run pins the probe's links.
            p.set_variant(index, None);
        }
        if let Some(why) = off.or(disabled.contains(spec.name).then_some("disabled")) {
            tracing::info!(probe = spec.name, "probe disabled by configuration");
            status.push(ProbeStatus {
                spec: *spec,
                attached: false,
                variant: 0,
                error: Some(why.into()),
                skipped: Vec::new(),
            });
            continue;
        }
        // The guard decides in the setsockopt probe's program: neither outlives bufscope
        // unless --guard.persist.
        let guarded = spec.name == crate::signals::guard::PROBE.name
            || (guard_on && spec.name == crate::signals::setsockopt::PROBE.name);
        let pin_here = pins.as_ref().is_some_and(|p| !guarded || p.persist_guard);
        let adopted = pins.as_ref().filter(|_| pin_here).and_then(|p| {
            spec.variants.iter().enumerate().find_map(|(i, hooks)| {
                (p.adoptable(index, spec.name, hooks.len()) == Some(i)).then_some(i)
            })
        });
        if let (Some(i), Some(p)) = (adopted, pins.as_mut()) {
            p.set_variant(index, Some(i));
            tracing::info!(probe = spec.name, hooks = %describe(spec.variants[i]), "probe adopted (pinned links keep running)");
            status.push(ProbeStatus {
                spec: *spec,
                attached: true,
                variant: i,
                error: None,
                skipped: Vec::new(),
            });
            continue;
        }
        let mut errors = Vec::new();
        let mut skipped = Vec::new();
        let mut attached = None;
        for (i, hooks) in spec.variants.iter().enumerate() {
            if let Err(why) = usable(hooks, &kernel.btf) {
                errors.push(format!("{}: {why}", describe(hooks)));
                skipped.push((i, why));
                continue;
            }
            let env = AttachEnv {
                btf: &btf,
                cgroup: cgroup.as_ref(),
                guard_cgroup: guard_cgroup.as_ref(),
                pin: pin_here && pinnable(hooks, kernel, spec.name),
            };
            match attach(&mut ebpf, hooks, &env, &mut loaded) {
                Ok(done) => {
                    attached = Some((i, done, env.pin));
                    break;
                }
                Err(e) => {
                    errors.push(format!("{}: {e:#}", describe(hooks)));
                    skipped.push((i, format!("{e:#}")));
                }
            }
        }
        let error = (!errors.is_empty()).then(|| errors.join("; "));
        match attached {
            Some((i, done, pin)) => {
                let hooks = describe(spec.variants[i]);
                match &error {
                    None => tracing::info!(probe = spec.name, hooks = %hooks, "probe attached"),
                    Some(e) => tracing::info!(
                        probe = spec.name,
                        hooks = %hooks,
                        "probe attached through a fallback ({e})"
                    ),
                }
                let mut error = error;
                let mut ok = true;
                if let Some(p) = pins.as_mut().filter(|_| pin) {
                    // Not pinned is not attached: a link aya handed over is gone when its
                    // pin fails, and a half-attached probe would count wrong.
                    if let Err(e) = pin_links(&mut ebpf, p, spec.name, done) {
                        tracing::warn!(probe = spec.name, "probe detached: pinning failed: {e:#}");
                        error = Some(format!("pinning failed: {e:#}"));
                        ok = false;
                    }
                    p.set_variant(index, ok.then_some(i));
                }
                // Unpinned, the links stay with aya's programs (dropping a Finish keeps them).
                status.push(ProbeStatus {
                    spec: *spec,
                    attached: ok,
                    variant: i,
                    error,
                    skipped,
                });
            }
            None => {
                tracing::warn!(
                    probe = spec.name,
                    "probe could not attach, the other probes keep running: {}",
                    error.as_deref().unwrap_or("no variant")
                );
                if let Some(p) = pins.as_mut() {
                    p.set_variant(index, None);
                }
                status.push(ProbeStatus {
                    spec: *spec,
                    attached: false,
                    variant: 0,
                    error,
                    skipped,
                });
            }
        }
    }
    if let Some(p) = &pins {
        p.drop_stale_links()?;
        p.write_meta()?;
    }
    armed::load(&mut ebpf, &btf, &kernel.btf, &status);
    // The parsed BTF (tens of MiB of small allocations) is gone: give the pages back.
    drop(btf);
    trim_heap();
    Ok(Probes { ebpf, status, pins })
}

/// Whether the links of `hooks` can be pinned on this kernel: classic tracepoints get a BPF
/// link (which can be pinned) only where the kernel has perf links (5.15+; `struct
/// bpf_perf_link` in BTF); before, aya attaches them with perf-event ioctls and the probe runs
/// unpinned (it counts while bufscope runs).
fn pinnable(hooks: &[Hook], kernel: &KernelInfo, probe: &str) -> bool {
    let ok = !hooks.iter().any(|h| matches!(h, Hook::Tracepoint { .. }))
        || kernel.btf.has_member("bpf_perf_link", "perf_file");
    if !ok {
        tracing::warn!(
            probe,
            "this kernel attaches tracepoints without BPF links (perf links need 5.15+): the \
             probe runs unpinned and stops counting while bufscope is not running"
        );
    }
    ok
}

/// Pins the links of one attached variant at `DIR/links/<probe>_<n>`; on failure detaches
/// the rest and removes what it pinned of this probe.
fn pin_links(
    ebpf: &mut Ebpf,
    pins: &pins::PinDir,
    probe: &str,
    done: Vec<Attached>,
) -> anyhow::Result<()> {
    let n = done.len();
    // A half-written earlier attempt (adopting, with this probe's pins incomplete).
    for k in 0..n {
        let _ = std::fs::remove_file(pins.link_path(probe, k));
    }
    let mut result = Ok(());
    for (k, d) in done.into_iter().enumerate() {
        if result.is_ok() {
            result = d.pin(ebpf, &pins.link_path(probe, k));
        } else {
            d.undo(ebpf);
        }
    }
    if result.is_err() {
        for k in 0..n {
            let _ = std::fs::remove_file(pins.link_path(probe, k));
        }
    }
    result
}

/// Returns freed heap pages to the kernel (glibc keeps them otherwise). Start-up parses the
/// kernel's BTF into tens of MiB of small allocations; once they are dropped, this brings the
/// resident set down to what the daemon really uses (measured: 64 → 48 MiB after [`load`];
/// 8.6 MiB when the caller also drops its `KernelInfo` and calls this again).
pub fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Ring-buffer wake-up threshold written to `Config::ringbuf_wakeup_bytes`: the reader is woken
/// only once this much data waits (0 would be the kernel's default, a wake-up for nearly every
/// event: ≈1 µs of irq_work self-IPI per setsockopt call or TCP connection on this VM). The
/// exporter drains the ring buffer on a 200 ms timer and before every poll/scrape, so events
/// are never stale.
pub const RINGBUF_WAKEUP_BYTES: u32 = 64 * 1024;

/// `kernel.config` plus the members only the hot paths use: `sock.sk_ino` (6.18+), which
/// saves the drop probe a helper call per packet where the kernel has it (0 = absent: the probe
/// falls back to `SOCK_INODE(sk->sk_socket)`), and the ring-buffer wake-up policy.
fn fast_path_config(kernel: &KernelInfo) -> bufscope_common::Config {
    let mut c = kernel.config;
    c.ringbuf_wakeup_bytes = RINGBUF_WAKEUP_BYTES;
    c.sk_ino = match kernel.btf.member("sock", "sk_ino") {
        // `unsigned long`: the probe loads exactly 8 bytes.
        Ok(m) if !m.bitfield && m.bits == 64 => m.byte_offset(),
        _ => 0,
    };
    c
}

/// The guard's settings for the loader: what is patched into `GUARD`, the comms of its scope
/// and the cgroup its socket-address programs attach to.
#[derive(Clone, Debug, Default)]
pub struct GuardSetup {
    /// `GUARD` (mode off: the guard probe is not attached and its branches are dead code).
    pub config: bufscope_common::GuardConfig,
    /// The `comm`s of `--guard.comm` / `--guard.exclude-comm`, as the kernel stores them.
    pub comms: Vec<[u8; 16]>,
    /// `--guard.cgroup` (None: the cgroup2 root).
    pub cgroup: Option<std::path::PathBuf>,
    /// `--guard.persist`: pin the guard's links (and the shared setsockopt program's).
    pub persist: bool,
}

/// Writes the guard's comms into `GUARD_COMMS`.
fn fill_guard_comms(ebpf: &mut Ebpf, guard: &GuardSetup) -> anyhow::Result<()> {
    if guard.comms.is_empty() {
        return Ok(());
    }
    let mut map: aya::maps::HashMap<_, [u8; 16], u8> = aya::maps::HashMap::try_from(
        ebpf.map_mut("GUARD_COMMS")
            .context("map GUARD_COMMS missing from the BPF object")?,
    )?;
    for c in &guard.comms {
        map.insert(c, 1, 0).context("filling GUARD_COMMS")?;
    }
    Ok(())
}

/// Opens the guard's cgroup (its `--guard.cgroup`, else the cgroup2 root).
fn guard_cgroup(
    guard: &GuardSetup,
    root: Option<&anyhow::Result<std::fs::File>>,
) -> Option<anyhow::Result<std::fs::File>> {
    match &guard.cgroup {
        Some(p) => Some(
            std::fs::File::open(p)
                .with_context(|| format!("opening --guard.cgroup {}", p.display())),
        ),
        None => root.map(|r| match r {
            Ok(f) => f.try_clone().context("duplicating the cgroup2 root fd"),
            Err(e) => Err(anyhow::anyhow!("{e:#}")),
        }),
    }
}
