//! Loading the BPF object and attaching its programs, probe by probe.
//!
//! A *probe* is one signal's set of hooks (e.g. `setsockopt` = `sys_enter_setsockopt` +
//! `sys_exit_setsockopt`). Probes attach independently: if one cannot (a kernel without the
//! tracepoint, a verifier refusal), it is detached entirely, the others keep working, and
//! `bufscope_probe_attached{probe}` says 0 with the reason in the log. Each signal's room
//! declares its probe ([`crate::signals::PROBES`]); this module loads the object, attaches
//! them, and offers the map readers the rooms share ([`BatchReader`], [`Stats`]).

mod batch;
mod stats;

use std::collections::HashSet;

use anyhow::Context as _;
use aya::programs::{BtfTracePoint, TracePoint};
use aya::{Btf, Ebpf, EbpfLoader};

use crate::kernel::KernelInfo;
use crate::signals::PROBES;

pub use batch::BatchReader;
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
}

impl Hook {
    /// `tp_btf/kfree_skb`, `tracepoint/syscalls/sys_exit_socket`.
    pub fn describe(&self) -> String {
        match self {
            Hook::Tracepoint { category, name, .. } => format!("tracepoint/{category}/{name}"),
            Hook::BtfTracepoint { name, .. } => format!("tp_btf/{name}"),
        }
    }
}

/// A signal's hooks, attached all-or-nothing.
#[derive(Clone, Copy, Debug)]
pub struct ProbeSpec {
    /// Name used in flags, logs and the `probe` label.
    pub name: &'static str,
    /// What it measures.
    pub what: &'static str,
    /// Its hooks.
    pub hooks: &'static [Hook],
    /// Whether counting drops depends on it (for `bufscope check`'s exit code).
    pub is_drop_probe: bool,
}

/// Outcome of attaching one probe.
#[derive(Clone, Debug)]
pub struct ProbeStatus {
    /// The probe.
    pub spec: ProbeSpec,
    /// Attached and running.
    pub attached: bool,
    /// Why not, when not (also `"disabled"` when switched off by configuration).
    pub error: Option<String>,
}

impl ProbeStatus {
    /// Hooks as a comma-separated description (the `hook` label).
    pub fn hooks(&self) -> String {
        self.spec
            .hooks
            .iter()
            .map(Hook::describe)
            .collect::<Vec<_>>()
            .join(",")
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
}

/// The compiled BPF object.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/bufscope"));

/// Loads the object with this kernel's layout and attaches every enabled probe.
pub fn load(
    kernel: &KernelInfo,
    btf_path: &std::path::Path,
    disabled: &HashSet<String>,
    sizes: MapSizes,
    log_level: tracing::Level,
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
    let mut ebpf = EbpfLoader::new()
        .btf(Some(&btf))
        .override_global("CONFIG", &config, true)
        .override_global("AYA_LOG_LEVEL", &aya_level, false)
        .map_max_entries("DROPS", sizes.drops)
        .map_max_entries("OWNERS", sizes.owners)
        .map_max_entries("AUTOTUNE", sizes.autotune)
        .map_max_entries("EVENTS", sizes.events_bytes)
        .load(OBJECT)
        .context("loading the BPF object (maps) failed")?;

    let mut status = Vec::new();
    let mut loaded: HashSet<&'static str> = HashSet::new();
    for spec in PROBES {
        if disabled.contains(spec.name) {
            tracing::info!(probe = spec.name, "probe disabled by configuration");
            status.push(ProbeStatus {
                spec: *spec,
                attached: false,
                error: Some("disabled".into()),
            });
            continue;
        }
        match attach(&mut ebpf, spec, &btf, &mut loaded) {
            Ok(()) => {
                tracing::info!(probe = spec.name, hooks = %hooks_of(spec), "probe attached");
                status.push(ProbeStatus {
                    spec: *spec,
                    attached: true,
                    error: None,
                });
            }
            Err(e) => {
                tracing::warn!(
                    probe = spec.name,
                    hooks = %hooks_of(spec),
                    "probe could not attach, the other probes keep running: {e:#}"
                );
                status.push(ProbeStatus {
                    spec: *spec,
                    attached: false,
                    error: Some(format!("{e:#}")),
                });
            }
        }
    }
    // The parsed BTF (tens of MiB of small allocations) is gone: give the pages back.
    drop(btf);
    trim_heap();
    Ok(Probes { ebpf, status })
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

fn hooks_of(spec: &ProbeSpec) -> String {
    spec.hooks
        .iter()
        .map(Hook::describe)
        .collect::<Vec<_>>()
        .join(",")
}

/// Attaches every hook of `spec`; on failure detaches what did attach.
fn attach(
    ebpf: &mut Ebpf,
    spec: &ProbeSpec,
    btf: &Btf,
    loaded: &mut HashSet<&'static str>,
) -> anyhow::Result<()> {
    let mut tp_links = Vec::new();
    let mut btf_links = Vec::new();
    let result = (|| -> anyhow::Result<()> {
        for hook in spec.hooks {
            match *hook {
                Hook::Tracepoint {
                    prog,
                    category,
                    name,
                } => {
                    let p: &mut TracePoint = ebpf
                        .program_mut(prog)
                        .with_context(|| format!("program {prog} missing from the object"))?
                        .try_into()?;
                    if loaded.insert(prog) {
                        p.load().with_context(|| format!("loading {prog}"))?;
                    }
                    let id = p
                        .attach(category, name)
                        .with_context(|| format!("attaching to tracepoint {category}/{name}"))?;
                    tp_links.push((prog, id));
                }
                Hook::BtfTracepoint { prog, name } => {
                    let p: &mut BtfTracePoint = ebpf
                        .program_mut(prog)
                        .with_context(|| format!("program {prog} missing from the object"))?
                        .try_into()?;
                    if loaded.insert(prog) {
                        p.load(name, btf)
                            .with_context(|| format!("loading tp_btf/{name}"))?;
                    }
                    let id = p
                        .attach()
                        .with_context(|| format!("attaching tp_btf/{name}"))?;
                    btf_links.push((prog, id));
                }
            }
        }
        Ok(())
    })();
    if result.is_err() {
        for (prog, id) in tp_links {
            if let Some(Ok(p)) = ebpf.program_mut(prog).map(<&mut TracePoint>::try_from) {
                let _ = p.detach(id);
            }
        }
        for (prog, id) in btf_links {
            if let Some(Ok(p)) = ebpf.program_mut(prog).map(<&mut BtfTracePoint>::try_from) {
                let _ = p.detach(id);
            }
        }
    }
    result
}
