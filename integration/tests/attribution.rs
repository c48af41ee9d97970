//! Attribution follows the socket: drops land on the live process that holds (and
//! reads) a UDP socket, across fork, fd passing, prefork sharing and exec, never on an exited
//! launcher. Every figure is compared with the kernel's per-socket drops column
//! (`/proc/<pid>/net/udp`). The patterns are real programs: a Python script (below) started
//! under a symlink to `python3` named `bsp-launcher` (its `comm`), exec'ing one named
//! `bsp-execd`.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use bufscope_api::status::ProcessRow;
use bufscope_integration::{Exporter, Metrics, Workload, eventually, proc_udp_drops};
use bufscope_testkit::LineChild;

const DROPS: &str = "bufscope_socket_drops_total";

/// The patterns. Every reader drains its socket slowly (one datagram per 2 ms), so a burst
/// overflows its 4 KiB buffer; `READY` names the pids, the socket's inode and its port.
const SCRIPT: &str = r#"
import os, select, signal, socket, sys, time

def bound():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.bind(("127.0.0.1", 0))
    return s

def ino(fd):
    return int(os.readlink("/proc/self/fd/%d" % fd)[8:-1])

def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()

def serve(fd, use_stdin=True):
    s = socket.socket(fileno=fd)
    s.setblocking(False)
    watch = [sys.stdin, s] if use_stdin else [s]
    while True:
        r, _, _ = select.select(watch, [], [], 0.5)
        if sys.stdin in r:
            line = sys.stdin.readline()
            if not line or line.strip() == "exit":
                os._exit(0)
        if s in r:
            try:
                s.recv(2048)
            except BlockingIOError:
                pass
            time.sleep(0.002)

def wait_stdin(word):
    while True:
        line = sys.stdin.readline()
        if not line or line.strip() == "exit":
            return False
        if line.strip() == word:
            return True

mode = sys.argv[1]
if mode == "fork-exit":
    s = bound()
    launcher = os.getpid()
    if os.fork() == 0:
        say("READY pid=%d launcher=%d inode=%d port=%d" % (os.getpid(), launcher, ino(s.fileno()), s.getsockname()[1]))
        serve(s.detach())
    os._exit(0)
elif mode == "scm-rights":
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    launcher = os.getpid()
    if os.fork() == 0:
        a.close()
        _, fds, _, _ = socket.recv_fds(b, 16, 1)
        s = socket.socket(fileno=fds[0])
        say("READY pid=%d launcher=%d inode=%d port=%d" % (os.getpid(), launcher, ino(s.fileno()), s.getsockname()[1]))
        serve(s.detach())
    b.close()
    s = bound()
    socket.send_fds(a, [b"x"], [s.fileno()])
    s.close()
    a.close()
    os._exit(0)
elif mode == "prefork":
    # Two workers; the first `reading` of them read the socket, the others only hold it.
    reading = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    s = bound()
    workers = []
    for i in range(2):
        pid = os.fork()
        if pid == 0:
            if i < reading:
                serve(s.fileno(), use_stdin=False)
            while True:
                time.sleep(60)
        workers.append(pid)
    say("READY pid=%d workers=%d,%d inode=%d port=%d" % (os.getpid(), workers[0], workers[1], ino(s.fileno()), s.getsockname()[1]))
    wait_stdin("never")
    for w in workers:
        os.kill(w, signal.SIGKILL)
    os._exit(0)
elif mode == "exec":
    s = bound()
    s.set_inheritable(True)
    say("READY pid=%d inode=%d port=%d" % (os.getpid(), ino(s.fileno()), s.getsockname()[1]))
    if wait_stdin("exec"):
        os.execv(sys.argv[2], [sys.argv[2], sys.argv[0], "execd", str(s.fileno())])
    os._exit(0)
elif mode == "execd":
    say("EXECED pid=%d" % os.getpid())
    serve(int(sys.argv[2]))
elif mode == "sockopt-exec":
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    say("READY pid=%d" % os.getpid())
    if wait_stdin("exec"):
        os.execv(sys.argv[2], [sys.argv[2], sys.argv[0], "sockopt-execd"])
    os._exit(0)
elif mode == "sockopt-execd":
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
    say("EXECED pid=%d" % os.getpid())
    wait_stdin("never")
"#;

/// A directory with the script and the two `python3` symlinks (removed when dropped).
struct Programs {
    dir: PathBuf,
}

