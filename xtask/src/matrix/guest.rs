//! Booting a guest (virtme-ng, QEMU under TCG) and reading what it reports: its output streamed
//! with a `[kernel]` prefix, the `MATRIX …` lines parsed into a [`GuestRun`].

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use super::kernels::{self, cache_dir};
use super::script::sh_quote;
use super::setup::setup;
use crate::util::workspace_root;

/// A program run in place of virtme-ng's `vng` (same arguments): a test's stand-in that
/// behaves as QEMU does towards its output without booting anything
/// (`xtask/tests/matrix_log.rs`).
pub const VNG_ENV: &str = "BUFSCOPE_MATRIX_VNG";

/// What one guest reported.
#[derive(Default)]
pub(super) struct GuestRun {
    pub(super) release: String,
    pub(super) check: Vec<String>,
    pub(super) check_rc: Option<i32>,
    /// Each step: name, exit code, seconds.
    pub(super) steps: Vec<(String, i32, u64)>,
    /// What each step's test binary reported, in the order of `steps`.
    pub(super) step_tests: Vec<StepTests>,
    pub(super) figures: Vec<String>,
    pub(super) ended: bool,
    pub(super) secs: u64,
}

/// What one step's test binary reported.
#[derive(Clone, Debug, Default)]
pub(super) struct StepTests {
    /// Not run: the hook it tests is not the one in use on this kernel.
    pub(super) skipped: bool,
    /// The `test result:` line of the step's test binary, if it printed one.
    pub(super) counts: Option<crate::libtest::Counts>,
    /// Tests the step's binary reported failed.
    pub(super) failed: Vec<String>,
}

/// One step as the guest reported it.
pub(super) struct GuestStep {
    pub(super) name: String,
    pub(super) rc: i32,
    pub(super) secs: u64,
    pub(super) tests: StepTests,
}

impl GuestRun {
    /// Each step with what its test binary reported.
    pub(super) fn guest_steps(&self) -> Vec<GuestStep> {
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
pub(super) fn boot(
    k: &kernels::Kernel,
    script: &Path,
    timeout: Duration,
    priority: super::Priority,
) -> anyhow::Result<GuestRun> {
    let venv = cache_dir().join("venv/bin");
    let path = format!(
        "{}:{}",
        venv.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let vng = std::env::var_os(VNG_ENV).map_or_else(|| venv.join("vng"), Into::into);
    let mut cmd = Command::new(vng);
    cmd.env("PATH", path)
        .args(["--disable-kvm", "-m", "2G", "--cpus", "2", "--run"])
        .arg(&k.vmlinuz)
        .arg("--exec")
        .arg(format!("sh {}", script.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if priority == super::Priority::Background {
        // SAFETY: only an async-signal-safe syscall between fork and exec. QEMU and every
        // thread it starts inherit the policy.
        unsafe {
            cmd.pre_exec(|| {
                let param = libc::sched_param { sched_priority: 0 };
                if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd
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
    let dir = super::run_dir();
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
    let run = boot(&k, &script, timeout, super::Priority::Normal)?;
    if !run.ended {
        bail!("{name}: the guest stopped before the end");
    }
    match run.steps.first() {
        Some((_, 0, _)) => Ok(()),
        Some((_, rc, _)) => bail!("{name}: the command exited {rc} in the guest"),
        None => bail!("{name}: the command did not run in the guest"),
    }
}
