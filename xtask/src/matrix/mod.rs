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
//! - autotuning vs an independent bpftrace count, also with fentry/fexit refused.
//!
//! One guest at a time (TCG is CPU-heavy on 2 cores), 2 GiB and 2 vCPUs as measured.

mod kernels;
#[cfg(test)]
mod tests;

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::util::{cargo, is_root, run_cmd, workspace_root};

pub use kernels::cache_dir;

/// virtme-ng, installed in a venv in the cache (measured with this version).
const VIRTME_NG: &str = "virtme-ng==1.42";

/// Debian packages the guests need, and one file each provides: QEMU, what virtme-ng's init
/// uses in the guest (kmod, busybox, udev: without udev the guest's output is lost), and the
/// tools that get BTF out of a kernel image.
const PACKAGES: &[(&str, &str)] = &[
    ("qemu-system-x86", "/usr/bin/qemu-system-x86_64"),
    ("kmod", "/usr/bin/kmod"),
    ("busybox-static", "/bin/busybox"),
    ("udev", "/usr/bin/udevadm"),
    ("binutils", "/usr/bin/objcopy"),
    ("xz-utils", "/usr/bin/xz"),
    ("zstd", "/usr/bin/zstd"),
];

/// The exporter the guests run: the release build (under TCG it starts in half the time of
/// the debug build: 14 vs 36 s for `bufscope check` on 6.1).
const BUFSCOPE: &str = "target/release/bufscope";

/// Longest a guest may take (boot plus every step) before it is stopped and fails.
const GUEST_TIMEOUT: Duration = Duration::from_secs(9 * 60);

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
        crate::setup::run(&crate::setup::Args::default())?;
        if a.setup_only {
            return Ok(());
        }
        crate::build::build(false)?;
    }
    let out = stage(&a.kernels, &a.steps)?;
    if out.failures.is_empty() {
        Ok(())
    } else {
        bail!("kernel matrix: {} failure(s)", out.failures.len())
    }
}

/// What `cargo xtask setup` adds for the matrix: packages, virtme-ng, the pinned kernels.
pub fn setup() -> anyhow::Result<()> {
    let mut missing = crate::setup::missing_packages(PACKAGES);
    // `python3 -m venv` needs ensurepip, which Debian ships in python3-venv.
    let venv_ok = Command::new("python3")
        .args(["-c", "import ensurepip, venv"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !venv_ok {
        missing.push("python3-venv");
    }
    crate::setup::apt_install(&missing, "the kernel matrix needs them: run it as root")?;
    let venv = cache_dir().join("venv");
    if !venv.join("bin/vng").exists() {
        std::fs::create_dir_all(cache_dir())?;
        run_cmd(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
        run_cmd(Command::new(venv.join("bin/pip")).args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            VIRTME_NG,
        ]))
        .context("installing virtme-ng in its venv")?;
    }
    for pin in kernels::pins()? {
        kernels::ensure(&pin)?;
    }
    Ok(())
}

/// One step inside a guest: an integration test binary, its filters, and environment.
struct Step {
    name: &'static str,
    test: &'static str,
    env: &'static str,
    args: &'static [&'static str],
    /// Run only when the guest's `bufscope check` line of this probe names this hook kind
    /// (a fallback test is pointless where the better hook is not the one in use).
    when: Option<(&'static str, &'static str)>,
}

