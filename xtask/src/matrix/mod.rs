//! `cargo xtask matrix`: the kernel-matrix stage of `cargo xtask test`. Boots each pinned guest
//! kernel (`kernels.pin`: Debian 11's 5.10, Debian 12's 6.1 and bookworm-backports' 6.12) under
//! QEMU (TCG: these VMs have no usable KVM) with virtme-ng, the host's root filesystem shared read-only, and runs
//! an integration subset inside the guest against the guest kernel's own counters:
//!
//! - `bufscope check` in the guest, and `bufscope check --btf <the guest's BTF>` on the host:
//!   the offline choice must name the hooks the guest really attached;
//! - UDP drops exact vs `/proc/<pid>/net/udp{,6}` (receiver started before and after bufscope,
//!   another netns, IPv6), also with the best drop hook refused;
//! - TCP locks and window scale vs `ss -tni`; setsockopt clamp, `SO_RCVBUFFORCE`, EPERM;
//! - autotuning vs an independent bpftrace count, also with fentry/fexit refused;
//! - kernel WireGuard's queue drops vs what the module lost (a flood through a tunnel between
//!   two namespaces: the receiver's veth rx − its wg device's rx).
//!
//! One guest at a time (TCG is CPU-heavy on 2 cores), 2 GiB and 2 vCPUs as measured.

mod guest;
mod kernels;
mod script;
mod setup;
mod steps;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::util::{is_root, workspace_root};

pub use guest::run_in_guest;
use guest::{GuestRun, boot};
use script::guest_script;
pub use setup::setup;
use steps::{selected_steps, test_binaries};

/// The exporter the guests run: the static release binary `cargo xtask dist` ships (what
/// users run). A guest reads its binaries over its 9p root filesystem under TCG: the debug
/// build (168 MiB) took 14.4 s from `bufscope run` to serving in a 6.1 guest, this one
/// (13 MiB) 7.7 s.
const BUFSCOPE: &str = "target/x86_64-unknown-linux-musl/release/bufscope";

/// Longest a guest may take (boot plus every step) before it is stopped and fails: beside
/// `cargo xtask test`'s host stage a guest gets only the CPU time the host tests leave.
const GUEST_TIMEOUT: Duration = Duration::from_secs(14 * 60);

/// Arguments of `cargo xtask matrix`.
#[derive(clap::Args, Default)]
pub struct Args {
    /// Only these kernels (names from kernels.pin, e.g. `6.1`); repeatable.
    #[arg(long = "kernel")]
    pub kernels: Vec<String>,
    /// Only the guest steps whose name contains this text (case-insensitive, e.g. `check`
    /// or `UDP drops`); repeatable. The guest's own `bufscope check` always runs.
    #[arg(long = "step")]
    pub steps: Vec<String>,
    /// Rewrite kernels.pin with the newest image each pinned meta package depends on, then
    /// exit (commit it with the matrix's new figures).
    #[arg(long)]
    pub bump: bool,
    /// Only fetch and cache what the matrix needs (what `cargo xtask setup` does).
    #[arg(long)]
    pub setup_only: bool,
    /// Use the binaries already built (skip setup and `cargo build`).
    #[arg(long)]
    pub no_build: bool,
}

/// `cargo xtask matrix`.
pub fn run(a: &Args) -> anyhow::Result<()> {
    if a.bump {
        return kernels::bump();
    }
    if !is_root() {
        bail!("cargo xtask matrix boots guests that load BPF programs: run it as root");
    }
    check_filters(&a.kernels, &a.steps)?;
    if !a.no_build {
        // The guests run the host's tools (its root filesystem, read-only).
        crate::toolchain::ensure()?;
        crate::packages::ensure()?;
        // The musl target and tools of the static binary the guests run.
        crate::dist::setup()?;
        setup()?;
        if a.setup_only {
            return Ok(());
        }
        crate::build::build(false)?;
    }
    let out = stage(&a.kernels, &a.steps, Priority::Normal)?;
    if out.failures.is_empty() {
        Ok(())
    } else {
        bail!("kernel matrix: {} failure(s)", out.failures.len())
    }
}

