//! The BPF side, seen from userspace: loading the object, attaching the probes the signal rooms
//! declare, pinning, and the map readers the rooms share.
//!
//! A *probe* is one signal's set of hooks ([`ProbeSpec`], declared by its room). Probes attach
//! independently: if one cannot (a kernel without the tracepoint, a verifier refusal), it is
//! detached entirely, the others keep working, and `bufscope_probe_attached{probe}` says 0
//! with the reason in the log. [`load`] works from the probe list and a [`LoadPlan`] the rooms
//! filled; it names no signal.
//!
//! | module | what |
//! |---|---|
//! | [`hook`] | `Hook`, `ProbeSpec`, `ProbeStatus`: probes as data |
//! | [`choice`] | which variants this kernel's BTF allows |
//! | [`plan`] | what the rooms ask of the loader (globals, map sizes, cgroups, pinning) |
//! | [`attach`] | loading one variant and linking its hooks, all or nothing |
//! | [`pins`] | `--bpf.pin-path`: adopt, upgrade or replace what an earlier bufscope pinned |
//! | [`sys`] | every raw `bpf(2)`/`perf_event_open(2)` call |
//! | [`table`], [`ring`] | the map-read seam: [`table::Table`] over a kernel map or an in-memory fake ([`fake`], tests), [`ring::Records`] over the event ring buffer |
//! | [`maps`], [`batch`], [`stats`] | taking and reading maps |

pub mod attach;
mod batch;
pub mod choice;
#[cfg(test)]
pub mod fake;
pub mod hook;
mod maps;
pub mod pins;
pub mod plan;
pub mod ring;
mod stats;
pub mod sys;
pub mod table;

use std::collections::HashSet;
use std::path::Path;

use anyhow::Context as _;
use aya::{Btf, Ebpf, EbpfLoader};

use crate::kernel::KernelInfo;

use attach::{AttachEnv, Link, attach};
pub use batch::BatchReader;
pub use choice::{BtfNeed, usable};
pub use hook::{Hook, ProbeSpec, ProbeStatus, Variant, describe};
pub use maps::{decode, take_map};
pub use plan::{Attached, LoadHooks, LoadPlan, Purpose};
pub use ring::Records;
pub use stats::{RunStats, Stats};
pub use table::{PerCpuTable, Table};

/// The compiled BPF object.
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/bufscope"));

/// The loaded object and what attached.
pub struct Probes {
    /// The object (programs and the maps not taken out by the rooms).
    pub ebpf: Ebpf,
    /// Per-probe outcome, in the order of the probe list.
    pub status: Vec<ProbeStatus>,
    /// `--bpf.pin-path`: what was pinned or adopted (None: nothing is pinned).
    pub pins: Option<pins::PinDir>,
    /// The links of the probes that are not pinned: held, so that dropping [`Probes`]
    /// detaches the probes.
    #[expect(
        dead_code,
        reason = "held for its Drop: closing the links detaches the probes"
    )]
    links: Vec<Link>,
}

