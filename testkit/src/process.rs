//! Child processes: polling, signals, graceful stop, and children whose stdout lines arrive on a
//! channel.

use std::io::{BufRead as _, BufReader, Read, Write as _};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// Environment variable: a factor every wait of the tests (a child's line, a condition
/// polled, an exporter's start) is multiplied by. The kernel matrix sets it in its guests:
/// under QEMU's TCG beside `cargo xtask test`'s host stage a guest gets only the CPU time
/// the host tests leave, and can stand still for as long as a host test keeps both CPUs busy.
pub const PATIENCE_ENV: &str = "BUFSCOPE_TEST_PATIENCE";

/// `timeout` times the factor of [`PATIENCE_ENV`] (1 when unset or not a number ≥ 1).
pub fn patience(timeout: Duration) -> Duration {
    timeout.saturating_mul(patience_factor(std::env::var(PATIENCE_ENV).ok().as_deref()))
}

/// The factor a [`PATIENCE_ENV`] value stands for.
fn patience_factor(value: Option<&str>) -> u32 {
    value
        .and_then(|v| v.trim().parse::<u32>().ok())
        .filter(|f| *f >= 1)
        .unwrap_or(1)
}

/// Polls `f` every `every` until it returns `Some`; an error once `timeout` has passed
/// ("timed out after … waiting for `what`").
pub fn wait_until<T>(
    timeout: Duration,
    every: Duration,
    what: &str,
    mut f: impl FnMut() -> Option<T>,
) -> anyhow::Result<T> {
    let timeout = patience(timeout);
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(every);
    }
}

/// Sends signal `sig` to `pid`: a child this process spawned and has not reaped yet (a reaped
/// pid may already belong to someone else).
pub fn signal(pid: u32, sig: i32) -> anyhow::Result<()> {
    let pid = i32::try_from(pid).with_context(|| format!("pid {pid} out of range"))?;
    // SAFETY: kill(2) has no memory-safety preconditions.
    if unsafe { libc::kill(pid, sig) } != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("kill({pid}, {sig})"));
    }
    Ok(())
}

/// Polls `child` until it has exited (true) or `timeout` has passed (false).
pub fn wait_exit(child: &mut Child, timeout: Duration) -> bool {
    wait_until(timeout, Duration::from_millis(10), "exit", || {
        child.try_wait().ok().flatten()
    })
    .is_ok()
}

/// Stops `child` with SIGTERM (graceful shutdown), SIGKILL after 10 s, and reaps it.
pub fn terminate(child: &mut Child) {
    terminate_with(child, libc::SIGTERM);
}