/// The pinned kernels `only` names (all when empty); an error naming the pinned ones when it
/// names one that is not pinned.
fn selected_pins(only: &[String]) -> anyhow::Result<Vec<kernels::Pin>> {
    let pins = kernels::pins()?;
    if let Some(bad) = only.iter().find(|k| !pins.iter().any(|p| &p.name == *k)) {
        let names: Vec<&str> = pins.iter().map(|p| p.name.as_str()).collect();
        bail!(
            "no pinned kernel {bad:?} (--kernel): use one of {}",
            names.join(", ")
        );
    }
    Ok(pins
        .into_iter()
        .filter(|p| only.is_empty() || only.contains(&p.name))
        .collect())
}

/// Checks `--kernel` and `--step` before anything runs.
pub fn check_filters(kernels: &[String], steps: &[String]) -> anyhow::Result<()> {
    selected_pins(kernels)?;
    selected_steps(steps)?;
    Ok(())
}

/// One guest step of one kernel, for `cargo xtask test`'s summary.
pub struct StepResult {
    /// The kernel's name in kernels.pin.
    pub kernel: String,
    /// The step's name.
    pub name: String,
    /// Tests passed, failed and ignored (a skipped step counts as one ignored test; a step
    /// that printed no result counts from its exit code).
    pub passed: u32,
    /// See `passed`.
    pub failed: u32,
    /// See `passed`.
    pub ignored: u32,
    /// Seconds the step took in the guest.
    pub secs: u64,
}

/// What the matrix stage found.
pub struct Outcome {
    /// Every step that reported, kernel by kernel.
    pub steps: Vec<StepResult>,
    /// Each failure and the command that reruns just it.
    pub failures: Vec<(String, String)>,
    /// Wall seconds per kernel (boot included).
    pub kernel_secs: Vec<(String, u64)>,
}

/// `cargo xtask matrix` for one kernel and, when given, one step.
fn rerun(kernel: &str, step: Option<&str>) -> String {
    let mut c = format!("cargo xtask matrix --kernel {kernel}");
    if let Some(s) = step {
        c.push_str(&format!(" --step {}", crate::util::shell_word(s)));
    }
    c
}

/// `probe → hooks` from `bufscope check` output (online `a + b` or offline `a,b` forms).
fn chosen_hooks(text: &str) -> Vec<(String, String)> {
    bufscope_testkit::check_probes(text)
        .into_iter()
        .map(|c| (c.probe, c.hooks))
        .collect()
}

/// Where a run writes the script its guests execute and the copies of what they run: inside
/// this checkout's `target/`, one directory per process, so that two runs at once never run
/// each other's script (and binaries) — two checkouts, or `cargo xtask test`'s matrix beside
/// its host stage's `xtask::matrix_log` test, whose stand-in guests rewrote the script a real
/// 6.12 guest was reading (it ended after its first step).
fn run_dir() -> PathBuf {
    workspace_root()
        .join("target/matrix-run")
        .join(std::process::id().to_string())
}

/// Removes a run's directory (its copies of the binaries are large) when dropped.
struct RunDir(PathBuf);

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How a guest's QEMU is scheduled on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// Like any process (`cargo xtask matrix`).
    Normal,
    /// `SCHED_IDLE`: only on CPU time no other process wants, so that `cargo xtask test` can
    /// run the guests beside its host stage without bending the host tests' timing (the
    /// WAN emulator's delay, throughput floors): those mostly wait on the network and leave a
    /// core idle, which the guests (CPU-bound under TCG) take instead of running after them.
    Background,
}