/// The guest subset, in order (each step one exporter start: ≈10–40 s under TCG).
const STEPS: &[Step] = &[
    Step {
        name: "check: hooks vs the kernel's BTF; check --btf; bufscope_probe_attached",
        test: "kernel_matrix",
        env: "",
        args: &["check_names_the_hook"],
        when: None,
    },
    Step {
        name: "UDP drops vs /proc/<pid>/net/udp{,6}: receivers before and after bufscope, v4/v6, netns",
        test: "kernel_matrix",
        env: "",
        args: &["udp_drops_before_and_after"],
        when: None,
    },
    Step {
        name: "UDP drops with --drops.zero-per-packet (no fexit: the tracepoint-only variant)",
        test: "kernel_matrix",
        env: "BUFSCOPE_TEST_ARGS=--drops.zero-per-packet",
        args: &["udp_drops_before_and_after"],
        when: Some(("drops", "fexit/")),
    },
    Step {
        name: "netns drops with --drops.zero-per-packet: exact per namespace, series leave with their namespace",
        test: "kernel_matrix",
        env: "BUFSCOPE_TEST_ARGS=--drops.zero-per-packet",
        args: &["netns_series_leave_with_their_namespace"],
        when: Some(("drops", "fexit/")),
    },
    Step {
        name: "TCP lock + wscale vs ss -tni",
        test: "tcp",
        env: "",
        args: &["wscale_shrink_locks_and_established_match_ss"],
        when: None,
    },
    Step {
        name: "setsockopt clamp / SO_RCVBUFFORCE / EPERM vs errno and getsockopt",
        test: "kernel_matrix",
        env: "",
        args: &["setsockopt_clamp_force_and_eperm"],
        when: None,
    },
    Step {
        name: "autotune vs an independent bpftrace count (best hook and tracepoint fallback)",
        test: "kernel_matrix",
        env: "",
        args: &["autotune_suppressed"],
        when: None,
    },
    Step {
        name: "static binary (cargo xtask dist) alone in an empty root: check passes, same hooks",
        test: "static_binary",
        env: "",
        args: &["static_bufscope_runs_alone_and_check_passes"],
        when: None,
    },
];

/// The steps `filters` select (every step when empty): a step is selected when its name
/// contains one of them, case-insensitively.
fn selected_steps(filters: &[String]) -> anyhow::Result<Vec<&'static Step>> {
    let wanted: Vec<String> = filters.iter().map(|f| f.to_lowercase()).collect();
    let steps: Vec<&Step> = STEPS
        .iter()
        .filter(|s| wanted.is_empty() || wanted.iter().any(|w| s.name.to_lowercase().contains(w)))
        .collect();
    if steps.is_empty() {
        let names: Vec<String> = STEPS.iter().map(|s| format!("'{}'", s.name)).collect();
        bail!(
            "no guest step matches --step {filters:?}: give part of one of {}",
            names.join(", ")
        );
    }
    Ok(steps)
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

/// The integration test binaries the steps run (cargo's JSON: target name → executable).
fn test_binaries(steps: &[&Step]) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let mut tests: Vec<&str> = steps.iter().map(|s| s.test).collect();
    tests.sort_unstable();
    tests.dedup();
    let mut c = cargo();
    c.args([
        "test",
        "-p",
        "bufscope-integration",
        "--no-run",
        "--message-format=json",
    ]);
    for t in &tests {
        c.args(["--test", t]);
    }
    let out = c
        .stderr(Stdio::inherit())
        .output()
        .context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the integration tests failed");
    }
    let mut found = Vec::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        if !l.contains("\"compiler-artifact\"") {
            continue;
        }
        let Some(exe) = json_str(l, "executable") else {
            continue;
        };
        if let Some(t) = tests
            .iter()
            .find(|t| l.contains(&format!("\"name\":\"{t}\"")))
        {
            found.push((t.to_string(), PathBuf::from(exe)));
        }
    }
    for t in &tests {
        if !found.iter().any(|(n, _)| n == t) {
            bail!("cargo built no test binary {t}");
        }
    }
    Ok(found)
}

/// The string value of `"key":"…"` in one line of JSON (cargo's paths have no escapes here).
fn json_str(line: &str, key: &str) -> Option<String> {
    let rest = line.split(&format!("\"{key}\":\"")).nth(1)?;
    Some(rest.split('"').next()?.to_string())
}

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The script the guest runs (the host's filesystem is the guest's, read-only).
fn guest_script(bins: &[(String, PathBuf)], steps: &[&Step]) -> anyhow::Result<String> {
    let root = workspace_root();
    let bufscope = root.join(BUFSCOPE);
    let mut s = format!(
        "#!/bin/sh\n\
         export BUFSCOPE_BIN={} NO_COLOR=1 RUST_BACKTRACE=1 \
         PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n\
         cd {}\n\
         t0=$(date +%s)\n\
         echo \"MATRIX BEGIN $(uname -r)\"\n\
         echo MATRIX CHECK-BEGIN; \"$BUFSCOPE_BIN\" check > /tmp/matrix-check.txt 2>/dev/null; \
         rc=$?; cat /tmp/matrix-check.txt; echo \"MATRIX CHECK-END rc=$rc\"\n\
         step() {{ n=\"$1\"; shift; s=$(date +%s); \"$@\" 2>&1; \
         echo \"MATRIX STEP rc=$? secs=$(( $(date +%s) - s )) name=$n\"; }}\n",
        sh_quote(&bufscope.to_string_lossy()),
        sh_quote(&root.to_string_lossy()),
    );
    for st in steps {
        let exe = &bins
            .iter()
            .find(|(n, _)| n == st.test)
            .context("test binary")?
            .1;
        let mut cmd = vec!["env".to_string()];
        cmd.extend(st.env.split_whitespace().map(sh_quote));
        cmd.push(sh_quote(&exe.to_string_lossy()));
        cmd.extend(["--include-ignored", "--test-threads=1", "--nocapture"].map(String::from));
        cmd.extend(st.args.iter().map(|a| sh_quote(a)));
        let line = format!("step {} {}", sh_quote(st.name), cmd.join(" "));
        match st.when {
            None => s.push_str(&format!("{line}\n")),
            Some((probe, hook)) => s.push_str(&format!(
                "if grep -q {} /tmp/matrix-check.txt; then {line}; else \
                 echo \"MATRIX STEP rc=0 secs=0 skipped=1 name={}\"; fi\n",
                sh_quote(&format!("^\\[ ok \\] {probe} .*{hook}")),
                st.name
            )),
        }
    }
    s.push_str("echo \"MATRIX END secs=$(( $(date +%s) - t0 ))\"\n");
    Ok(s)
}

