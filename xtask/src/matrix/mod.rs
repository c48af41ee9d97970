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
    if !a.no_build {
        crate::setup::run(&crate::setup::Args::default())?;
        if a.setup_only {
            return Ok(());
        }
        crate::build::build(false)?;
    }
    stage(&a.kernels)
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
        name: "UDP drops with fexit refused (the tracepoint-only variant)",
        test: "kernel_matrix",
        env: "BUFSCOPE_REFUSE_HOOKS=fexit",
        args: &["udp_drops_before_and_after"],
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
];

/// The integration test binaries the steps run (cargo's JSON: target name → executable).
fn test_binaries() -> anyhow::Result<Vec<(String, PathBuf)>> {
    let mut tests: Vec<&str> = STEPS.iter().map(|s| s.test).collect();
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
fn guest_script(bins: &[(String, PathBuf)]) -> anyhow::Result<String> {
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
    for st in STEPS {
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
    steps: Vec<(String, i32, u64)>,
    figures: Vec<String>,
    ended: bool,
    secs: u64,
}

fn field<'a>(l: &'a str, key: &str) -> Option<&'a str> {
    l.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
}

/// Boots `k` and runs `script` in it, streaming its output with a `[name]` prefix.
fn boot(k: &kernels::Kernel, script: &Path) -> anyhow::Result<GuestRun> {
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
        .stderr(Stdio::inherit())
        .process_group(0)
        .spawn()
        .context("starting vng (cargo xtask setup installs virtme-ng)")?;
    let pgid = child.id() as i32;
    let rx = bufscope_testkit::line_channel(child.stdout.take().context("vng stdout")?);
    let started = Instant::now();
    let mut run = GuestRun::default();
    let mut in_check = false;
    loop {
        let left = GUEST_TIMEOUT.saturating_sub(started.elapsed());
        match rx.recv_timeout(left) {
            Ok(l) => {
                println!("[{}] {l}", k.pin.name);
                let l = l.trim_end_matches('\r').to_string();
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
                    let rc = field(&l, "rc").and_then(|x| x.parse().ok()).unwrap_or(-1);
                    let secs = field(&l, "secs").and_then(|x| x.parse().ok()).unwrap_or(0);
                    let mut name = l.split("name=").nth(1).unwrap_or("").to_string();
                    if field(&l, "skipped").is_some() {
                        name.push_str(" (skipped: not the hook in use here)");
                    }
                    run.steps.push((name, rc, secs));
                } else if l.starts_with("MATRIX END") {
                    run.ended = true;
                    run.secs = field(&l, "secs").and_then(|x| x.parse().ok()).unwrap_or(0);
                } else if l.contains("kernel drops column")
                    || l.contains("independent grow count")
                    || l.contains("pid -> (established, shrunk, locks)")
                {
                    run.figures.push(l);
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                // SAFETY: signalling the process group we created.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
                let _ = child.wait();
                bail!(
                    "{}: the guest did not finish within {:?}",
                    k.pin.name,
                    GUEST_TIMEOUT
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

/// Runs the matrix for `only` (all pinned kernels when empty); fails when any step failed.
pub fn stage(only: &[String]) -> anyhow::Result<()> {
    let started = Instant::now();
    setup()?;
    let pins: Vec<_> = kernels::pins()?
        .into_iter()
        .filter(|p| only.is_empty() || only.contains(&p.name))
        .collect();
    if pins.is_empty() {
        bail!("no pinned kernel matches {only:?}");
    }
    let bins = test_binaries()?;
    let dir = cache_dir().join("run");
    std::fs::create_dir_all(&dir)?;
    let script = dir.join("guest.sh");
    std::fs::write(&script, guest_script(&bins)?)?;
    crate::build::build_packages(true, &["bufscope"])?;
    let bufscope = workspace_root().join(BUFSCOPE);
    let mut failures = Vec::new();
    let mut report = Vec::new();
    for pin in &pins {
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
        let run = match boot(&k, &script) {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("{}: {e:#}", pin.name));
                continue;
            }
        };
        let wall = t.elapsed().as_secs();
        if !run.ended {
            failures.push(format!("{}: the guest stopped before the end", pin.name));
        }
        if run.check_rc != Some(0) {
            failures.push(format!(
                "{}: bufscope check exited {:?}",
                pin.name, run.check_rc
            ));
        }
        let online = chosen_hooks(&run.check.join("\n"));
        for (probe, hooks) in &online {
            match offline.iter().find(|(p, _)| p == probe) {
                Some((_, off)) if off == hooks => {}
                Some((_, off)) => failures.push(format!(
                    "{}: {probe}: check --btf chose {off}, the guest attached {hooks}",
                    pin.name
                )),
                None => failures.push(format!("{}: check --btf has no {probe}", pin.name)),
            }
        }
        if online.len() < 5 {
            failures.push(format!(
                "{}: bufscope check listed {} probes",
                pin.name,
                online.len()
            ));
        }
        for (name, rc, _) in &run.steps {
            if *rc != 0 {
                failures.push(format!("{}: step '{name}' failed (exit {rc})", pin.name));
            }
        }
        if run.steps.len() != STEPS.len() {
            failures.push(format!(
                "{}: {} of {} steps ran",
                pin.name,
                run.steps.len(),
                STEPS.len()
            ));
        }
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
        for (name, rc, secs) in &run.steps {
            let tag = if *rc == 0 { "ok  " } else { "FAIL" };
            println!("  [{tag}] {secs:>4} s  {name}");
        }
        for f in &run.figures {
            println!("  {f}");
        }
    }
    if failures.is_empty() {
        println!(
            "kernel matrix: all steps passed on {} kernels",
            report.len()
        );
        Ok(())
    } else {
        for f in &failures {
            eprintln!("kernel matrix FAIL: {f}");
        }
        bail!("kernel matrix: {} failure(s)", failures.len())
    }
}

/// Boots the pinned kernel `name` (a `kernels.pin` name) and runs the shell line `command` in
/// it from the workspace root, its output echoed with a `[name]` prefix; fails when the guest
/// did not finish or the command failed. The benchmarks use it to measure inside a guest.
pub fn run_in_guest(name: &str, command: &str) -> anyhow::Result<()> {
    setup()?;
    let pin = kernels::pins()?
        .into_iter()
        .find(|p| p.name == name)
        .with_context(|| format!("no pinned kernel {name:?} in kernels.pin"))?;
    let k = kernels::ensure(&pin)?;
    let dir = cache_dir().join("run");
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
    let run = boot(&k, &script)?;
    if !run.ended {
        bail!("{name}: the guest stopped before the end");
    }
    match run.steps.first() {
        Some((_, 0, _)) => Ok(()),
        Some((_, rc, _)) => bail!("{name}: the command exited {rc} in the guest"),
        None => bail!("{name}: the command did not run in the guest"),
    }
}