/// Runs the matrix for `kernels` (all pinned kernels when empty) and the guest steps `steps`
/// select (all when empty; see `--step`), the guests scheduled at `priority`; the outcome
/// lists every failure, each with the command that reruns it.
pub fn stage(kernels: &[String], steps: &[String], priority: Priority) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    setup()?;
    let pins = selected_pins(kernels)?;
    let selected = selected_steps(steps)?;
    let bins = test_binaries(&selected)?;
    let dir = run_dir();
    std::fs::create_dir_all(&dir)?;
    let _cleanup = RunDir(dir.clone());
    // The static binary of `cargo xtask dist`: the exporter every step runs (a no-op when
    // it is up to date).
    crate::dist::build_static(crate::dist::Arch::X86_64)?;
    let built = workspace_root().join(BUFSCOPE);
    if !built.exists() {
        bail!(
            "{} is not built: `cargo xtask build` (or drop --no-build)",
            built.display()
        );
    }
    let (bins, bufscope) = snapshot(&dir.join("bin"), &bins, &built)?;
    let script = dir.join("guest.sh");
    std::fs::write(&script, guest_script(&bins, &bufscope, &selected)?)?;
    let mut out = Outcome {
        steps: Vec::new(),
        failures: Vec::new(),
        kernel_secs: Vec::new(),
    };
    let mut report = Vec::new();
    for pin in &pins {
        let name = &pin.name;
        let k = kernels::ensure(pin)?;
        let offline = offline_choice(&bufscope, &k)?;
        let t = Instant::now();
        let run = match boot(&k, &script, GUEST_TIMEOUT, priority) {
            Ok(r) => r,
            Err(e) => {
                out.failures
                    .push((format!("[{name}] {e:#}"), rerun(name, None)));
                out.kernel_secs.push((name.clone(), t.elapsed().as_secs()));
                continue;
            }
        };
        let wall = t.elapsed().as_secs();
        let online = judge(name, &run, &offline, selected.len(), &mut out);
        out.kernel_secs.push((name.clone(), wall));
        report.push((pin.clone(), run, online, wall));
    }
    print_report(started, &report, &out, selected.len());
    Ok(out)
}