/// What one guest reported.
#[derive(Default)]
struct GuestRun {
    release: String,
    check: Vec<String>,
    check_rc: Option<i32>,
    /// Each step: name, exit code, seconds.
    steps: Vec<(String, i32, u64)>,
    /// What each step's test binary reported, in the order of `steps`.
    step_tests: Vec<StepTests>,
    figures: Vec<String>,
    ended: bool,
    secs: u64,
}

/// What one step's test binary reported.
#[derive(Clone, Debug, Default)]
struct StepTests {
    /// Not run: the hook it tests is not the one in use on this kernel.
    skipped: bool,
    /// The `test result:` line of the step's test binary, if it printed one.
    counts: Option<crate::libtest::Counts>,
    /// Tests the step's binary reported failed.
    failed: Vec<String>,
}

/// One step as the guest reported it.
struct GuestStep {
    name: String,
    rc: i32,
    secs: u64,
    tests: StepTests,
}

impl GuestRun {
    /// Each step with what its test binary reported.
    fn guest_steps(&self) -> Vec<GuestStep> {
        self.steps
            .iter()
            .enumerate()
            .map(|(i, (name, rc, secs))| GuestStep {
                name: name.clone(),
                rc: *rc,
                secs: *secs,
                tests: self.step_tests.get(i).cloned().unwrap_or_default(),
            })
            .collect()
    }
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

/// A line of the guest's output or of vng's own stderr (the guest's kernel log), in the order
/// they arrived.
enum GuestLine {
    Out(String),
    Err(String),
}

/// Reads `r` line by line (invalid UTF-8 kept as replacement characters) into `tx`.
fn forward(
    r: impl std::io::Read + Send + 'static,
    tx: std::sync::mpsc::Sender<GuestLine>,
    wrap: fn(String) -> GuestLine,
) {
    std::thread::spawn(move || {
        let mut r = std::io::BufReader::new(r);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match std::io::BufRead::read_until(&mut r, b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let l = String::from_utf8_lossy(&buf);
                    let l = l.trim_end_matches(['\n', '\r']).to_string();
                    if tx.send(wrap(l)).is_err() {
                        break;
                    }
                }
            }
        }
    });
}

fn field<'a>(l: &'a str, key: &str) -> Option<&'a str> {
    l.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
}

