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
        Hook::CgroupSetsockopt { .. }
        | Hook::CgroupSockCreate { .. }
        | Hook::CgroupSockAddr { .. }
        | Hook::CgroupGetsockopt { .. } => kernel::cgroup2_root().is_some(),
        Hook::BtfTracepointWhere { .. } | Hook::Fentry { .. } | Hook::Fexit { .. } => {
            kinfo.is_some_and(|k| probes::usable(std::slice::from_ref(hook), &k.btf).is_ok())
        }
    }
}

/// `--bpf.pin-path`: what is pinned there (by a running or a stopped bufscope).
fn pinned(dir: &Path) {
    println!("pinned in {}:", dir.display());
    if !dir.exists() {
        println!("       nothing (the directory does not exist)");
        return;
    }
    match probes::pins::describe(dir) {
        Ok((meta, objects)) => {
            match meta {
                Some(m) => println!(
                    "       META: written by bufscope {}, layout {}, maps since {} (unix), links since {}, adopted {} times",
                    m.version(),
                    m.layout_version,
                    m.created_unix,
                    m.attached_unix,
                    m.adoptions
                ),
                None => println!("       no META: not (or not completely) written by bufscope"),
            }
            if objects.is_empty() {
                println!("       no maps or links");
            }
            for o in objects {
                println!("       {:<44} {}", o.path.display(), o.what);
            }
        }
        Err(e) => println!("       unreadable: {e:#}"),
    }
}

/// The first line of an error, shortened (verifier logs are hundreds of lines; `bufscope run`
/// logs them whole).
fn first_line(e: &str) -> String {
    let l = e.lines().next().unwrap_or("");
    if l.chars().count() > 160 {
        format!("{}…", l.chars().take(160).collect::<String>())
    } else {
        l.to_string()
    }
}

/// `bufscope check --btf FILE`: the hook choice for the kernel that BTF describes, made
/// from its BTF alone (what `bufscope run` does first on that kernel, before it loads).
fn offline(btf_path: &Path, args: &CheckArgs) -> i32 {
    println!(
        "bufscope {} offline check of {}\n(nothing is loaded: whether the kernel allows fentry/fexit, and its verifier, are decided\non the kernel itself, where a refused variant falls back to the next usable one)",
        env!("CARGO_PKG_VERSION"),
        btf_path.display()
    );
    let k = match KernelInfo::load_offline(btf_path, &args.kernel.reasons) {
        Ok(k) => k,
        Err(e) => {
            line(false, "kernel BTF", &format!("{e:#}"));
            return 1;
        }
    };
    let tracked: Vec<String> = k
        .tracked_reasons
        .iter()
        .map(|r| format!("{}={r}", k.reasons.name(*r)))
        .collect();
    line(
        true,
        "kernel BTF",
        &format!(
            "struct offsets resolved; {} drop reasons; counting {}; {}",
            k.reasons.len(),
            tracked.join(" "),
            crate::kernel::task_access(&k.config)
        ),
    );
    println!("probes:");
    let mut drop_ok = false;
    for spec in crate::signals::PROBES {
        let mut chosen = None;
        let mut notes = Vec::new();
        for (i, v) in spec.variants.iter().enumerate() {
            match probes::usable(v, &k.btf) {
                Ok(()) if chosen.is_none() => chosen = Some(i),
                Ok(()) => notes.push(format!("fallback  {}", probes::describe(v))),
                Err(why) if chosen.is_none() => {
                    notes.push(format!("skipped   {}: {why}", probes::describe(v)))
                }
                Err(_) => {}
            }
        }
        match chosen {
            Some(i) => {
                if spec.is_drop_probe {
                    drop_ok = true;
                }
                line(
                    true,
                    spec.name,
                    &format!(
                        "{} — {} (variant {} of {})",
                        probes::describe(spec.variants[i]),
                        spec.what,
                        i + 1,
                        spec.variants.len()
                    ),
                );
            }
            None => line(false, spec.name, "no variant is usable on this kernel"),
        }
        for n in notes {
            println!("       {:<22} {n}", "");
        }
    }
    if drop_ok {
        0
    } else {
        println!("no drop probe can attach on that kernel");
        1
    }
}

/// Runs the checks; returns the process exit code (non-zero when no drop probe can attach).
pub fn run(args: &CheckArgs) -> i32 {
    if let Err(e) = args.kernel.validate() {
        eprintln!("bufscope: error: {e:#}");
        return 2;
    }
    if let Some(path) = &args.btf {
        return offline(path, args);
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
    for cap in [
        caps::CAP_SYS_PTRACE,
        caps::CAP_DAC_READ_SEARCH,
        caps::CAP_NET_ADMIN,
    ] {
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
                    "{} ({} drop reasons; counting {}; {})",
                    args.kernel.btf_path.display(),
                    k.reasons.len(),
                    tracked.join(" "),
                    crate::kernel::task_access(&k.config)
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

    if let Some(k) = kinfo.as_ref() {
        match probes::armed::available(&k.btf) {
            Ok(()) => line(
                true,
                "reader hook",
                "tp_btf/sock_recv_length available: attached only while a shared socket drops, \
                 its drops go to the processes that read it",
            ),
            Err(why) => warn(
                "reader hook",
                &format!("unavailable ({why}): a shared socket's drops go to its newest holder"),
            ),
        }
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
            // The guard's hooks attach (observe mode, no rule on: they change nothing).
            &probes::GuardSetup {
                config: bufscope_common::GuardConfig {
                    mode: bufscope_common::guard::MODE_OBSERVE,
                    ..Default::default()
                },
                ..Default::default()
            },
            None,
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
                    "attached (variant {} of {}, the best this kernel allows)",
                    s.variant + 1,
                    spec.variants.len()
                ),
            ),
            Some(s) if s.skipped.is_empty() => (
                false,
                s.error.clone().unwrap_or_else(|| "not attached".into()),
            ),
            Some(_) => (false, "no variant attached".into()),
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
        if let Some(s) = attached {
            for (i, why) in &s.skipped {
                let v = spec.variants.get(*i).copied().unwrap_or_default();
                println!(
                    "       {:<22} skipped {}: {}",
                    "",
                    probes::describe(v),
                    first_line(why)
                );
            }
        }
    }
    if let Some(dir) = &args.pins.pin_path {
        pinned(dir);
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