/// Like [`terminate`], with `sig` first (e.g. SIGINT for bpftrace, which prints its maps and
/// detaches on it). A child that has already exited is only reaped, never signalled.
pub fn terminate_with(child: &mut Child, sig: i32) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    let _ = signal(child.id(), sig);
    if !wait_exit(child, Duration::from_secs(10)) {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The `key=value` fields of a line after its first word (`READY port=5000 inode=77` →
/// `port`, `inode`), as `bufscope-workload` prints them.
pub fn ready_fields<C: FromIterator<(String, String)>>(line: &str) -> C {
    line.split_whitespace()
        .skip(1)
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The lines of `r` (a child's stdout, say) on a channel, read by a thread of their own; the
/// channel closes when `r` ends (the child closed it or exited) or fails.
pub fn line_channel(r: impl Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// A child with piped stdin and stdout whose stdout lines arrive on a channel (stderr is left as
/// the command had it: inherited unless set).
///
/// Dropping it writes `exit` to its stdin (`bufscope-workload`'s quit command) and waits for it
/// to exit by itself for the grace period (5 s unless [`LineChild::stop_with`] says otherwise);
/// then it sends the stop signal, if one was set, and waits 10 s more; then SIGKILL; it is
/// always reaped.
pub struct LineChild {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    name: String,
    exit_grace: Duration,
    stop_signal: Option<i32>,
}

impl LineChild {
    /// Spawns `cmd`; `name` is what error messages call it.
    pub fn spawn(mut cmd: Command, name: &str) -> anyhow::Result<Self> {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        let stdout = child.stdout.take().context("child stdout")?;
        let stdin = child.stdin.take();
        Ok(Self {
            child,
            stdin,
            lines: line_channel(stdout),
            name: name.to_string(),
            exit_grace: Duration::from_secs(5),
            stop_signal: None,
        })
    }

    /// How dropping it stops it: `exit_grace` after `exit` on stdin, then `stop_signal` (if any)
    /// and 10 s more, then SIGKILL.
    #[must_use]
    pub fn stop_with(mut self, exit_grace: Duration, stop_signal: Option<i32>) -> Self {
        self.exit_grace = exit_grace;
        self.stop_signal = stop_signal;
        self
    }

    /// What error messages call it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for a stdout line starting with `prefix` (earlier lines are dropped).
    pub fn wait_line(&mut self, prefix: &str, timeout: Duration) -> anyhow::Result<String> {
        let timeout = patience(timeout);
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return Ok(l),
                Ok(_) => {}
                Err(_) => bail!(
                    "{} (pid {}) did not print {prefix} within {timeout:?}",
                    self.name,
                    self.pid()
                ),
            }
        }
    }

    /// Its next stdout line; `None` once stdout has closed, or when none came within
    /// `timeout`.
    pub fn next_line(&mut self, timeout: Duration) -> Option<String> {
        self.lines.recv_timeout(patience(timeout)).ok()
    }

    /// Waits for its `READY` line and returns the line's fields ([`ready_fields`]).
    pub fn wait_ready<C: FromIterator<(String, String)>>(
        &mut self,
        timeout: Duration,
    ) -> anyhow::Result<C> {
        let line = self.wait_line("READY", timeout)?;
        Ok(ready_fields(&line))
    }

    /// Writes `line` and a newline to its stdin.
    pub fn send(&mut self, line: &str) -> anyhow::Result<()> {
        let s = self.stdin.as_mut().context("stdin closed")?;
        writeln!(s, "{line}").with_context(|| format!("writing to {}", self.name))?;
        s.flush()?;
        Ok(())
    }

    /// Closes its stdin and waits, without a time limit, until it exits.
    pub fn wait(&mut self) -> anyhow::Result<ExitStatus> {
        self.stdin.take();
        self.child
            .wait()
            .with_context(|| format!("waiting for {}", self.name))
    }

    /// Closes its stdin and waits until it exits by itself: an error when it fails or takes
    /// longer than `timeout`.
    pub fn finish(mut self, timeout: Duration) -> anyhow::Result<()> {
        self.stdin.take();
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait()? {
                if st.success() {
                    return Ok(());
                }
                bail!("{} failed: {st}", self.name);
            }
            if Instant::now() > deadline {
                bail!("{} did not finish within {timeout:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for LineChild {
    fn drop(&mut self) {
        if let Some(mut s) = self.stdin.take() {
            let _ = s.write_all(b"exit\n");
        }
        if wait_exit(&mut self.child, self.exit_grace) {
            return;
        }
        match self.stop_signal {
            Some(sig) => terminate_with(&mut self.child, sig),
            None => {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn patience_is_a_whole_factor_of_at_least_one() {
        for (v, f) in [
            (None, 1),
            (Some("4"), 4),
            (Some(" 2\n"), 2),
            (Some("0"), 1),
            (Some("x"), 1),
        ] {
            assert_eq!(patience_factor(v), f, "{v:?}");
        }
    }

    #[test]
    fn ready_fields_skip_the_first_word() {
        let f: BTreeMap<String, String> = ready_fields("READY port=5000 inode=77 junk");
        assert_eq!(f.len(), 2);
        assert_eq!(f.get("port").map(String::as_str), Some("5000"));
        assert_eq!(f.get("inode").map(String::as_str), Some("77"));
    }

    #[test]
    fn wait_until_times_out_with_what() {
        let e = wait_until(Duration::ZERO, Duration::ZERO, "nothing", || None::<()>);
        assert!(e.is_err_and(|e| e.to_string().contains("waiting for nothing")));
    }

    #[test]
    fn line_child_reads_lines_and_finishes() -> anyhow::Result<()> {
        let mut c = Command::new("sh");
        c.args(["-c", "echo noise; echo READY a=1 b=2; read x; echo GOT $x"]);
        let mut p = LineChild::spawn(c, "sh")?;
        let f: BTreeMap<String, String> = p.wait_ready(Duration::from_secs(10))?;
        assert_eq!(f.get("b").map(String::as_str), Some("2"));
        p.send("hello")?;
        assert_eq!(p.wait_line("GOT", Duration::from_secs(10))?, "GOT hello");
        // After its last line, stdout closes: no more lines, without waiting out the timeout.
        let t = Instant::now();
        assert_eq!(p.next_line(Duration::from_secs(30)), None);
        assert!(t.elapsed() < Duration::from_secs(20));
        p.finish(Duration::from_secs(10))
    }

    #[test]
    fn terminate_stops_and_reaps() -> anyhow::Result<()> {
        let mut c = Command::new("sleep").arg("60").spawn()?;
        terminate(&mut c);
        assert!(c.try_wait()?.is_some());
        // Already reaped: nothing is signalled.
        terminate(&mut c);
        Ok(())
    }
}