/// Boots `k` and runs `script` in it, streaming its output with a `[name]` prefix.
///
/// Both of vng's output streams are pipes read here, never this process's own stdout and
/// stderr: QEMU opens `/proc/self/fd/{1,2}` afresh for the guest's consoles, which truncates
/// a regular file there (the log of `cargo xtask test > file` would lose all it held).
fn boot(k: &kernels::Kernel, script: &Path, timeout: Duration) -> anyhow::Result<GuestRun> {
    let venv = cache_dir().join("venv/bin");
    let path = format!(
        "{}:{}",
        venv.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = Command::new(venv.join("vng"))
        .env("PATH", path)
        .args(["--disable-kvm", "-m", "2G", "--cpus", "2", "--run"])
        .arg(&k.vmlinuz)
        .arg("--exec")
        .arg(format!("sh {}", script.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .context("starting vng (cargo xtask setup installs virtme-ng)")?;
    let pgid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    forward(
        child.stdout.take().context("vng stdout")?,
        tx.clone(),
        GuestLine::Out,
    );
    forward(
        child.stderr.take().context("vng stderr")?,
        tx,
        GuestLine::Err,
    );
    let started = Instant::now();
    let mut run = GuestRun::default();
    let mut in_check = false;
    let mut step_output = crate::libtest::Parser::default();
    // When vng has exited: a process it left behind may hold a pipe open, so stop reading
    // once the pipes have been quiet for a few seconds after that.
    let mut exited: Option<Instant> = None;
    loop {
        let left = timeout.saturating_sub(started.elapsed());
        match rx.recv_timeout(left.min(Duration::from_secs(1))) {
            Ok(GuestLine::Err(l)) => eprintln!("[{}] {l}", k.pin.name),
            Ok(GuestLine::Out(l)) => {
                println!("[{}] {l}", k.pin.name);
                if let Some(r) = l.strip_prefix("MATRIX BEGIN ") {
                    run.release = r.trim().to_string();
                } else if l == "MATRIX CHECK-BEGIN" {
                    in_check = true;
                } else if l.starts_with("MATRIX CHECK-END") {
                    in_check = false;
                    run.check_rc = field(&l, "rc").and_then(|x| x.parse().ok());
                } else if in_check {
                    run.check.push(l);
                } else if l.starts_with("MATRIX STEP") {
                    let out = std::mem::take(&mut step_output).binaries.pop();
                    run.steps.push((
                        l.split("name=").nth(1).unwrap_or("").to_string(),
                        field(&l, "rc").and_then(|x| x.parse().ok()).unwrap_or(-1),
                        field(&l, "secs").and_then(|x| x.parse().ok()).unwrap_or(0),
                    ));
                    run.step_tests.push(StepTests {
                        skipped: field(&l, "skipped").is_some(),
                        counts: out.as_ref().and_then(|b| b.counts.clone()),
                        failed: out.map(|b| b.failed).unwrap_or_default(),
                    });
                } else if l.starts_with("MATRIX END") {
                    run.ended = true;
                    run.secs = field(&l, "secs").and_then(|x| x.parse().ok()).unwrap_or(0);
                } else if l.contains("kernel drops column")
                    || l.contains("independent grow count")
                    || l.contains("pid -> (established, shrunk, locks)")
                {
                    step_output.line(&l);
                    run.figures.push(l);
                } else {
                    step_output.line(&l);
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if !left.is_zero() => {
                if exited.is_none() && child.try_wait().is_ok_and(|s| s.is_some()) {
                    exited = Some(Instant::now());
                }
                if exited.is_some_and(|t| t.elapsed() > Duration::from_secs(3)) {
                    break;
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                // SAFETY: signalling the process group we created.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
                let _ = child.wait();
                bail!(
                    "{}: the guest did not finish within {:?}",
                    k.pin.name,
                    timeout
                );
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let status = child.wait();
    if !run.ended {
        eprintln!(
            "xtask matrix: {}: vng exited ({status:?}) before the guest's end",
            k.pin.name
        );
    }
    Ok(run)
}

/// `probe → hooks` from `bufscope check` output (online `a + b` or offline `a,b` forms).
fn chosen_hooks(text: &str) -> Vec<(String, String)> {
    bufscope_testkit::check_probes(text)
        .into_iter()
        .map(|c| (c.probe, c.hooks))
        .collect()
}

/// Where a run writes the script its guests execute: inside this checkout's `target/`, so that
/// two checkouts running the matrix at once never run each other's script (and binaries).
fn run_dir() -> PathBuf {
    workspace_root().join("target/matrix-run")
}

/// Runs the matrix for `kernels` (all pinned kernels when empty) and the guest steps `steps`
/// select (all when empty; see `--step`); the outcome lists every failure, each with the
/// command that reruns it.
pub fn stage(kernels: &[String], steps: &[String]) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    setup()?;
    let pins = selected_pins(kernels)?;
    let selected = selected_steps(steps)?;
    let bins = test_binaries(&selected)?;
    let dir = run_dir();
    std::fs::create_dir_all(&dir)?;
    let script = dir.join("guest.sh");
    std::fs::write(&script, guest_script(&bins, &selected)?)?;
    crate::build::build_packages(true, &["bufscope"])?;
    // The static binary of `cargo xtask dist`, for the step that runs it alone.
    crate::dist::build_static(crate::dist::Arch::X86_64)?;
    let bufscope = workspace_root().join(BUFSCOPE);
    let mut out = Outcome {
        steps: Vec::new(),
        failures: Vec::new(),
        kernel_secs: Vec::new(),
    };
    let mut report = Vec::new();
    for pin in &pins {
        let name = &pin.name;
        let mut fail = |what: String, step: Option<&str>| {
            out.failures
                .push((format!("[{name}] {what}"), rerun(name, step)));
        };
        let k = kernels::ensure(pin)?;
        // Offline choice from the guest's BTF, on the host.
        let off = Command::new(&bufscope)
            .arg("check")
            .arg("--btf")
            .arg(&k.btf)
            .env("NO_COLOR", "1")
            .output()
            .context("bufscope check --btf")?;
        let off_text = String::from_utf8_lossy(&off.stdout).into_owned();
        println!(
            "[{}] host: bufscope check --btf {}:\n{off_text}",
            pin.name,
            k.btf.display()
        );
        let offline = chosen_hooks(&off_text);
        let t = Instant::now();
        let run = match boot(&k, &script, GUEST_TIMEOUT) {
            Ok(r) => r,
            Err(e) => {
                fail(format!("{e:#}"), None);
                out.kernel_secs.push((name.clone(), t.elapsed().as_secs()));
                continue;
            }
        };
        let wall = t.elapsed().as_secs();
        if !run.ended {
            fail("the guest stopped before the end".into(), None);
        }
        if run.check_rc != Some(0) {
            fail(format!("bufscope check exited {:?}", run.check_rc), None);
        }
        let online = chosen_hooks(&run.check.join("\n"));
        for (probe, hooks) in &online {
            match offline.iter().find(|(p, _)| p == probe) {
                Some((_, off)) if off == hooks => {}
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
        if run.steps.len() != selected.len() {
            fail(
                format!("{} of {} steps ran", run.steps.len(), selected.len()),
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
                kernel: name.clone(),
                name: st.name.clone(),
                passed,
                failed,
                ignored,
                secs: st.secs,
            });
        }
        out.kernel_secs.push((name.clone(), wall));
        report.push((pin.clone(), run, online, wall));
    }
    println!(
        "\n== kernel matrix ({} s in all) ==",
        started.elapsed().as_secs()
    );
    for (pin, run, online, wall) in &report {
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
            selected.len(),
            report.len()
        );
    } else {
        for (f, again) in &out.failures {
            eprintln!("kernel matrix FAIL: {f}\n  rerun: {again}");
        }
    }
    Ok(out)
}

/// Boots the pinned kernel `name` (a `kernels.pin` name) and runs the shell line `command` in
/// it from the workspace root, its output echoed with a `[name]` prefix; fails when the guest
/// did not finish within `timeout` or the command failed. The benchmarks use it to measure
/// inside a guest.
pub fn run_in_guest(name: &str, command: &str, timeout: Duration) -> anyhow::Result<()> {
    setup()?;
    let pin = kernels::pins()?
        .into_iter()
        .find(|p| p.name == name)
        .with_context(|| format!("no pinned kernel {name:?} in kernels.pin"))?;
    let k = kernels::ensure(&pin)?;
    let dir = run_dir();
    std::fs::create_dir_all(&dir)?;
    let script = dir.join("guest-command.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n\
             export NO_COLOR=1 RUST_BACKTRACE=1 \
             PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n\
             cd {}\n\
             t0=$(date +%s)\n\
             echo \"MATRIX BEGIN $(uname -r)\"\n\
             {command} 2>&1\n\
             echo \"MATRIX STEP rc=$? secs=$(( $(date +%s) - t0 )) name=command\"\n\
             echo \"MATRIX END secs=$(( $(date +%s) - t0 ))\"\n",
            sh_quote(&workspace_root().to_string_lossy()),
        ),
    )?;
    let run = boot(&k, &script, timeout)?;
    if !run.ended {
        bail!("{name}: the guest stopped before the end");
    }
    match run.steps.first() {
        Some((_, 0, _)) => Ok(()),
        Some((_, rc, _)) => bail!("{name}: the command exited {rc} in the guest"),
        None => bail!("{name}: the command did not run in the guest"),
    }
}