impl Programs {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("bsp-attr-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("patterns.py"), SCRIPT).unwrap();
        let python = interpreter();
        for link in ["bsp-launcher", "bsp-execd"] {
            std::os::unix::fs::symlink(&python, dir.join(link)).unwrap();
        }
        Self { dir }
    }

    /// Starts `bsp-launcher patterns.py <mode> <args>` and waits for its READY line.
    fn start(
        &self,
        mode: &str,
        args: &[&str],
    ) -> (LineChild, std::collections::HashMap<String, String>) {
        let mut cmd = Command::new(self.dir.join("bsp-launcher"));
        cmd.arg(self.dir.join("patterns.py"))
            .arg(mode)
            .args(args)
            .stderr(Stdio::inherit());
        let mut child = LineChild::spawn(cmd, mode).unwrap();
        let ready = child.wait_ready(Duration::from_secs(30)).unwrap();
        (child, ready)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Programs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The real `python3` executable (not a wrapper such as a pyenv shim: the symlinks must
/// point at the interpreter itself for `comm` to be their name).
fn interpreter() -> PathBuf {
    let out = Command::new("python3")
        .args([
            "-c",
            "import os, sys; print(os.path.realpath(sys.executable))",
        ])
        .output()
        .expect("python3");
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(p.is_absolute(), "python3 not found");
    p
}

fn field<'a>(ready: &'a std::collections::HashMap<String, String>, k: &str) -> &'a str {
    ready
        .get(k)
        .map(String::as_str)
        .unwrap_or_else(|| panic!("READY has no {k}: {ready:?}"))
}

/// Sends `count` datagrams to `port` from a separate process.
fn flood(port: &str, count: u32) {
    let c = count.to_string();
    let sender = Workload::start(&["udp-flood", "--port", port, "--count", &c]);
    assert!(sender.wait(), "flooder failed");
}

/// The kernel's drops column of socket `inode`, read through `pid`'s network namespace.
fn kernel_drops(pid: u32, inode: u64) -> u64 {
    proc_udp_drops(pid, inode).expect("socket in /proc/<pid>/net/udp")
}

fn on_pid(rows: &[ProcessRow], pid: u32) -> f64 {
    // A program's series in /metrics sum its processes (a forked child shares its parent's
    // identity); which process got the drops is the per-process detail of /api/v1/status.
    rows.iter()
        .filter(|r| r.pid_number() == Some(pid))
        .flat_map(|r| r.drops.iter())
        .filter(|(k, _)| k.starts_with("udp/"))
        .map(|(_, n)| *n as f64)
        .sum::<f64>()
        + 0.0
}

/// Waits until the drops on `pids` sum to the kernel's `want`, then checks nothing more shows.
/// Returns the per-process rows of that last look.
fn wait_sum(exporter: &Exporter, pids: &[u32], want: u64, what: &str) -> Vec<ProcessRow> {
    let total = |rows: &[ProcessRow]| pids.iter().map(|p| on_pid(rows, *p)).sum::<f64>();
    eventually(Duration::from_secs(15), what, || {
        (total(&exporter.processes()) == want as f64).then_some(())
    });
    std::thread::sleep(Duration::from_millis(1500));
    let rows = exporter.processes();
    assert_eq!(total(&rows), want as f64, "{what}: nothing more later");
    rows
}

/// The reader hook's self-metrics: (armed, arms, disarms). Panics when the exporter has no
/// reader hook (a kernel without `tp_btf/sock_recv_length`, before 6.4).
fn reader_hook(m: &Metrics) -> (f64, f64, f64) {
    assert!(
        m.find("bufscope_reader_hook_armed", &[]).next().is_some(),
        "no reader hook on this kernel (needs tp_btf/sock_recv_length)"
    );
    let changes = |a: &str| m.sum("bufscope_reader_hook_changes_total", &[("action", a)]) + 0.0;
    (
        m.sum("bufscope_reader_hook_armed", &[]) + 0.0,
        changes("arm"),
        changes("disarm"),
    )
}

/// BPF links of the reader program (`bpftool link show` joined with `bpftool prog show` on the
/// program id): the kernel's own word on whether the hook is attached.
fn reader_links() -> usize {
    let json = |what: &str| -> Vec<serde_json::Value> {
        let out = Command::new("bpftool")
            .args(["-j", what, "show"])
            .output()
            .expect("bpftool");
        serde_json::from_slice(&out.stdout).unwrap_or_default()
    };
    let progs: Vec<u64> = json("prog")
        .iter()
        .filter(|p| p["name"] == "sock_recv_length")
        .filter_map(|p| p["id"].as_u64())
        .collect();
    json("link")
        .iter()
        .filter(|l| l["prog_id"].as_u64().is_some_and(|id| progs.contains(&id)))
        .count()
}

/// A launcher hands the socket on (`mode`: by fork, or over SCM_RIGHTS) and exits; the
/// process that got it (`who`) holds and reads it. Its drops are on that process, none on the
/// launcher; one holder, so the reader hook never attaches.
fn drops_follow_the_hand_off(name: &str, mode: &str, who: &str) {
    let progs = Programs::new(name);
    let exporter = Exporter::start(&[]);
    let (_child, ready) = progs.start(mode, &[]);
    let pid: u32 = field(&ready, "pid").parse().unwrap();
    let launcher: u32 = field(&ready, "launcher").parse().unwrap();
    let inode: u64 = field(&ready, "inode").parse().unwrap();
    eventually(Duration::from_secs(10), "the launcher to exit", || {
        let fds = std::fs::read_dir(format!("/proc/{launcher}/fd"));
        fds.map_or(true, |mut d| d.next().is_none()).then_some(())
    });
    flood(field(&ready, "port"), 5000);
    let kernel = kernel_drops(pid, inode);
    assert!(
        kernel > 1000,
        "the flood should overflow the buffer ({kernel})"
    );
    let m = wait_sum(
        &exporter,
        &[pid],
        kernel,
        &format!("the {who}'s drops = the kernel's"),
    );
    assert_eq!(on_pid(&m, launcher), 0.0, "nothing on the exited launcher");
    assert_eq!(
        reader_hook(&exporter.scrape()),
        (0.0, 0.0, 0.0),
        "a socket one process holds never attaches the reader hook"
    );
    eprintln!(
        "{mode}: kernel drops column {kernel}, bufscope {} on {who} {pid}, {} on launcher {launcher}",
        on_pid(&m, pid),
        on_pid(&m, launcher)
    );
}

/// A launcher creates and binds the socket, forks, and exits; the child holds and reads it.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn fork_and_exit_drops_land_on_the_child() {
    drops_follow_the_hand_off("fork", "fork-exit", "child");
}

