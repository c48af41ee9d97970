//! `bufscope check`: a preflight that prints, probe by probe, what this kernel supports. It is
//! a list of small checks ([`ONLINE`], [`OFFLINE`]), each reading what the earlier ones found;
//! the probe lines come from the loader's own report (it loads and attaches exactly as
//! `bufscope run` would, acting on nothing) or, offline, from the same BTF-based choice.

use std::path::{Path, PathBuf};

use crate::bpf::{self, Hook, LoadPlan, ProbeSpec, ProbeStatus, Purpose};
use crate::cli::CheckArgs;
use crate::kernel::{self, KernelInfo, caps};
use crate::signals;

fn line(ok: bool, what: &str, detail: &str) {
    let tag = if ok { " ok " } else { "FAIL" };
    println!("[{tag}] {what:<22} {detail}");
}

fn warn(what: &str, detail: &str) {
    println!("[warn] {what:<22} {detail}");
}

fn note(detail: &str) {
    println!("       {:<22} {detail}", "");
}

/// What the checks share.
struct CheckCx<'a> {
    args: &'a CheckArgs,
    /// The kernel's layout (None: its BTF is unreadable).
    kinfo: Option<KernelInfo>,
    /// tracefs (None: not mounted and cannot be).
    tracefs: Option<PathBuf>,
    /// Capabilities the probes need and this process lacks.
    missing: Vec<caps::Cap>,
    /// The loader's report (empty: nothing was loaded).
    report: Vec<ProbeStatus>,
    /// Some drop probe attached (or is usable).
    drop_probe_ok: bool,
}

