//! `bufscope check`: a preflight that prints, probe by probe, what this kernel supports.

use std::collections::HashSet;
use std::path::Path;

use crate::cli::CheckArgs;
use crate::kernel::{self, KernelInfo, caps};
use crate::probes::{self, Hook, MapSizes};

fn line(ok: bool, what: &str, detail: &str) {
    let tag = if ok { " ok " } else { "FAIL" };
    println!("[{tag}] {what:<22} {detail}");
}

fn warn(what: &str, detail: &str) {
    println!("[warn] {what:<22} {detail}");
}

/// True when the hook's tracepoint exists on this kernel (without loading anything).
fn hook_exists(hook: &Hook, kinfo: Option<&KernelInfo>, tracefs: Option<&Path>) -> bool {
    match hook {
        Hook::Tracepoint { category, name, .. } => {
            tracefs.is_some_and(|t| t.join("events").join(category).join(name).is_dir())
        }
        Hook::BtfTracepoint { name, .. } => kinfo.is_some_and(|k| k.btf.has_btf_tracepoint(name)),
        Hook::CgroupSetsockopt { .. } | Hook::CgroupSockCreate { .. } => {
            kernel::cgroup2_root().is_some()
        }
    }
}

/// Runs the checks; returns the process exit code (non-zero when no drop probe can attach).
pub fn run(args: &CheckArgs) -> i32 {
    if let Err(e) = args.kernel.validate() {
        eprintln!("bufscope: error: {e:#}");
        return 2;
    }
    println!(
        "bufscope {} preflight on Linux {}",
        env!("CARGO_PKG_VERSION"),
        kernel::kernel_release()
    );

    let missing = caps::missing_for_probes();
    for cap in [caps::CAP_BPF, caps::CAP_PERFMON] {
        let ok = caps::has(cap) || caps::has(caps::CAP_SYS_ADMIN);
        line(
            ok,
            cap.name,
            if ok { cap.why } else { "missing: needed to " }
                .to_owned()
                .as_str(),
        );
        if !ok {
            println!(
                "       {:<22} grant it, or run as root: needed to {}",
                "", cap.why
            );
        }
    }
    for cap in [caps::CAP_SYS_PTRACE, caps::CAP_DAC_READ_SEARCH] {
        if !caps::has(cap) {
            warn(cap.name, &format!("missing: cannot {}", cap.why));
        } else {
            line(true, cap.name, cap.why);
        }
    }

    let kinfo = match KernelInfo::load(&args.kernel.btf_path, &args.kernel.reasons) {
        Ok(k) => {
            let tracked: Vec<String> = k
                .tracked_reasons
                .iter()
                .map(|r| format!("{}={r}", k.reasons.name(*r)))
                .collect();
            line(
                true,
                "kernel BTF",
                &format!(
                    "{} ({} drop reasons; counting {})",
                    args.kernel.btf_path.display(),
                    k.reasons.len(),
                    tracked.join(" ")
                ),
            );
            Some(k)
        }
        Err(e) => {
            line(false, "kernel BTF", &format!("{e:#}"));
            None
        }
    };
    let tracefs = match kernel::ensure_tracefs() {
        Ok(p) => {
            line(true, "tracefs", &p.display().to_string());
            Some(p)
        }
        Err(e) => {
            line(false, "tracefs", &format!("{e:#}"));
            None
        }
    };
    match kernel::cgroup2_root() {
        Some(p) => line(
            true,
            "cgroup2",
            &format!(
                "{} (cgroup/setsockopt and cgroup/sock_create attach at its root)",
                p.display()
            ),
        ),
        None => warn(
            "cgroup2",
            "not mounted: setsockopt and owners fall back to syscall tracepoints (every \
             syscall on the node then pays for them)",
        ),
    }

    println!("probes:");
    let mut attach_results: Vec<probes::ProbeStatus> = Vec::new();
    if !args.no_attach
        && missing.is_empty()
        && let Some(k) = kinfo.as_ref()
    {
        let disabled: HashSet<String> = args.kernel.disable.iter().cloned().collect();
        match probes::load(
            k,
            &args.kernel.btf_path,
            &disabled,
            MapSizes::default(),
            tracing::Level::WARN,
        ) {
            Ok(p) => attach_results = p.status.clone(),
            Err(e) => println!("       loading the BPF object failed: {e:#}"),
        }
    }
    let mut drop_probe_ok = false;
    for spec in crate::signals::PROBES {
        // The variant that attached, else the first whose hooks all exist here.
        let present = spec.variants.iter().position(|v| {
            v.iter()
                .all(|h| hook_exists(h, kinfo.as_ref(), tracefs.as_deref()))
        });
        let attached = attach_results.iter().find(|s| s.spec.name == spec.name);
        let variant = match attached {
            Some(s) if s.attached => s.variant,
            _ => present.unwrap_or(0),
        };
        let hooks = probes::describe(spec.variants.get(variant).copied().unwrap_or_default());
        let (ok, detail) = match attached {
            Some(s) if s.attached && s.variant == 0 => (true, "attached".to_string()),
            Some(s) if s.attached => (
                true,
                format!(
                    "attached through a fallback ({})",
                    s.error.as_deref().unwrap_or("")
                ),
            ),
            Some(s) => (
                false,
                s.error.clone().unwrap_or_else(|| "not attached".into()),
            ),
            None if present.is_some() => (
                true,
                "hooks present (not attached: --no-attach or missing privileges)".into(),
            ),
            None => (false, "hook missing on this kernel".into()),
        };
        if spec.is_drop_probe && ok {
            drop_probe_ok = true;
        }
        line(ok, spec.name, &format!("{hooks} — {}: {detail}", spec.what));
    }
    if !missing.is_empty() {
        let names: Vec<&str> = missing.iter().map(|c| c.name).collect();
        println!(
            "missing capabilities {}: run as root or grant them",
            names.join(", ")
        );
        return 1;
    }
    if drop_probe_ok {
        0
    } else {
        println!(
            "no drop probe can attach: bufscope cannot count buffer-full drops on this kernel"
        );
        1
    }
}