/// A launcher hands the socket to a worker over SCM_RIGHTS, closes its copy and exits.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn scm_rights_hand_off_drops_land_on_the_worker() {
    drops_follow_the_hand_off("scm", "scm-rights", "worker");
}

/// A prefork master keeps the socket, two workers hold it and the first `reading` of them
/// read it (the second is the newest holder). Checks, against the kernel's drops column and
/// its list of BPF links: the reader hook stays detached while the shared socket does not
/// drop; a 3-second overflow attaches it; the drops land on the reading workers only (summing
/// to the kernel's count), none on the master or an idle worker; the hook detaches once the
/// drops stop. Returns the drops of each worker.
fn prefork(name: &str, reading: usize) -> Vec<f64> {
    let progs = Programs::new(name);
    let exporter = Exporter::start(&[]);
    let (_child, ready) = progs.start("prefork", &[&reading.to_string()]);
    let master: u32 = field(&ready, "pid").parse().unwrap();
    let workers: Vec<u32> = field(&ready, "workers")
        .split(',')
        .map(|w| w.parse().unwrap())
        .collect();
    let inode: u64 = field(&ready, "inode").parse().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        (reader_hook(&exporter.scrape()), reader_links()),
        ((0.0, 0.0, 0.0), 0),
        "no shared socket drops yet: the reader hook is not attached"
    );

    let dest = format!("127.0.0.1:{}", field(&ready, "port"));
    let blast = Workload::start(&["udp-blast", "--dest", &dest, "--seconds", "3"]);
    eventually(Duration::from_secs(3), "the reader hook to attach", || {
        let (armed, arms, _) = reader_hook(&exporter.scrape());
        (armed == 1.0 && arms >= 1.0 && reader_links() == 1).then_some(())
    });
    assert!(blast.wait(), "udp-blast failed");
    let kernel = kernel_drops(master, inode);
    assert!(
        kernel > 1000,
        "the blast should overflow the buffer ({kernel})"
    );
    let readers = &workers[..reading];
    let m = wait_sum(
        &exporter,
        readers,
        kernel,
        "the reading workers' drops = the kernel's",
    );
    let got: Vec<f64> = workers.iter().map(|w| on_pid(&m, *w)).collect();
    eprintln!(
        "prefork, {reading} of 2 workers reading: kernel drops column {kernel}, bufscope {got:?} on workers {workers:?}, {} on master {master}",
        on_pid(&m, master)
    );
    assert_eq!(
        on_pid(&m, master),
        0.0,
        "nothing on the master, which never reads"
    );
    for idle in &workers[reading..] {
        assert_eq!(
            on_pid(&m, *idle),
            0.0,
            "nothing on worker {idle}, the newest holder, which never reads"
        );
    }
    eventually(Duration::from_secs(15), "the reader hook to detach", || {
        let (armed, _, disarms) = reader_hook(&exporter.scrape());
        (armed == 0.0 && disarms >= 1.0 && reader_links() == 0).then_some(())
    });
    got
}

