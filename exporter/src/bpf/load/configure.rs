//! Step 2 of [`super::load`]: aya's loader configured with the settings, the plan's map sizes
//! and the pin paths, and the object loaded (maps made or reused from the pins; programs are
//! loaded when their probe attaches).

use anyhow::Context as _;
use aya::{Btf, Ebpf, EbpfLoader};

use super::Settings;
use crate::bpf::{LoadPlan, OBJECT, pins, sys};
use crate::kernel::KernelInfo;

/// Loads the object with `settings` and `plan` (and, with pins, each persistent map at its
/// pin path: an existing pin is reused, a missing one created and pinned).
pub fn object(
    btf: &Btf,
    settings: &Settings,
    plan: &LoadPlan,
    pins: Option<&pins::PinDir>,
) -> anyhow::Result<Ebpf> {
    let mut loader = EbpfLoader::new();
    loader
        .btf(Some(btf))
        .override_global("CONFIG", &settings.config, true)
        .override_global("COMPAT", &settings.compat, true)
        .override_global("AYA_LOG_LEVEL", &settings.log_level, false);
    for (name, bytes) in plan.globals() {
        loader.override_global(name, bytes, true);
    }
    for (name, size) in plan.sizes() {
        loader.map_max_entries(name, size);
    }
    let map_paths: Vec<(String, std::path::PathBuf)> = match pins {
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
    loader
        .load(OBJECT)
        .map_err(name_seccomp)
        .context("loading the BPF object (maps) failed")
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
pub(super) fn aya_log_level(level: tracing::Level) -> u8 {
    match level {
        tracing::Level::ERROR => 1,
        tracing::Level::WARN => 2,
        tracing::Level::INFO => 3,
        tracing::Level::DEBUG => 4,
        tracing::Level::TRACE => 5,
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
pub(super) fn fast_path_config(kernel: &KernelInfo) -> bufscope_common::Config {
    let mut c = kernel.config;
    c.ringbuf_wakeup_bytes = RINGBUF_WAKEUP_BYTES;
    c.sk_ino = match kernel.btf.member("sock", "sk_ino") {
        // `unsigned long`: the probe loads exactly 8 bytes.
        Ok(m) if !m.bitfield && m.bits == 64 => m.byte_offset(),
        _ => 0,
    };
    c
}
