//! Per-socket findings against a real daemon as Debian packages it: unbound (a resolver that
//! asks for `so-rcvbuf` with `SO_RCVBUFFORCE` first and falls back to a plain `SO_RCVBUF`
//! when refused), run in a network namespace this test creates, first without
//! `CAP_NET_ADMIN`, then — the fix — restarted with it. Every number of the finding is
//! compared with the kernel's own: `ss -m` `rb` of the daemon's socket, the `drops` column of
//! `/proc/<pid>/net/udp`, `net.core.rmem_max` and its file mode as the namespace shows them.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bufscope_integration::fixtures::{WITHOUT_CAP_NET_ADMIN, rmem_max};
use bufscope_integration::{Exporter, TempDir, Workload, bufscope_bin, eventually, proc_udp_drops};
use serde_json::Value;

const UNBOUND: &str = "/usr/sbin/unbound";
/// unbound's port inside the namespace (nothing else listens there: the namespace is new).
const PORT: u16 = 5353;

/// A network namespace made with `ip netns add`, deleted on drop.
struct Netns(String);

impl Netns {
    fn new() -> Self {
        let name = format!("bsf-unbound-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
        run(Command::new("ip").args(["netns", "add", &name]));
        let ns = Self(name);
        run(Command::new("ip").args(["-n", &ns.0, "link", "set", "lo", "up"]));
        ns
    }

    /// `cmd` run inside the namespace.
    fn exec(&self, cmd: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.0]).args(cmd);
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Runs `cmd` to completion; panics with its output unless it succeeded. Returns stdout.
fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A running unbound; killed (after a SIGCONT, in case it is stopped) and reaped on drop.
struct Unbound {
    child: Child,
    log: PathBuf,
}

impl Unbound {
    /// Starts `unbound -d` with `conf` in `ns` (`ip netns exec` and `setpriv` exec it: the
    /// child's pid is unbound's), optionally without `CAP_NET_ADMIN`, and waits until its
    /// UDP socket is bound.
    fn start(ns: &Netns, conf: &Path, without_cap_net_admin: bool, log: PathBuf) -> Self {
        let mut argv: Vec<&str> = Vec::new();
        if without_cap_net_admin {
            argv.extend(WITHOUT_CAP_NET_ADMIN);
        }
        argv.extend([UNBOUND, "-d", "-c", conf.to_str().unwrap()]);
        let out = std::fs::File::create(&log).unwrap();
        let child = ns
            .exec(&argv)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        let u = Self { child, log };
        eventually(Duration::from_secs(15), "unbound's UDP socket", || {
            (u.comm() == "unbound" && u.socket().is_some()).then_some(())
        });
        u
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn comm(&self) -> String {
        std::fs::read_to_string(format!("/proc/{}/comm", self.pid()))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// The inode of its UDP socket on 127.0.0.1:`PORT`, from `/proc/<pid>/net/udp` (its
    /// namespace's), held by it (`/proc/<pid>/fd`).
    fn socket(&self) -> Option<u64> {
        let text = std::fs::read_to_string(format!("/proc/{}/net/udp", self.pid())).ok()?;
        let local = format!("0100007F:{PORT:04X}");
        let inode: u64 = text.lines().skip(1).find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(1) == Some(&local.as_str()))
                .then(|| f.get(9)?.parse().ok())
                .flatten()
        })?;
        let want = format!("socket:[{inode}]");
        let held = std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .ok()?
            .flatten()
            .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy() == want));
        held.then_some(inode)
    }

    fn signal(&self, sig: i32) {
        bufscope_testkit::signal(self.pid(), sig).unwrap_or_else(|e| panic!("{e:#}"));
    }

    /// Stops it gracefully (SIGTERM) and reaps it.
    fn stop(mut self) {
        self.signal(libc::SIGCONT);
        self.signal(libc::SIGTERM);
        let _ = self.child.wait();
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Unbound {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The kernel's receive buffer of UDP socket `inode` in `ns`: `rb` of `ss -uam`'s skmem
/// (`sk_rcvbuf`, what `getsockopt(SO_RCVBUF)` returns).
fn ss_rb(ns: &Netns, inode: u64) -> u64 {
    let text = run(&mut ns.exec(&["ss", "-uamneH"]));
    let ino = format!("ino:{inode} ");
    let mut lines = text.lines().skip_while(|l| !l.contains(&ino));
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("no ino:{inode} in {text}"));
    let second = lines.next().unwrap_or("");
    bufscope_testkit::skmem_rb(first)
        .or_else(|| bufscope_testkit::skmem_rb(second))
        .unwrap_or_else(|| panic!("no skmem rb for ino:{inode} in {text}"))
}

/// `/api/v1/findings`.
fn findings(e: &Exporter) -> Vec<Value> {
    let (status, body) = e.get("/api/v1/findings");
    assert_eq!(status, 200, "{body}");
    let doc: Value = serde_json::from_str(&body).unwrap();
    doc["findings"].as_array().unwrap().clone()
}

/// The finding of socket `inode` with `verdict`, if bufscope shows one.
fn of_socket(fs: &[Value], inode: u64, verdict: &str) -> Option<Value> {
    fs.iter()
        .find(|f| f["socket"]["inode"].as_u64() == Some(inode) && f["verdict"] == verdict)
        .cloned()
}

fn notes(call: &Value) -> Vec<&str> {
    call["notes"]
        .as_array()
        .map(|n| n.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// unbound without CAP_NET_ADMIN asks for 4 × rmem_max: SO_RCVBUFFORCE is refused, the
/// SO_RCVBUF fallback is clamped to rmem_max (unbound itself stays silent: it warns only below
/// half the request, and the readback is doubled). Stopped while datagrams arrive, its socket
/// overflows. bufscope's one finding for that socket tells the calls, the size, the limit and
/// the drops as the kernel counts them, and where the fix goes (unbound's `so-rcvbuf`, the
/// capability, the host). Restarted with CAP_NET_ADMIN, FORCE takes, and the finding turns
/// `resolved` (`restarted`) with the before and after the kernel shows.
#[test]
#[ignore = "needs root and unbound: run via cargo xtask test"]
fn unbound_without_cap_net_admin_costs_then_a_restart_with_it_resolves() {
    assert!(
        Path::new(UNBOUND).exists(),
        "{UNBOUND} missing: cargo xtask setup installs the Debian package unbound"
    );
    let rmem_max = rmem_max();
    let request = (4 * rmem_max).min(i64::from(i32::MAX) / 2);
    let dir = TempDir::new("findings-unbound");
    let conf = dir.path().join("unbound.conf");
    std::fs::write(
        &conf,
        format!(
            "server:\n    interface: 127.0.0.1\n    port: {PORT}\n    do-ip6: no\n    \
             do-tcp: no\n    num-threads: 1\n    so-reuseport: no\n    so-rcvbuf: {request}\n    \
             username: \"\"\n    chroot: \"\"\n    directory: \"{dir}\"\n    pidfile: \"\"\n    \
             use-syslog: no\n    logfile: \"\"\n    verbosity: 1\n    do-daemonize: no\n    \
             module-config: \"iterator\"\n    local-zone: \"test.\" static\n\
             remote-control:\n    control-enable: no\n",
            dir = dir.path().display()
        ),
    )
    .unwrap();

    // The closed socket leaves bufscope's rooms at the next GC (a quarter of --retention).
    let e = Exporter::start(&["--retention", "20s"]);
    let ns = Netns::new();
    // The limit as the socket's namespace sees it, from the kernel.
    let ns_rmem_max: i64 = run(&mut ns.exec(&["cat", "/proc/sys/net/core/rmem_max"]))
        .trim()
        .parse()
        .unwrap();
    let mode = run(&mut ns.exec(&["stat", "-c", "%a", "/proc/sys/net/core/rmem_max"]));
    let scope = if u32::from_str_radix(mode.trim(), 8).unwrap() & 0o222 != 0 {
        "netns"
    } else {
        "read_only"
    };

    // 1. Without CAP_NET_ADMIN.
    let u = Unbound::start(&ns, &conf, true, dir.path().join("unbound1.log"));
    let (pid1, ino1) = (u.pid(), u.socket().unwrap());
    let rb1 = ss_rb(&ns, ino1);
    assert_eq!(
        rb1 as i64,
        2 * rmem_max,
        "kernel: the fallback clamped to rmem_max"
    );
    assert!(
        !u.log().contains("was not granted"),
        "unbound itself says nothing: {}",
        u.log()
    );
    // Stopped, it reads nothing: a flood of twice what the buffer can hold overflows it.
    u.signal(libc::SIGSTOP);
    let count = (rb1 / 500).to_string();
    let pid1_s = pid1.to_string();
    let port = PORT.to_string();
    let flood = Workload::start(&[
        "udp-flood",
        "--port",
        &port,
        "--count",
        &count,
        "--size",
        "1000",
        "--netns-of",
        &pid1_s,
    ]);
    assert!(flood.wait(), "flooder failed");
    let drops = proc_udp_drops(pid1, ino1).expect("unbound's socket in /proc/<pid>/net/udp");
    assert!(drops > 0, "the flood overflowed {rb1} B");
    u.signal(libc::SIGCONT);

    let f = eventually(
        Duration::from_secs(20),
        "a costing finding for unbound's socket with the kernel's drops",
        || {
            of_socket(&findings(&e), ino1, "costing")
                .filter(|f| f["evidence"]["drops_total"].as_f64() == Some(drops as f64))
        },
    );
    eprintln!(
        "unbound pid {pid1} ino {ino1}: kernel rb {rb1} drops {drops}; bufscope final_bytes {} \
         drops_total {} drops/s {} severity {}",
        f["story"]["final_bytes"],
        f["evidence"]["drops_total"],
        f["evidence"]["drops_per_second"],
        f["severity"]
    );
    assert_eq!(f["process"]["pid"].as_u64(), Some(u64::from(pid1)));
    assert_eq!(f["process"]["comm"], "unbound");
    assert_eq!(f["socket"]["proto"], "udp");
    let story = &f["story"];
    assert_eq!(story["direction"], "receive");
    assert_eq!(story["final_bytes"].as_u64(), Some(rb1), "ss -m rb");
    let calls = story["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "FORCE, then the fallback: {calls:?}");
    assert_eq!(calls[0]["option"], "SO_RCVBUFFORCE");
    assert_eq!(calls[0]["error"], "EPERM");
    assert!(notes(&calls[0]).contains(&"refused"), "{:?}", calls[0]);
    assert_eq!(calls[1]["option"], "SO_RCVBUF");
    assert_eq!(calls[1]["requested"].as_i64(), Some(request));
    assert_eq!(calls[1]["effective"].as_u64(), Some(rb1));
    let n = notes(&calls[1]);
    assert!(n.contains(&"fallback") && n.contains(&"clamped"), "{n:?}");
    let limit = &story["limit"];
    assert_eq!(limit["sysctl"], "net.core.rmem_max");
    assert_eq!(limit["bytes"].as_i64(), Some(ns_rmem_max));
    eprintln!(
        "limit {limit}; the namespace shows rmem_max {ns_rmem_max} (mode {})",
        mode.trim()
    );
    // Checked last (the rest of the story still runs when it fails).
    let scope_seen = limit["scope"].clone();
    assert!(f["evidence"]["drops_per_second"].as_f64().unwrap() > 0.0);
    let fixes = f["fixes"].as_array().unwrap();
    let app = fixes
        .iter()
        .find(|x| x["scope"] == "application")
        .unwrap_or_else(|| panic!("{fixes:?}"));
    assert_eq!(app["config_key"], "so-rcvbuf", "{app}");
    assert!(
        fixes
            .iter()
            .any(|x| x["scope"] == "host" && x["possible"] == true),
        "{fixes:?}"
    );
    let p1 = pid1.to_string();
    let m = e.scrape();
    assert_eq!(
        m.sum(
            "bufscope_socket_drops_total",
            &[
                ("pid", p1.as_str()),
                ("proto", "udp"),
                ("reason", "SOCKET_RCVBUFF")
            ]
        ),
        drops as f64,
        "the kernel's drops column"
    );
    assert!(m.sum("bufscope_finding", &[("comm", "unbound")]) >= 1.0);
    u.stop();

    // 2. The fix: unbound restarted with CAP_NET_ADMIN; FORCE takes the whole request.
    let u = Unbound::start(&ns, &conf, false, dir.path().join("unbound2.log"));
    let (pid2, ino2) = (u.pid(), u.socket().unwrap());
    let rb2 = ss_rb(&ns, ino2);
    assert_eq!(rb2 as i64, 2 * request, "kernel: FORCE is not clamped");
    // The old socket's drops must first be idle 30 s (the drops room's GC), then the next
    // evaluation finds the program's new socket.
    let restarted = std::time::Instant::now();
    let mut last = Vec::new();
    let f = loop {
        let fs = findings(&e);
        if let Some(f) = of_socket(&fs, ino1, "resolved") {
            break f;
        }
        last = fs;
        assert!(
            restarted.elapsed() < Duration::from_secs(120),
            "no resolved finding for {ino1} within 120 s of the restart: {last:#?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    drop(last);
    eprintln!(
        "resolved {:.0} s after the restart",
        restarted.elapsed().as_secs_f64()
    );
    let r = &f["resolved"];
    eprintln!(
        "resolved: {} before {} after {}; kernel: before rb {rb1} ({drops} drops), after rb {rb2} \
         ({} drops)",
        r["change"],
        r["before"],
        r["after"],
        proc_udp_drops(pid2, ino2).unwrap_or(u64::MAX)
    );
    assert_eq!(r["change"], "restarted");
    assert_eq!(r["before"]["pid"].as_u64(), Some(u64::from(pid1)));
    assert_eq!(r["before"]["inode"].as_u64(), Some(ino1));
    assert_eq!(r["before"]["bytes"].as_u64(), Some(rb1));
    assert!(r["before"]["drops_per_second"].as_f64().unwrap() > 0.0);
    assert_eq!(r["after"]["pid"].as_u64(), Some(u64::from(pid2)));
    assert_eq!(r["after"]["inode"].as_u64(), Some(ino2));
    assert_eq!(r["after"]["bytes"].as_u64(), Some(rb2), "ss -m rb after");
    assert_eq!(
        proc_udp_drops(pid2, ino2),
        Some(0),
        "kernel: no drops after"
    );
    assert_eq!(r["after"]["drops_per_second"].as_f64(), Some(0.0));
    assert!(
        of_socket(&findings(&e), ino2, "costing").is_none(),
        "the new socket does not cost"
    );
    // `bufscope explain --since` shows what changed: the resolved finding, on the old pid.
    let text = run(Command::new(bufscope_bin()).args([
        "explain",
        "--url",
        &format!("http://{}", e.addr),
        "--since",
        "10m",
    ]));
    assert!(
        text.lines()
            .any(|l| l.contains("[resolved]") && l.contains(&format!("unbound (pid {pid1})"))),
        "{text}"
    );
    u.stop();
    assert_eq!(scope_seen, scope, "the namespace's rmem_max file mode");
}