/// A check: prints its lines.
type Check = fn(&mut CheckCx<'_>);

/// The checks on this machine, in order.
const ONLINE: &[Check] = &[
    capabilities,
    kernel_btf,
    tracefs,
    cgroup2,
    room_lines,
    load,
    probes,
    pins,
];

/// The checks of another kernel from its BTF (`--btf`): nothing is loaded.
const OFFLINE: &[Check] = &[kernel_btf_offline, room_lines, probes_offline];

fn capabilities(cx: &mut CheckCx<'_>) {
    cx.missing = caps::missing_for_probes();
    for cap in [caps::CAP_BPF, caps::CAP_PERFMON] {
        let ok = caps::has(cap) || caps::has(caps::CAP_SYS_ADMIN);
        line(
            ok,
            cap.name,
            if ok { cap.why } else { "missing: needed to " },
        );
        if !ok {
            note(&format!("grant it, or run as root: needed to {}", cap.why));
        }
    }
    for cap in [
        caps::CAP_SYS_PTRACE,
        caps::CAP_DAC_READ_SEARCH,
        caps::CAP_NET_ADMIN,
    ] {
        if caps::has(cap) {
            line(true, cap.name, cap.why);
        } else {
            warn(cap.name, &format!("missing: cannot {}", cap.why));
        }
    }
}

/// `name=number` of each tracked drop reason.
fn tracked(k: &KernelInfo) -> String {
    k.tracked_reasons
        .iter()
        .map(|r| format!("{}={r}", k.reasons.name(*r)))
        .collect::<Vec<_>>()
        .join(" ")
}

fn kernel_btf(cx: &mut CheckCx<'_>) {
    let path = &cx.args.kernel.btf_path;
    match KernelInfo::load(path, &cx.args.kernel.reasons) {
        Ok(k) => {
            line(
                true,
                "kernel BTF",
                &format!(
                    "{} ({} drop reasons; counting {}; {})",
                    path.display(),
                    k.reasons.len(),
                    tracked(&k),
                    kernel::task_access(&k.config)
                ),
            );
            cx.kinfo = Some(k);
        }
        Err(e) => line(false, "kernel BTF", &format!("{e:#}")),
    }
}

fn tracefs(cx: &mut CheckCx<'_>) {
    match kernel::ensure_tracefs() {
        Ok(p) => {
            line(true, "tracefs", &p.display().to_string());
            cx.tracefs = Some(p);
        }
        Err(e) => line(false, "tracefs", &format!("{e:#}")),
    }
}

fn cgroup2(_cx: &mut CheckCx<'_>) {
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
}

/// What the rooms add (optional hooks they can work without).
fn room_lines(cx: &mut CheckCx<'_>) {
    let Some(k) = cx.kinfo.as_ref() else { return };
    for l in signals::checks(&k.btf) {
        if l.ok {
            line(true, l.what, &l.detail);
        } else {
            warn(l.what, &l.detail);
        }
    }
}

/// Loads and attaches every probe as `bufscope run` would (the rooms configure their programs
/// to act on nothing), unless `--no-attach` or privileges are missing.
fn load(cx: &mut CheckCx<'_>) {
    let Some(k) = cx.kinfo.as_ref() else { return };
    if cx.args.no_attach || !cx.missing.is_empty() {
        return;
    }
    let mut plan = LoadPlan::new(
        Purpose::Check,
        &cx.args.kernel.disable,
        tracing::Level::WARN,
    );
    let loaded = signals::Flags::defaults()
        .and_then(|flags| signals::prepare(&flags, &mut plan))
        .and_then(|mut setups| {
            bpf::load(
                k,
                &cx.args.kernel.btf_path,
                signals::PROBES,
                &plan,
                &mut setups,
                None,
            )
        });
    match loaded {
        Ok(p) => cx.report = p.status.clone(),
        Err(e) => println!("       loading the BPF object failed: {e:#}"),
    }
}

/// True when the hook's tracepoint or function exists on this kernel (without loading).
fn hook_exists(hook: &Hook, kinfo: Option<&KernelInfo>, tracefs: Option<&Path>) -> bool {
    match hook {
        Hook::Tracepoint { category, name, .. } => {
            tracefs.is_some_and(|t| t.join("events").join(category).join(name).is_dir())
        }
        h if h.needs_cgroup2() => kernel::cgroup2_root().is_some(),
        Hook::Procfs { file } => Path::new("/proc/self").join(file).exists(),
        h => kinfo.is_some_and(|k| bpf::usable(std::slice::from_ref(h), &k.btf).is_ok()),
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

/// One probe's line from the loader's report (or, without one, whether its hooks exist).
fn probes(cx: &mut CheckCx<'_>) {
    println!("probes:");
    for spec in signals::PROBES {
        let present = spec.variants.iter().position(|v| {
            v.iter()
                .all(|h| hook_exists(h, cx.kinfo.as_ref(), cx.tracefs.as_deref()))
        });
        let attached = bpf::hook::find(&cx.report, spec.name);
        let variant = match attached {
            Some(s) if s.attached => s.variant,
            _ => present.unwrap_or(0),
        };
        let hooks = bpf::describe(spec.variants.get(variant).copied().unwrap_or_default());
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
            cx.drop_probe_ok = true;
        }
        line(ok, spec.name, &format!("{hooks} — {}: {detail}", spec.what));
        for (i, why) in attached.map(|s| s.skipped.as_slice()).unwrap_or_default() {
            let v = spec.variants.get(*i).copied().unwrap_or_default();
            note(&format!(
                "skipped {}: {}",
                bpf::describe(v),
                first_line(why)
            ));
        }
    }
}

/// `--bpf.pin-path`: what is pinned there (by a running or a stopped bufscope).
fn pins(cx: &mut CheckCx<'_>) {
    let Some(dir) = &cx.args.pins.pin_path else {
        return;
    };
    println!("pinned in {}:", dir.display());
    if !dir.exists() {
        println!("       nothing (the directory does not exist)");
        return;
    }
    match bpf::pins::dir::describe(dir) {
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

fn kernel_btf_offline(cx: &mut CheckCx<'_>) {
    let path = cx.args.btf.as_deref().unwrap_or(&cx.args.kernel.btf_path);
    match KernelInfo::load_offline(path, &cx.args.kernel.reasons) {
        Ok(k) => {
            line(
                true,
                "kernel BTF",
                &format!(
                    "struct offsets resolved; {} drop reasons; counting {}; {}",
                    k.reasons.len(),
                    tracked(&k),
                    kernel::task_access(&k.config)
                ),
            );
            cx.kinfo = Some(k);
        }
        Err(e) => line(false, "kernel BTF", &format!("{e:#}")),
    }
}

/// The variant `bufscope run` would try first on that kernel, from its BTF alone.
fn probes_offline(cx: &mut CheckCx<'_>) {
    let Some(k) = cx.kinfo.as_ref() else { return };
    println!("probes:");
    for spec in signals::PROBES {
        let (chosen, notes) = offline_choice(spec, k);
        match chosen {
            Some(i) => {
                cx.drop_probe_ok |= spec.is_drop_probe;
                line(
                    true,
                    spec.name,
                    &format!(
                        "{} — {} (variant {} of {})",
                        bpf::describe(spec.variants[i]),
                        spec.what,
                        i + 1,
                        spec.variants.len()
                    ),
                );
            }
            None => line(false, spec.name, "no variant is usable on this kernel"),
        }
        for n in notes {
            note(&n);
        }
    }
}

/// The first usable variant of `spec` on kernel `k`, and what to say about the others.
fn offline_choice(spec: &ProbeSpec, k: &KernelInfo) -> (Option<usize>, Vec<String>) {
    let mut chosen = None;
    let mut notes = Vec::new();
    for (i, v) in spec.variants.iter().enumerate() {
        match bpf::usable(v, &k.btf) {
            Ok(()) if chosen.is_none() => chosen = Some(i),
            Ok(()) => notes.push(format!("fallback  {}", bpf::describe(v))),
            Err(why) if chosen.is_none() => {
                notes.push(format!("skipped   {}: {why}", bpf::describe(v)))
            }
            Err(_) => {}
        }
    }
    (chosen, notes)
}

/// Runs the checks; returns the process exit code (non-zero when no drop probe can attach or
/// privileges are missing).
pub fn run(args: &CheckArgs) -> i32 {
    if args.list {
        return list::print(args.json);
    }
    if let Err(e) = args.kernel.validate() {
        // A value clap accepted but that cannot be used: 1, as for `run` (clap's usage
        // errors are 2).
        eprintln!("bufscope: error: {e:#}");
        return 1;
    }
    let mut cx = CheckCx {
        args,
        kinfo: None,
        tracefs: None,
        missing: Vec::new(),
        report: Vec::new(),
        drop_probe_ok: false,
    };
    if let Some(path) = &args.btf {
        println!(
            "bufscope {} offline check of {}\n(nothing is loaded: whether the kernel allows fentry/fexit, and its verifier, are decided\non the kernel itself, where a refused variant falls back to the next usable one)",
            env!("CARGO_PKG_VERSION"),
            path.display()
        );
        for check in OFFLINE {
            check(&mut cx);
        }
        if cx.drop_probe_ok {
            return 0;
        }
        if cx.kinfo.is_some() {
            println!("no drop probe can attach on that kernel");
        }
        return 1;
    }
    println!(
        "bufscope {} preflight on Linux {}",
        env!("CARGO_PKG_VERSION"),
        kernel::kernel_release()
    );
    for check in ONLINE {
        check(&mut cx);
    }
    if !cx.missing.is_empty() {
        let names: Vec<&str> = cx.missing.iter().map(|c| c.name).collect();
        println!(
            "missing capabilities {}: run as root or grant them",
            names.join(", ")
        );
        return 1;
    }
    if cx.drop_probe_ok {
        0
    } else {
        println!(
            "no drop probe can attach: bufscope cannot count buffer-full drops on this kernel"
        );
        1
    }
}

/// `bufscope check --list`: what this build has, from the registry itself (the `signals!`
/// list and the status page's row type), so tests and docs take their lists from here.
mod list {
    use serde_json::{Value, json};

    use crate::bpf::{LoadPlan, Purpose};
    use crate::signals;

    /// The listing as one JSON document: `probes` (name, what, default, variants as hook
    /// lists, best first) and `status_columns` (the keys of a status-page row).
    pub fn document() -> Value {
        let default = default_plan();
        let probes: Vec<Value> = signals::PROBES
            .iter()
            .map(|p| {
                json!({
                    "name": p.name,
                    "what": p.what,
                    "default": default.as_ref().is_some_and(|plan| plan.off(p.name).is_none()),
                    "drop_probe": p.is_drop_probe,
                    "attributed": p.attributed,
                    "variants": p.variants.iter().map(|v| {
                        v.iter().map(crate::bpf::Hook::describe).collect::<Vec<_>>()
                    }).collect::<Vec<_>>(),
                })
            })
            .collect();
        let columns: Vec<String> = match serde_json::to_value(bufscope_api::ProcessRow::default()) {
            Ok(Value::Object(m)) => m.keys().cloned().collect(),
            _ => Vec::new(),
        };
        json!({ "probes": probes, "status_columns": columns })
    }

    /// The plan of `bufscope run` with every flag at its default (what each room leaves off
    /// unless asked). Only flags are read: nothing is loaded or changed.
    fn default_plan() -> Option<LoadPlan> {
        use clap::Parser as _;
        let cli = crate::cli::Cli::try_parse_from(["bufscope", "run"]).ok()?;
        let crate::cli::Command::Run(args) = cli.cmd else {
            return None;
        };
        let mut plan = LoadPlan::new(Purpose::Run, &[], tracing::Level::INFO);
        signals::prepare(&args.signals, &mut plan).ok()?;
        Some(plan)
    }

    /// Prints the listing (text or JSON); 0.
    pub fn print(json: bool) -> i32 {
        let doc = document();
        if json {
            println!("{doc}");
            return 0;
        }
        for p in doc["probes"].as_array().into_iter().flatten() {
            let off = if p["default"] == true {
                ""
            } else {
                " (off by default)"
            };
            println!(
                "probe {}{off}: {}",
                p["name"].as_str().unwrap_or(""),
                p["what"].as_str().unwrap_or("")
            );
            for v in p["variants"].as_array().into_iter().flatten() {
                let hooks: Vec<&str> = v
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                println!("  {}", hooks.join(" + "));
            }
        }
        let cols: Vec<&str> = doc["status_columns"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        println!("status columns: {}", cols.join(", "));
        0
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn lists_every_probe_of_the_registry_with_its_default() {
            let d = document();
            let names: Vec<&str> = d["probes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["name"].as_str())
                .collect();
            let want: Vec<&str> = signals::PROBES.iter().map(|p| p.name).collect();
            assert_eq!(names, want);
            // The guard is configuration: off unless --guard.mode says otherwise.
            let default = |n: &str| {
                d["probes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|p| p["name"] == n)
                    .map(|p| p["default"].clone())
            };
            assert_eq!(default("guard"), Some(Value::Bool(false)));
            assert_eq!(default("drops"), Some(Value::Bool(true)));
            let cols = d["status_columns"].as_array().map(Vec::len).unwrap_or(0);
            assert!(cols > 5, "{d}");
        }

        /// The probe tables of the docs (README's "How it works", the variants of
        /// docs/architecture.md) have a row for every probe of the registry.
        #[test]
        fn every_doc_table_of_probes_has_every_probe() {
            let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            for doc in ["README.md", "docs/architecture.md"] {
                let text = std::fs::read_to_string(root.join(doc)).unwrap_or_default();
                // The table is the run of `|` lines around its first row of a probe.
                let lines: Vec<&str> = text.lines().collect();
                let first = signals::PROBES[0].name;
                let row = |l: &str, name: &str| l.starts_with(&format!("| `{name}`"));
                let Some(at) = lines.iter().position(|l| row(l, first)) else {
                    panic!("{doc}: no probe table (no row for `{first}`)");
                };
                let start = lines[..at]
                    .iter()
                    .rposition(|l| !l.starts_with('|'))
                    .map_or(0, |i| i + 1);
                let end = lines[at..]
                    .iter()
                    .position(|l| !l.starts_with('|'))
                    .map_or(lines.len(), |i| at + i);
                let table = &lines[start..end];
                for p in signals::PROBES {
                    assert!(
                        table.iter().any(|l| row(l, p.name)),
                        "{doc}: the probe table has no row for `{}`",
                        p.name
                    );
                }
            }
        }
    }
}