/// Both workers read: the drops are split between them in proportion to their receives.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn prefork_drops_land_on_the_reading_workers() {
    let got = prefork("prefork", 2);
    assert!(
        got.iter().all(|n| *n > 0.0),
        "both workers read, both carry drops: {got:?}"
    );
}

/// One worker reads, the other (the newest holder) only holds the socket: every drop is on
/// the reader.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn prefork_drops_skip_the_idle_worker() {
    prefork("prefork-idle", 1);
}

/// A process execs into another program keeping the socket: the drops before the exec stay on
/// the old `comm`, those after it go to the new one, and together they are the kernel's count.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn exec_keeping_the_fd_moves_the_drops_to_the_new_comm() {
    let progs = Programs::new("exec");
    let exporter = Exporter::start(&[]);
    let execd = progs.path("bsp-execd");
    let (mut child, ready) = progs.start("exec", &[execd.to_str().unwrap()]);
    let pid: u32 = field(&ready, "pid").parse().unwrap();
    let inode: u64 = field(&ready, "inode").parse().unwrap();
    let port = field(&ready, "port").to_string();
    // Before and after the exec the process is two programs: two identities in /metrics.
    let by_comm = |m: &Metrics, comm: &str| m.sum(DROPS, &[("comm", comm)]) + 0.0;

    flood(&port, 3000);
    let before = kernel_drops(pid, inode);
    assert!(
        before > 1000,
        "the flood should overflow the buffer ({before})"
    );
    wait_sum(
        &exporter,
        &[pid],
        before,
        "drops before the exec = the kernel's",
    );
    assert_eq!(by_comm(&exporter.scrape(), "bsp-launcher"), before as f64);
    assert_eq!(by_comm(&exporter.scrape(), "bsp-execd"), 0.0);

    child.send("exec").unwrap();
    child.wait_line("EXECED", Duration::from_secs(30)).unwrap();
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .unwrap()
            .trim(),
        "bsp-execd"
    );
    flood(&port, 5000);
    let total = kernel_drops(pid, inode);
    assert!(
        total > before + 1000,
        "the second flood should overflow too ({total})"
    );
    // The per-process row starts again at the exec (a new program); the two identities'
    // series together are the socket's whole count.
    let m = eventually(Duration::from_secs(15), "all drops = the kernel's", || {
        let m = exporter.scrape();
        (by_comm(&m, "bsp-launcher") + by_comm(&m, "bsp-execd") == total as f64).then_some(m)
    });
    assert_eq!(
        by_comm(&m, "bsp-launcher"),
        before as f64,
        "the old comm keeps its drops"
    );
    assert_eq!(
        by_comm(&m, "bsp-execd"),
        (total - before) as f64,
        "the new comm gets the rest"
    );
    eprintln!(
        "exec: kernel drops column {before} before the exec, {total} in all; bufscope {} on comm=bsp-launcher, {} on comm=bsp-execd (pid {pid})",
        by_comm(&m, "bsp-launcher"),
        by_comm(&m, "bsp-execd")
    );
}

/// The socket inodes `pid` holds (`/proc/<pid>/fd`).
fn socket_inodes(pid: u32) -> Vec<u64> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            let l = l.to_str()?.to_string();
            l.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

/// The inode of the UDP socket bound to `port` in `pid`'s network namespace.
fn udp_inode_on_port(pid: u32, port: u16) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/udp")).ok()?;
    text.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let p = u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok()?;
        (p == port).then(|| f.get(9)?.parse().ok())?
    })
}

