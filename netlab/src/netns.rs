//! Network namespaces, veth pairs and child processes, each cleaned up on drop.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::AsRawFd as _;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::Error;

/// Where `ip netns` keeps its namespace handles.
const NETNS_DIR: &str = "/run/netns";

/// A unique name `<prefix><pid in hex>x<counter><tag>`, e.g. `bsl1f3ax0a`.
///
/// The owner's pid is embedded so that [`crate::cleanup()`] can tell a leftover of a killed run
/// (owner gone) from a lab that is still in use (owner alive). With a 3-character prefix and a
/// 1-character tag the result fits an interface name (15 bytes) for any pid.
pub fn unique_name(prefix: &str, tag: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{:x}x{n:x}{tag}", std::process::id())
}

/// Checks a namespace name: non-empty, at most 64 bytes, `[A-Za-z0-9_.-]`, not `.` or `..`.
fn check_ns_name(name: &str) -> Result<(), Error> {
    check_name(name, 64, "longer than 64 bytes", &[".", ".."])
}

/// Checks an interface name: 1 to 15 bytes of `[A-Za-z0-9_.-]`.
pub(crate) fn check_if_name(name: &str) -> Result<(), Error> {
    check_name(name, 15, "interface names are at most 15 bytes", &[])
}

/// Checks a name: 1 to `max` bytes of `[A-Za-z0-9_.-]` (`too_long` says why when longer), and
/// none of `reserved`.
fn check_name(
    name: &str,
    max: usize,
    too_long: &'static str,
    reserved: &[&str],
) -> Result<(), Error> {
    let why = if name.is_empty() {
        "empty"
    } else if name.len() > max {
        too_long
    } else if reserved.contains(&name) {
        "reserved"
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
    {
        "only letters, digits, '_', '.' and '-' are allowed"
    } else {
        return Ok(());
    };
    Err(Error::InvalidName {
        name: name.into(),
        why,
    })
}

/// Runs a command to completion; returns its standard output, or an error carrying the
/// command line, exit status and standard error.
pub(crate) fn run_output(cmd: &mut Command) -> Result<String, Error> {
    let shown = render(cmd);
    let out: Output = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::Command {
            cmd: shown.clone(),
            detail: e.to_string(),
        })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(Error::Command {
            cmd: shown,
            detail: format!("{}: {}", out.status, stderr.trim()),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `program arg1 arg2 …` for error messages.
fn render(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// `ip ARGS…` in the root namespace.
pub(crate) fn ip<I, S>(args: I) -> Result<String, Error>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run_output(Command::new("ip").args(args))
}

/// A named network namespace (`ip netns add`), deleted on drop together with every process
/// still running inside it.
///
/// Names are global (`/run/netns/<name>`): give each test its own prefix, ideally through
/// [`unique_name`], so that concurrent runs and `netlab cleanup` do not collide.
#[derive(Debug)]
pub struct Netns {
    name: String,
    owned: bool,
}

impl Netns {
    /// Creates the namespace and brings its loopback up. Fails with [`Error::Exists`] when a
    /// namespace of that name exists already.
    pub fn create(name: impl Into<String>) -> Result<Netns, Error> {
        let name = name.into();
        check_ns_name(&name)?;
        crate::require_root()?;
        if Netns::exists(&name) {
            return Err(Error::Exists(name));
        }
        ip(["netns", "add", &name])?;
        let ns = Netns { name, owned: true };
        ns.ip(["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Refers to an existing namespace without owning it: dropping the value leaves the
    /// namespace alone.
    pub fn attach(name: impl Into<String>) -> Result<Netns, Error> {
        let name = name.into();
        check_ns_name(&name)?;
        if !Netns::exists(&name) {
            return Err(Error::Command {
                cmd: format!("attach to netns {name}"),
                detail: "no such namespace".into(),
            });
        }
        Ok(Netns { name, owned: false })
    }

    /// True when `/run/netns/<name>` exists.
    pub fn exists(name: &str) -> bool {
        PathBuf::from(NETNS_DIR).join(name).exists()
    }

    /// Names of all named namespaces (`ip netns list`).
    pub fn list() -> Result<Vec<String>, Error> {
        let out = ip(["netns", "list"])?;
        // Lines look like `name` or `name (id: 3)`.
        Ok(out
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .map(String::from)
            .collect())
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace handle, `/run/netns/<name>`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(NETNS_DIR).join(&self.name)
    }

    /// The namespace's inode number (the `netns` bufscope labels its series with, as
    /// `/proc/<pid>/ns/net` of a process inside shows it).
    pub fn inode(&self) -> Result<u64, Error> {
        use std::os::unix::fs::MetadataExt as _;
        let path = self.path();
        std::fs::metadata(&path)
            .map(|m| m.ino())
            .map_err(|e| Error::io(format!("stat {}", path.display()), e))
    }

    /// A command that runs `program` inside the namespace (`ip netns exec <name> program`).
    /// Add arguments, environment and stdio as with any [`Command`]. `ip netns exec` execs
    /// the program in place, so the child's pid is the program's pid. The program starts with
    /// the termination signals unblocked, also under [`crate::TerminationSignals`].
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec"]).arg(&self.name).arg(program);
        crate::shutdown::unblock_in_child(&mut c);
        c
    }

    /// Runs `program args…` inside the namespace to completion and returns its standard
    /// output; a non-zero exit is an error carrying its standard error.
    pub fn exec<I, S>(&self, program: &str, args: I) -> Result<String, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        run_output(self.command(program).args(args))
    }

    /// Starts `program args…` inside the namespace in the background (stdin, stdout and
    /// stderr go to `/dev/null`). The returned [`Process`] is killed on drop.
    pub fn spawn<I, S>(&self, program: &str, args: I) -> Result<Process, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = self.command(program);
        c.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        Process::spawn(&mut c)
    }

    /// `ip -n <name> ARGS…`; returns its standard output.
    pub fn ip<I, S>(&self, args: I) -> Result<String, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        run_output(Command::new("ip").arg("-n").arg(&self.name).args(args))
    }

    /// Sets a device up.
    pub fn link_up(&self, dev: &str) -> Result<(), Error> {
        self.ip(["link", "set", "dev", dev, "up"]).map(drop)
    }

    /// Adds an address in CIDR notation (`10.0.0.1/24`, `fd00::1/64`) to a device.
    pub fn add_addr(&self, dev: &str, cidr: &str) -> Result<(), Error> {
        self.ip(["addr", "add", cidr, "dev", dev]).map(drop)
    }

    /// Adds a route to `dest` (CIDR or `default`) through device `dev`.
    pub fn add_route_dev(&self, dest: &str, dev: &str) -> Result<(), Error> {
        self.ip(["route", "add", dest, "dev", dev]).map(drop)
    }

    /// Adds a route to `dest` (CIDR or `default`) via gateway `gateway`.
    pub fn add_route_via(&self, dest: &str, gateway: &str) -> Result<(), Error> {
        self.ip(["route", "add", dest, "via", gateway]).map(drop)
    }

    /// Sets a device's MTU.
    pub fn set_mtu(&self, dev: &str, mtu: u32) -> Result<(), Error> {
        self.ip(["link", "set", "dev", dev, "mtu", &mtu.to_string()])
            .map(drop)
    }

    /// Runs `f` on a thread switched into this namespace (`setns(CLONE_NEWNET)`) and returns
    /// its result: sockets and TUN devices it opens belong to the namespace, and so does
    /// `/proc/sys/net` as it sees it. The calling thread is not affected. A panic in `f` is
    /// propagated.
    pub fn run_in<F, R>(&self, f: F) -> Result<R, Error>
    where
        F: FnOnce() -> R + Send,
        R: Send,
    {
        let path = self.path();
        let handle =
            File::open(&path).map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        let joined = std::thread::scope(|s| {
            s.spawn(move || {
                // SAFETY: setns on a valid namespace fd only changes this thread's namespace.
                if unsafe { libc::setns(handle.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(f())
            })
            .join()
        });
        match joined {
            Ok(r) => r.map_err(|e| Error::io(format!("setns into {}", self.name), e)),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    /// Sets a per-namespace sysctl, e.g. `set_sysctl("net.ipv4.tcp_rmem", "4096 131072 134217728")`.
    /// Keys use dots (or slashes) as `sysctl` does. Only per-namespace keys are isolated
    /// (`net.ipv4.*`, `net.ipv6.*`); others, such as `net.core.rmem_max`, are global and
    /// shared with every other user of the machine: never set those here.
    pub fn set_sysctl(&self, key: &str, value: &str) -> Result<(), Error> {
        let path = sysctl_path(key);
        let value = value.to_string();
        self.run_in(move || std::fs::write(&path, value.as_bytes()).map_err(|e| (path, e)))?
            .map_err(|(p, e)| {
                Error::io(format!("writing {} in netns {}", p.display(), self.name), e)
            })
    }

    /// Reads a sysctl as seen from inside the namespace (trimmed).
    pub fn sysctl(&self, key: &str) -> Result<String, Error> {
        let path = sysctl_path(key);
        self.run_in(move || std::fs::read_to_string(&path).map_err(|e| (path, e)))?
            .map(|s| s.trim().to_string())
            .map_err(|(p, e)| {
                Error::io(format!("reading {} in netns {}", p.display(), self.name), e)
            })
    }

    /// Raises the TCP autotuning maxima (`net.ipv4.tcp_rmem`/`tcp_wmem` = 128 MiB) inside the
    /// namespace so that one flow can fill a high bandwidth-delay product (LAB-FACTS §2:
    /// without it TCP tops out near 3.4 MB of window, ~140 Mbit/s at 190 ms).
    pub fn set_big_tcp_buffers(&self) -> Result<(), Error> {
        self.set_sysctl("net.ipv4.tcp_rmem", "4096 131072 134217728")?;
        self.set_sysctl("net.ipv4.tcp_wmem", "4096 16384 134217728")
    }

    /// Pids of the processes whose network namespace is this one (`ip netns pids`).
    pub fn pids(&self) -> Result<Vec<u32>, Error> {
        let out = ip(["netns", "pids", &self.name])?;
        Ok(out
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect())
    }

    /// Terminates every process inside the namespace: SIGTERM, then SIGKILL for those still
    /// alive after `grace`. Never signals the calling process.
    pub fn kill_all(&self, grace: Duration) -> Result<(), Error> {
        kill_pids(&self.pids()?, grace);
        Ok(())
    }

    /// Deletes the namespace now (killing its processes) instead of on drop.
    pub fn delete(mut self) -> Result<(), Error> {
        self.owned = false;
        delete_netns(&self.name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if self.owned {
            let _ = delete_netns(&self.name);
        }
    }
}

/// Kills a namespace's processes and deletes it (`ip netns del`).
pub(crate) fn delete_netns(name: &str) -> Result<(), Error> {
    if let Ok(out) = ip(["netns", "pids", name]) {
        let pids: Vec<u32> = out
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        kill_pids(&pids, Duration::from_millis(1500));
    }
    ip(["netns", "del", name]).map(drop)
}

/// SIGTERM to each pid, wait up to `grace` for them to go, SIGKILL the rest.
pub(crate) fn kill_pids(pids: &[u32], grace: Duration) {
    let me = std::process::id();
    let pids: Vec<i32> = pids
        .iter()
        .filter(|&&p| p != me)
        .filter_map(|&p| i32::try_from(p).ok())
        .collect();
    if pids.is_empty() {
        return;
    }
    for &p in &pids {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe { libc::kill(p, libc::SIGTERM) };
    }
    let alive = |p: i32| pid_alive(p);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && pids.iter().any(|&p| alive(p)) {
        std::thread::sleep(Duration::from_millis(20));
    }
    for &p in &pids {
        if alive(p) {
            // SAFETY: as above.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
    }
}

/// True when `pid` exists and is not a zombie.
pub(crate) fn pid_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses: "pid (comm) S …".
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// `/proc/sys/…` path of a dotted sysctl key.
fn sysctl_path(key: &str) -> PathBuf {
    let rel = if key.contains('/') {
        key.to_string()
    } else {
        key.replace('.', "/")
    };
    PathBuf::from("/proc/sys").join(rel.trim_start_matches('/'))
}

/// A veth pair whose two ends are created directly inside two namespaces (they never exist in
/// the root namespace). Both ends are up; addresses are the caller's. Deleted on drop (deleting
/// either namespace deletes it too).
#[derive(Debug)]
pub struct VethPair {
    ns_a: String,
    name_a: String,
    ns_b: String,
    name_b: String,
}

impl VethPair {
    /// Creates `name_a` in `a` peered with `name_b` in `b` and sets both up. Interface names
    /// are at most 15 bytes; they only need to be unique within their namespace.
    pub fn create(a: &Netns, name_a: &str, b: &Netns, name_b: &str) -> Result<VethPair, Error> {
        check_if_name(name_a)?;
        check_if_name(name_b)?;
        a.ip([
            "link",
            "add",
            name_a,
            "type",
            "veth",
            "peer",
            "name",
            name_b,
            "netns",
            b.name(),
        ])?;
        let pair = VethPair {
            ns_a: a.name().into(),
            name_a: name_a.into(),
            ns_b: b.name().into(),
            name_b: name_b.into(),
        };
        a.link_up(name_a)?;
        b.link_up(name_b)?;
        Ok(pair)
    }

    /// The end in namespace `a`.
    pub fn name_a(&self) -> &str {
        &self.name_a
    }

    /// The end in namespace `b`.
    pub fn name_b(&self) -> &str {
        &self.name_b
    }

    /// Name of namespace `a`.
    pub fn netns_a(&self) -> &str {
        &self.ns_a
    }

    /// Name of namespace `b`.
    pub fn netns_b(&self) -> &str {
        &self.ns_b
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        if Netns::exists(&self.ns_a) {
            let _ = ip(["-n", &self.ns_a, "link", "del", &self.name_a]);
        }
    }
}

/// A child process that is killed (SIGTERM, then SIGKILL) and reaped on drop.
#[derive(Debug)]
pub struct Process {
    child: Option<Child>,
    shown: String,
}

impl Process {
    /// Spawns `cmd` (stdio as configured on it).
    pub fn spawn(cmd: &mut Command) -> Result<Process, Error> {
        let shown = render(cmd);
        let child = cmd.spawn().map_err(|e| Error::Command {
            cmd: shown.clone(),
            detail: e.to_string(),
        })?;
        Ok(Process {
            child: Some(child),
            shown,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The underlying child, e.g. to take its stdout.
    pub fn child_mut(&mut self) -> Option<&mut Child> {
        self.child.as_mut()
    }

    /// Sends `signal` (e.g. `libc::SIGINT`) to the process, if it has not been reaped.
    pub fn signal(&mut self, signal: i32) {
        if let Some(c) = self.child.as_mut()
            && matches!(c.try_wait(), Ok(None))
            && let Ok(pid) = i32::try_from(c.id())
        {
            // SAFETY: kill(2) has no memory-safety preconditions; pid is our unreaped child.
            unsafe { libc::kill(pid, signal) };
        }
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Waits for the process to exit by itself, up to `timeout`; kills it past that. Returns
    /// its output (when piped) or an error naming the command.
    pub fn wait_output(mut self, timeout: Duration) -> Result<Output, Error> {
        let Some(child) = self.child.take() else {
            return Err(Error::Command {
                cmd: self.shown.clone(),
                detail: "already reaped".into(),
            });
        };
        // Collect output on a helper thread so that a chatty child never blocks on a full
        // pipe while we wait; past the deadline, signal it by pid and let the thread reap it.
        let pid = i32::try_from(child.id()).ok();
        let (tx, rx) = std::sync::mpsc::channel();
        let collector = std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        let result = match rx.recv_timeout(timeout) {
            Ok(r) => r.map_err(|e| Error::io(format!("collecting {}", self.shown), e)),
            Err(_) => {
                if let Some(pid) = pid {
                    // SAFETY: kill(2) has no memory-safety preconditions; the child is not
                    // reaped until the collector thread returns.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                Err(Error::Command {
                    cmd: self.shown.clone(),
                    detail: format!("still running after {timeout:?}; killed"),
                })
            }
        };
        let _ = collector.join();
        result
    }

    /// Kills (SIGTERM, then SIGKILL after 1.5 s) and reaps the process now.
    pub fn kill(mut self) {
        if let Some(mut c) = self.child.take() {
            terminate(&mut c);
        }
    }
}

/// SIGTERM, wait up to 1.5 s, SIGKILL, reap.
fn terminate(child: &mut Child) {
    if matches!(child.try_wait(), Ok(Some(_))) {
        return;
    }
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) has no memory-safety preconditions; pid is our unreaped child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let deadline = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            terminate(&mut c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn why(r: Result<(), Error>) -> Option<&'static str> {
        match r {
            Ok(()) => None,
            Err(Error::InvalidName { why, .. }) => Some(why),
            Err(e) => panic!("unexpected error {e}"),
        }
    }

    #[test]
    fn namespace_and_interface_names_are_checked() {
        assert_eq!(why(check_ns_name("bsl1f3ax0a")), None);
        assert_eq!(why(check_ns_name(&"n".repeat(64))), None);
        assert_eq!(
            why(check_ns_name(&"n".repeat(65))),
            Some("longer than 64 bytes")
        );
        assert_eq!(why(check_ns_name("")), Some("empty"));
        assert_eq!(why(check_ns_name("..")), Some("reserved"));
        assert_eq!(
            why(check_ns_name("a/b")),
            Some("only letters, digits, '_', '.' and '-' are allowed")
        );
        assert_eq!(why(check_if_name(&"i".repeat(15))), None);
        assert_eq!(
            why(check_if_name(&"i".repeat(16))),
            Some("interface names are at most 15 bytes")
        );
        assert_eq!(
            why(check_if_name("..")),
            None,
            "not reserved for interfaces"
        );
        assert_eq!(
            why(check_if_name("eth 0")),
            Some("only letters, digits, '_', '.' and '-' are allowed")
        );
    }
}