/// Copies what the guests run — the steps' test binaries, the workload helper beside them and
/// the static `bufscope` — into `into` (`deps/` for the test binaries, so that the tests find
/// `bufscope-workload` one level up as they do in `target/debug`), and returns the copies'
/// paths. Beside `cargo xtask test`'s host stage the originals are rebuilt or rewritten while
/// a guest runs them over 9p (the doc tests relink `target/debug` binaries, the release
/// artifacts' test strips the static binary): a guest's `bufscope-workload` died of SIGSEGV
/// and others vanished before their READY line, in the 6.12 guest, at the doc tests.
fn snapshot(
    into: &Path,
    bins: &[(String, PathBuf)],
    bufscope: &Path,
) -> anyhow::Result<(Vec<(String, PathBuf)>, PathBuf)> {
    let _ = std::fs::remove_dir_all(into);
    let deps = into.join("deps");
    std::fs::create_dir_all(&deps).with_context(|| format!("creating {}", deps.display()))?;
    let copy = |from: &Path, to: PathBuf| -> anyhow::Result<PathBuf> {
        std::fs::copy(from, &to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        Ok(to)
    };
    let mut out = Vec::new();
    let mut workload = None;
    for (name, exe) in bins {
        let file = exe
            .file_name()
            .context("a test binary without a file name")?;
        out.push((name.clone(), copy(exe, deps.join(file))?));
        // target/debug/deps/<test> → target/debug/bufscope-workload
        workload = exe
            .parent()
            .and_then(Path::parent)
            .map(|d| d.join("bufscope-workload"));
    }
    if let Some(w) = workload.filter(|w| w.exists()) {
        copy(&w, into.join("bufscope-workload"))?;
    }
    let bufscope = copy(bufscope, into.join("bufscope"))?;
    Ok((out, bufscope))
}

/// The hooks `bufscope check --btf` chooses on the host from the guest kernel's BTF (printed).
fn offline_choice(bufscope: &Path, k: &kernels::Kernel) -> anyhow::Result<Vec<(String, String)>> {
    let off = Command::new(bufscope)
        .arg("check")
        .arg("--btf")
        .arg(&k.btf)
        .env("NO_COLOR", "1")
        .output()
        .context("bufscope check --btf")?;
    let off_text = String::from_utf8_lossy(&off.stdout).into_owned();
    println!(
        "[{}] host: bufscope check --btf {}:\n{off_text}",
        k.pin.name,
        k.btf.display()
    );
    Ok(chosen_hooks(&off_text))
}

/// Adds what one guest run of kernel `name` got wrong to `out.failures` (each with its rerun)
/// and its steps to `out.steps`; returns the hooks the guest attached.
fn judge(
    name: &str,
    run: &GuestRun,
    offline: &[(String, String)],
    selected: usize,
    out: &mut Outcome,
) -> Vec<(String, String)> {
    let mut fail = |what: String, step: Option<&str>| {
        out.failures
            .push((format!("[{name}] {what}"), rerun(name, step)));
    };
    if !run.ended {
        fail("the guest stopped before the end".into(), None);
    }
    if run.check_rc != Some(0) {
        fail(format!("bufscope check exited {:?}", run.check_rc), None);
    }
    let online = chosen_hooks(&run.check.join("\n"));
    let failed: Vec<String> = bufscope_testkit::check_probes(&run.check.join("\n"))
        .into_iter()
        .filter(|c| !c.ok)
        .map(|c| c.probe)
        .collect();
    for (probe, hooks) in &online {
        match offline.iter().find(|(p, _)| p == probe) {
            Some((_, off)) if off == hooks => {}
            // Offline: "no variant is usable on this kernel"; the guest agrees when it could
            // not attach it either (it names the variant it passed over).
            Some((_, off)) if off == "no" && failed.contains(probe) => {}
            Some((_, off)) => fail(
                format!("{probe}: check --btf chose {off}, the guest attached {hooks}"),
                None,
            ),
            None => fail(format!("check --btf has no {probe}"), None),
        }
    }
    if online.len() < 5 {
        fail(
            format!("bufscope check listed {} probes", online.len()),
            None,
        );
    }
    let steps = run.guest_steps();
    for st in &steps {
        if st.rc != 0 {
            let tests = if st.tests.failed.is_empty() {
                String::new()
            } else {
                format!(": {}", st.tests.failed.join(", "))
            };
            fail(
                format!("step '{}' failed (exit {}){tests}", st.name, st.rc),
                Some(&st.name),
            );
        }
    }
    if run.steps.len() != selected {
        fail(
            format!("{} of {} steps ran", run.steps.len(), selected),
            None,
        );
    }
    for st in &steps {
        let (passed, failed, ignored) = match (&st.tests.counts, st.tests.skipped, st.rc) {
            (_, true, _) => (0, 0, 1),
            (Some(c), _, rc) => (c.passed, c.failed.max(u32::from(rc != 0)), c.ignored),
            (None, _, 0) => (1, 0, 0),
            (None, _, _) => (0, 1, 0),
        };
        out.steps.push(StepResult {
            kernel: name.to_string(),
            name: st.name.clone(),
            passed,
            failed,
            ignored,
            secs: st.secs,
        });
    }
    online
}

/// One kernel's pin, what its guest reported, the hooks it attached and its wall seconds.
type Report = (kernels::Pin, GuestRun, Vec<(String, String)>, u64);

/// The closing table of the matrix: per kernel, its hooks, each step and the figures.
fn print_report(started: Instant, report: &[Report], out: &Outcome, selected: usize) {
    println!(
        "\n== kernel matrix ({} s in all) ==",
        started.elapsed().as_secs()
    );
    for (pin, run, online, wall) in report {
        println!(
            "{} ({} {}, guest {}): {wall} s wall, {} s inside",
            pin.name, pin.package, pin.version, run.release, run.secs
        );
        for (probe, hooks) in online {
            println!("  {probe:<11} {hooks}");
        }
        for st in run.guest_steps() {
            let tag = if st.rc == 0 { "ok  " } else { "FAIL" };
            let skipped = if st.tests.skipped {
                " (skipped: not the hook in use here)"
            } else {
                ""
            };
            println!("  [{tag}] {:>4} s  {}{skipped}", st.secs, st.name);
        }
        for f in &run.figures {
            println!("  {f}");
        }
    }
    if out.failures.is_empty() {
        println!(
            "kernel matrix: all {} steps passed on {} kernels",
            selected,
            report.len()
        );
    } else {
        for (f, again) in &out.failures {
            eprintln!("kernel matrix FAIL: {f}\n  rerun: {again}");
        }
    }
}