/// Real socat: `socat -u UDP4-RECV:PORT,rcvbuf=4096 SYSTEM:'sleep 60'` creates the socket and
/// reads it; its `SYSTEM:` helper (a forked socat that runs `sh -c 'sleep 60'`) only inherits
/// the fd. After a 5,000-datagram flood, every drop of the kernel's drops column is on socat's
/// pid, none on the helper (the creator wins while it holds the socket; the newest holder only
/// when it is gone).
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn an_inherited_fd_does_not_blame_the_helper_child() {
    let exporter = Exporter::start(&[]);
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut socat = Command::new("socat");
    // Its own process group: the helper and its shell go with it at the end.
    std::os::unix::process::CommandExt::process_group(&mut socat, 0);
    let mut socat = socat
        .args([
            "-u",
            &format!("UDP4-RECV:{port},rcvbuf=4096"),
            "SYSTEM:sleep 60",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("socat");
    let spid = socat.id();
    let (inode, child) = eventually(
        Duration::from_secs(10),
        "socat's socket and its SYSTEM: child holding it",
        || {
            let inode = udp_inode_on_port(spid, port)?;
            let children =
                std::fs::read_to_string(format!("/proc/{spid}/task/{spid}/children")).ok()?;
            let child: u32 = children.split_whitespace().next()?.parse().ok()?;
            (socket_inodes(spid).contains(&inode) && socket_inodes(child).contains(&inode))
                .then_some((inode, child))
        },
    );
    // Paced datagrams socat reads and forwards until the helper's end of the socketpair,
    // which `sleep` never reads, is full and socat blocks: from then on it reads nothing, so
    // no reader of the socket can be seen and the holder rule alone decides.
    // (Slow enough that socat keeps up until then: no drop, so nothing arms the reader hook
    // while socat still reads.)
    std::thread::sleep(Duration::from_secs(1));
    let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut paced = 0;
    while kernel_drops(spid, inode) == 0 && paced < 3000 {
        tx.send_to(&[0x5a; 1000], ("127.0.0.1", port)).unwrap();
        paced += 1;
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        kernel_drops(spid, inode) > 0,
        "socat should stop reading once its helper's socketpair is full ({paced} sent)"
    );
    flood(&port.to_string(), 5000);
    let kernel = kernel_drops(spid, inode);
    assert!(
        kernel > 1000,
        "the flood should overflow socat's 4 KiB buffer ({kernel})"
    );
    let m = wait_sum(&exporter, &[spid], kernel, "socat's drops = the kernel's");
    assert_eq!(
        on_pid(&m, child),
        0.0,
        "nothing on the helper child that only inherited the fd"
    );
    eprintln!(
        "socat SYSTEM: helper: {paced} paced datagrams until socat blocked, then 5000 more: kernel drops column {kernel}; bufscope {} on socat {spid}, {} on its helper child {child}",
        on_pid(&m, spid),
        on_pid(&m, child)
    );
    // SAFETY: kill(2) of the process group socat leads (its own, made above).
    unsafe { libc::kill(-(spid as i32), libc::SIGKILL) };
    let _ = socat.wait();
}

/// A helper that execs carries its new name for its events too: one `SO_RCVBUF` call before
/// the exec (as `bsp-launcher`), one `SO_SNDBUF` call after it (as `bsp-execd`), each on the
/// series of the name the process had when it made the call.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn events_after_an_exec_carry_the_new_comm() {
    let progs = Programs::new("sockopt-exec");
    let exporter = Exporter::start(&[]);
    let execd = progs.path("bsp-execd");
    let (mut child, ready) = progs.start("sockopt-exec", &[execd.to_str().unwrap()]);
    let p = field(&ready, "pid").to_string();
    let calls = |m: &Metrics, comm: &str, option: &str| {
        m.sum(
            "bufscope_setsockopt_total",
            &[("pid", p.as_str()), ("comm", comm), ("option", option)],
        ) + 0.0
    };
    eventually(Duration::from_secs(10), "the call before the exec", || {
        (calls(&exporter.scrape(), "bsp-launcher", "SO_RCVBUF") == 1.0).then_some(())
    });
    child.send("exec").unwrap();
    child.wait_line("EXECED", Duration::from_secs(30)).unwrap();
    let m = eventually(Duration::from_secs(10), "the call after the exec", || {
        let m = exporter.scrape();
        (calls(&m, "bsp-execd", "SO_SNDBUF") == 1.0).then_some(m)
    });
    assert_eq!(
        calls(&m, "bsp-launcher", "SO_SNDBUF"),
        0.0,
        "the call after the exec is not on the old name"
    );
    assert_eq!(
        calls(&m, "bsp-launcher", "SO_RCVBUF"),
        1.0,
        "the old name keeps its call"
    );
    eprintln!(
        "exec: SO_RCVBUF 1 on comm=bsp-launcher, SO_SNDBUF 1 on comm=bsp-execd (pid {p}), as the program made them"
    );
}