impl Probes {
    /// Whether any probe is attached.
    pub fn any_attached(&self) -> bool {
        self.status.iter().any(|s| s.attached)
    }
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
/// holds CAP_BPF or CAP_SYS_ADMIN, and still cannot get the kernel's answer to `bpf()`.
fn seccomp_blocks_bpf() -> bool {
    let Some(status) = crate::kernel::read_lossy("/proc/self/status") else {
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
    filtered && capable && sys::bpf_is_filtered()
}

/// aya-log's level filter: 0 off … 5 trace (`aya_log_common::Level as u8`).
fn aya_log_level(level: tracing::Level) -> u8 {
    match level {
        tracing::Level::ERROR => 1,
        tracing::Level::WARN => 2,
        tracing::Level::INFO => 3,
        tracing::Level::DEBUG => 4,
        tracing::Level::TRACE => 5,
    }
}

/// Opens a cgroup directory for attaching.
fn open_cgroup(path: &Path) -> anyhow::Result<std::fs::File> {
    std::fs::File::open(path).with_context(|| format!("opening cgroup {}", path.display()))
}

/// Loads the object with this kernel's layout and the plan's settings, and attaches every
/// probe of `probes` the plan leaves on (each all-or-nothing, best variant first). With
/// `pin_dir` (locked by [`pins::dir::PinLock::acquire`]), pins (or adopts) the persistent maps and the probes' links ([`pins`]). The
/// rooms' `hooks` run before anything is attached and after everything is.
pub fn load(
    kernel: &KernelInfo,
    btf_path: &Path,
    probes: &[ProbeSpec],
    plan: &LoadPlan,
    hooks: &mut dyn LoadHooks,
    pin_dir: Option<pins::dir::PinLock>,
) -> anyhow::Result<Probes> {
    let btf = Btf::parse_file(btf_path, aya::Endianness::default())
        .with_context(|| format!("parsing {}", btf_path.display()))?;
    let aya_level = aya_log_level(plan.log_level);
    let config = fast_path_config(kernel);
    let compat = crate::kernel::compat::build(&kernel.btf, &kernel.reasons).unwrap_or_else(|e| {
        tracing::warn!("older-kernel hooks unusable: {e}");
        bufscope_common::CompatConfig::zeroed()
    });
    let cgroup_root = crate::kernel::cgroup2_root();
    let mut pins = match pin_dir {
        None => None,
        Some(lock) => {
            let maps = pins::persistent_maps(OBJECT, plan.sizes())?;
            let mut fp = pins::Fingerprint::default();
            let settings = format!(
                "{config:?}|{compat:?}|{aya_level}|{cgroup_root:?}|{:?}|{}",
                std::env::var(choice::REFUSE_ENV).ok(),
                plan.fingerprint_text(),
            );
            fp.add(OBJECT).add(settings.as_bytes());
            for m in &maps {
                fp.add(format!("{m:?}").as_bytes());
            }
            Some(pins::prepare(lock, &maps, fp.value())?)
        }
    };
    let mut loader = EbpfLoader::new();
    loader
        .btf(Some(&btf))
        .override_global("CONFIG", &config, true)
        .override_global("COMPAT", &compat, true)
        .override_global("AYA_LOG_LEVEL", &aya_level, false);
    for (name, bytes) in plan.globals() {
        loader.override_global(name, bytes, true);
    }
    for (name, size) in plan.sizes() {
        loader.map_max_entries(name, size);
    }
    let map_paths: Vec<(String, std::path::PathBuf)> = match &pins {
        Some(p) => pins::persistent_maps(OBJECT, plan.sizes())?
            .into_iter()
            .map(|m| {
                let path = p.map_path(&m.name);
                (m.name, path)
            })
            .collect(),
        None => Vec::new(),
    };
    for (name, path) in &map_paths {
        loader.map_pin_path(name, path.as_path());
    }
    let mut ebpf = loader
        .load(OBJECT)
        .map_err(name_seccomp)
        .context("loading the BPF object (maps) failed")?;
    hooks.before_attach(&mut ebpf)?;

    let root = cgroup_root.as_deref().map(open_cgroup);
    let tracefs = crate::kernel::tracefs_root();
    let perf_links = kernel.btf.has_member("bpf_perf_link", "perf_file");
    let mut status = Vec::with_capacity(probes.len());
    let mut links = Vec::new();
    let mut loaded: HashSet<&'static str> = HashSet::new();
    for (index, spec) in probes.iter().enumerate() {
        if let Some(p) = pins.as_mut() {
            // Set again below when this run pins the probe's links.
            p.set_variant(index, None);
        }
        if let Some((why, configured)) = plan.off(spec.name) {
            tracing::info!(probe = spec.name, "probe off: {why}");
            status.push(ProbeStatus::off(*spec, why, configured));
            continue;
        }
        let pin_here = pins.is_some() && plan.pinnable(spec.name);
        let adopted = pins
            .as_ref()
            .filter(|_| pin_here)
            .and_then(|p| p.adoptable(index, spec));
        if let (Some(i), Some(p)) = (adopted, pins.as_mut()) {
            p.set_variant(index, Some(i));
            tracing::info!(probe = spec.name, hooks = %describe(spec.variants[i]), "probe adopted (pinned links keep running)");
            status.push(ProbeStatus {
                variant: i,
                attached: true,
                error: None,
                pinned: true,
                ..ProbeStatus::off(*spec, "", true)
            });
            continue;
        }
        let own_cgroup = plan.cgroup_of(spec.name).map(|p| open_cgroup(p));
        let env = AttachEnv {
            btf: &btf,
            cgroup: own_cgroup.as_ref().or(root.as_ref()),
            perf_links,
            tracefs: tracefs.as_deref(),
        };
        let (mut s, done) = attach_probe(&mut ebpf, spec, kernel, &env, plan, &mut loaded);
        let Some(done) = done else {
            status.push(s);
            continue;
        };
        let pin = pin_here && pinnable(s.variant_hooks(), perf_links, spec.name);
        match pins.as_mut().filter(|_| pin) {
            Some(p) => {
                // Not pinned is not attached: a half-pinned probe would count wrong.
                match pin_links(p, spec.name, &done) {
                    Ok(()) => {
                        s.pinned = true;
                        p.set_variant(index, Some(s.variant));
                    }
                    Err(e) => {
                        tracing::warn!(probe = spec.name, "probe detached: pinning failed: {e:#}");
                        s.error = Some(format!("pinning failed: {e:#}"));
                        s.attached = false;
                    }
                }
                // The pins hold the links now (or, on failure, nothing does: detached).
                drop(done);
            }
            None => links.extend(done),
        }
        status.push(s);
    }
    if let Some(p) = &pins {
        p.drop_stale_links(probes)?;
        p.write_meta()?;
    }
    let cx = Attached {
        btf: &btf,
        kernel: &kernel.btf,
        status: &status,
    };
    hooks.after_attach(&mut ebpf, &cx)?;
    // The parsed BTF (tens of MiB of small allocations) is gone: give the pages back.
    drop(btf);
    trim_heap();
    Ok(Probes {
        ebpf,
        status,
        pins,
        links,
    })
}

/// A load error with the verifier's log cut to its verdict: the log's last statement before
/// its statistics (e.g. `unknown func bpf_getsockopt#57`), which is what names the reason; the
/// whole log is hundreds of lines of register states.
fn verifier_reason(e: &str) -> String {
    let Some((head, log)) = e.split_once("Verifier output:") else {
        return e.to_string();
    };
    let verdict = log
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("verification time") && !l.starts_with("processed "))
        .filter(|l| !l.is_empty())
        .last();
    match verdict {
        Some(v) => format!("{head}verifier: {v}"),
        None => e.to_string(),
    }
}

/// Tries the variants of `spec` best first; returns its status and, when one attached, its
/// links.
fn attach_probe(
    ebpf: &mut Ebpf,
    spec: &ProbeSpec,
    kernel: &KernelInfo,
    env: &AttachEnv<'_>,
    plan: &LoadPlan,
    loaded: &mut HashSet<&'static str>,
) -> (ProbeStatus, Option<Vec<Link>>) {
    let mut errors = Vec::new();
    let mut skipped = Vec::new();
    for (i, hooks) in spec.variants.iter().enumerate() {
        if let Some(why) = plan.passed_over(spec.name, i) {
            // A setting, not the kernel: not an error of the variant finally used.
            skipped.push((i, why.to_string()));
            continue;
        }
        if let Err(why) = usable(hooks, &kernel.btf) {
            errors.push(format!("{}: {why}", describe(hooks)));
            skipped.push((i, why));
            continue;
        }
        match attach(ebpf, hooks, env, loaded) {
            Ok(done) => {
                let error = (!errors.is_empty()).then(|| errors.join("; "));
                match &error {
                    None => {
                        tracing::info!(probe = spec.name, hooks = %describe(hooks), "probe attached")
                    }
                    Some(e) => tracing::info!(
                        probe = spec.name,
                        hooks = %describe(hooks),
                        "probe attached through a fallback ({e})"
                    ),
                }
                let status = ProbeStatus {
                    spec: *spec,
                    attached: true,
                    variant: i,
                    error,
                    skipped,
                    configured: true,
                    pinned: false,
                };
                return (status, Some(done));
            }
            Err(e) => {
                let e = verifier_reason(&format!("{e:#}"));
                errors.push(format!("{}: {e}", describe(hooks)));
                skipped.push((i, e));
            }
        }
    }
    let error = if errors.is_empty() {
        "no variant".to_string()
    } else {
        errors.join("; ")
    };
    tracing::warn!(
        probe = spec.name,
        "probe could not attach, the other probes keep running: {error}"
    );
    let status = ProbeStatus {
        skipped,
        ..ProbeStatus::off(*spec, error, true)
    };
    (status, None)
}

/// Whether the links of `hooks` can be pinned on this kernel: classic tracepoints get a BPF
/// link (which can be pinned) only where the kernel has perf links (5.15+; `struct
/// bpf_perf_link` in BTF); before, they are attached with perf-event ioctls and the probe runs
/// unpinned (it counts while bufscope runs).
fn pinnable(hooks: &[Hook], perf_links: bool, probe: &str) -> bool {
    let ok = perf_links || !hooks.iter().any(|h| matches!(h, Hook::Tracepoint { .. }));
    if !ok {
        tracing::warn!(
            probe,
            "this kernel attaches tracepoints without BPF links (perf links need 5.15+): the \
             probe runs unpinned and stops counting while bufscope is not running"
        );
    }
    ok
}

/// Pins the links of one attached variant at `DIR/links/<probe>_<n>`, each replacing the
/// link an earlier run pinned there (removed right before, after the new one attached); on
/// failure removes what it pinned of this probe.
fn pin_links(pins: &pins::PinDir, probe: &str, links: &[Link]) -> anyhow::Result<()> {
    let result = links.iter().enumerate().try_for_each(|(k, l)| {
        let path = pins.link_path(probe, k);
        if std::fs::symlink_metadata(&path).is_ok() {
            pins.lock.remove_link(&format!("{probe}_{k}"))?;
        }
        l.pin(&path)
    });
    if result.is_err() {
        for k in 0..links.len() {
            let _ = pins.lock.remove_link(&format!("{probe}_{k}"));
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
/// exporter drains the ring buffer on a 1 s timer and before every poll/scrape, so events are
/// never stale.
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

#[cfg(test)]
mod tests {
    #[test]
    fn verifier_reason_is_the_logs_verdict() {
        let e = "loading cgroup/bind4: the BPF_PROG_LOAD syscall returned Invalid argument \
                 (os error 22). Verifier output: ; #[cgroup_sock_addr(bind4)]\n0: (bf) r6 = r1\n\
                 235: (85) call bpf_getsockopt#57\nunknown func bpf_getsockopt#57\n\
                 verification time 1530 usec\nstack depth 96+0\nprocessed 93 insns\n: Invalid argument";
        assert_eq!(
            super::verifier_reason(e),
            "loading cgroup/bind4: the BPF_PROG_LOAD syscall returned Invalid argument (os error 22). verifier: unknown func bpf_getsockopt#57"
        );
        assert_eq!(super::verifier_reason("no log"), "no log");
    }
}
