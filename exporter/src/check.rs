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
    let cgroup2 = std::fs::read_to_string("/proc/mounts").ok().and_then(|m| {
        m.lines()
            .find(|l| l.split_whitespace().nth(2) == Some("cgroup2"))
            .and_then(|l| l.split_whitespace().nth(1).map(String::from))
    });
    match cgroup2 {
        Some(p) => line(
            true,
            "cgroup2",
            &format!("{p} (container ids come from /proc/<pid>/cgroup)"),
        ),
        None => warn(
            "cgroup2",
            "not mounted (container ids still come from /proc/<pid>/cgroup)",
        ),
    }

    println!("probes:");
    let mut attach_results: Vec<(String, bool, Option<String>)> = Vec::new();
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
            Ok(p) => {
                attach_results = p
                    .status
                    .iter()
                    .map(|s| (s.spec.name.to_string(), s.attached, s.error.clone()))
                    .collect()
            }
            Err(e) => println!("       loading the BPF object failed: {e:#}"),
        }
    }
    let mut drop_probe_ok = false;
    for spec in crate::signals::PROBES {
        let hooks: Vec<String> = spec.hooks.iter().map(Hook::describe).collect();
        let exists = spec
            .hooks
            .iter()
            .all(|h| hook_exists(h, kinfo.as_ref(), tracefs.as_deref()));
        let attached = attach_results.iter().find(|(n, _, _)| n == spec.name);
        let (ok, detail) = match attached {
            Some((_, true, _)) => (true, "attached".to_string()),
            Some((_, false, Some(e))) => (false, e.clone()),
            Some((_, false, None)) => (false, "not attached".into()),
            None if exists => (
                true,
                "hooks present (not attached: --no-attach or missing privileges)".into(),
            ),
            None => (false, "hook missing on this kernel".into()),
        };
        if spec.is_drop_probe && ok {
            drop_probe_ok = true;
        }
        line(
            ok,
            spec.name,
            &format!("{} — {}: {detail}", hooks.join(" + "), spec.what),
        );
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
