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
    /// A new namespace `bsf-<tag>-<pid>` with its loopback up.
    fn new(tag: &str) -> Self {
        let name = format!("bsf-{tag}-{}", std::process::id());
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

/// A running daemon of the distribution; killed (after a SIGCONT, in case it is stopped) and
/// reaped on drop.
struct Daemon {
    child: Child,
    log: PathBuf,
    /// Its `/proc/<pid>/comm` once it runs (not the wrappers' that exec it).
    comm: &'static str,
    /// The UDP port whose socket the test watches.
    port: u16,
    /// Its local address as `/proc/net/udp` writes it (`0100007F` 127.0.0.1, `00000000` any).
    addr: &'static str,
}

impl Daemon {
    /// Starts `argv` in `ns` (`ip netns exec` and the wrappers exec it: the child's pid is the
    /// daemon's) with `env`, its output to `log`, and waits until it is `comm` and holds its UDP
    /// socket on 127.0.0.1:`port`.
    fn start(
        ns: &Netns,
        argv: &[&str],
        env: &[(&str, &str)],
        comm: &'static str,
        port: u16,
        log: PathBuf,
    ) -> Self {
        Self::start_on(ns, argv, env, comm, ("0100007F", port), log)
    }

    /// [`Daemon::start`] for a socket on `addr` (as `/proc/net/udp` writes it) and port.
    fn start_on(
        ns: &Netns,
        argv: &[&str],
        env: &[(&str, &str)],
        comm: &'static str,
        (addr, port): (&'static str, u16),
        log: PathBuf,
    ) -> Self {
        let out = std::fs::File::create(&log).unwrap();
        let child = ns
            .exec(argv)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        let d = Self {
            child,
            log,
            comm,
            port,
            addr,
        };
        eventually(
            Duration::from_secs(20),
            &format!("{comm}'s UDP socket on port {port}"),
            || (d.comm() == comm && d.socket().is_some()).then_some(()),
        );
        d
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

    /// The inode of its UDP socket on `addr`:`port`, from `/proc/<pid>/net/udp` (its
    /// namespace's), held by it (`/proc/<pid>/fd`).
    fn socket(&self) -> Option<u64> {
        let text = std::fs::read_to_string(format!("/proc/{}/net/udp", self.pid())).ok()?;
        let local = format!("{}:{:04X}", self.addr, self.port);
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

    /// Stops it (SIGSTOP: it reads nothing), floods its socket with `count` datagrams of 1000
    /// bytes from inside its namespace, lets it go on (SIGCONT) and returns the drops the kernel
    /// counted on the socket (`/proc/<pid>/net/udp`).
    fn overflow(&self, inode: u64, count: u64) -> u64 {
        self.signal(libc::SIGSTOP);
        let (count, pid, port) = (
            count.to_string(),
            self.pid().to_string(),
            self.port.to_string(),
        );
        let flood = Workload::start(&[
            "udp-flood",
            "--port",
            &port,
            "--count",
            &count,
            "--size",
            "1000",
            "--netns-of",
            &pid,
        ]);
        assert!(flood.wait(), "flooder failed");
        let drops = proc_udp_drops(self.pid(), inode)
            .unwrap_or_else(|| panic!("{}'s socket in /proc/<pid>/net/udp", self.comm));
        self.signal(libc::SIGCONT);
        drops
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = bufscope_testkit::signal(self.pid(), libc::SIGCONT);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// unbound (`unbound -d -c conf`) in `ns`, optionally without `CAP_NET_ADMIN`.
fn unbound(ns: &Netns, conf: &Path, without_cap_net_admin: bool, log: PathBuf) -> Daemon {
    let mut argv: Vec<&str> = Vec::new();
    if without_cap_net_admin {
        argv.extend(WITHOUT_CAP_NET_ADMIN);
    }
    argv.extend([UNBOUND, "-d", "-c", conf.to_str().unwrap()]);
    Daemon::start(ns, &argv, &[], "unbound", PORT, log)
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
    let ns = Netns::new("unbound");
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
    let u = unbound(&ns, &conf, true, dir.path().join("unbound1.log"));
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
    let drops = u.overflow(ino1, rb1 / 500);
    assert!(drops > 0, "the flood overflowed {rb1} B");

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
    let u = unbound(&ns, &conf, false, dir.path().join("unbound2.log"));
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

const CADDY: &str = "/usr/bin/caddy";
/// Caddy's HTTPS port inside its namespace: TCP for HTTP/1.1 and HTTP/2, UDP for HTTP/3.
const CADDY_PORT: u16 = 8443;

/// Caddy as Debian packages it, serving HTTP/3 on 127.0.0.1:`CADDY_PORT` (its quic-go sizes
/// the UDP socket) with a certificate of its own internal CA, in `ns`.
fn caddy(ns: &Netns, dir: &Path, log: PathBuf) -> Daemon {
    let conf = dir.join("Caddyfile");
    let data = dir.join("data");
    std::fs::write(
        &conf,
        format!(
            "{{\n\tadmin off\n\tskip_install_trust\n\tauto_https disable_redirects\n\t\
             storage file_system {data}\n\tservers {{\n\t\tprotocols h1 h2 h3\n\t}}\n}}\n\
             https://localhost:{CADDY_PORT} {{\n\tbind 127.0.0.1\n\ttls internal\n\t\
             respond \"ok\"\n}}\n",
            data = data.display()
        ),
    )
    .unwrap();
    let (home, cfg) = (dir.display().to_string(), dir.join("cfg"));
    let (data_s, cfg_s) = (data.display().to_string(), cfg.display().to_string());
    let conf_s = conf.display().to_string();
    Daemon::start(
        ns,
        &[CADDY, "run", "--config", &conf_s, "--adapter", "caddyfile"],
        &[
            ("HOME", home.as_str()),
            ("XDG_DATA_HOME", data_s.as_str()),
            ("XDG_CONFIG_HOME", cfg_s.as_str()),
        ],
        "caddy",
        CADDY_PORT,
        log,
    )
}

/// Caddy's HTTP/3 listener on the kernel's default limits (6.18: `rmem_max` 4 MiB). Its
/// quic-go sizes the UDP socket with `SO_RCVBUF`, reads the size back and warns only when it is
/// short; here nothing is clamped and Caddy is silent. bufscope shows nothing for that socket
/// while it does not drop (a request is not a problem); stopped under a flood, the socket drops
/// and bufscope gives exactly one finding for it — `costing`, with the calls quic-go made, the
/// size and the drops the kernel counts —, whose fixes say what can change it (Caddy has no
/// setting; the request was granted in full, so raising `rmem_max` alone changes nothing).
/// Once the drops are older than the advice window the same finding is `benign`.
#[test]
#[ignore = "needs root and caddy: run via cargo xtask test"]
fn caddy_http3_quic_go_sizing_costs_only_while_its_socket_drops() {
    assert!(
        Path::new(CADDY).exists(),
        "{CADDY} missing: cargo xtask setup installs the Debian package caddy"
    );
    let rmem_max = rmem_max();
    let dir = TempDir::new("findings-caddy");
    let e = Exporter::start(&["--advice.window", "10s"]);
    let ns = Netns::new("caddy");
    let ns_rmem_max: i64 = run(&mut ns.exec(&["cat", "/proc/sys/net/core/rmem_max"]))
        .trim()
        .parse()
        .unwrap();
    let c = caddy(&ns, dir.path(), dir.path().join("caddy.log"));
    let (pid, ino) = (c.pid(), c.socket().unwrap());
    let pid_s = pid.to_string();
    let rb = ss_rb(&ns, ino);
    assert!(
        rb as i64 <= 2 * rmem_max,
        "kernel: rb {rb} within 2 × rmem_max"
    );
    // bufscope counted quic-go's calls on the socket.
    let calls_seen = eventually(
        Duration::from_secs(15),
        "bufscope counts Caddy's setsockopt calls",
        || {
            let n = e.scrape().sum(
                "bufscope_setsockopt_total",
                &[("pid", pid_s.as_str()), ("proto", "udp")],
            );
            (n >= 1.0).then_some(n)
        },
    );
    // A request that was granted is not a finding: nothing for the socket while it does not
    // drop (several evaluations).
    for _ in 0..6 {
        let fs = findings(&e);
        assert!(
            !fs.iter()
                .any(|f| f["socket"]["inode"].as_u64() == Some(ino)),
            "no finding for Caddy's socket before it drops: {fs:#?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        !c.log().contains("receive buffer size"),
        "quic-go warned: {}",
        c.log()
    );

    // Stopped, Caddy reads nothing: a flood of twice what the buffer can hold overflows it.
    let drops = c.overflow(ino, rb / 500);
    assert!(drops > 0, "the flood overflowed {rb} B");
    let f = eventually(
        Duration::from_secs(20),
        "a costing finding for Caddy's socket with the kernel's drops",
        || {
            of_socket(&findings(&e), ino, "costing")
                .filter(|f| f["evidence"]["drops_total"].as_f64() == Some(drops as f64))
        },
    );
    let fs = findings(&e);
    let mine: Vec<&Value> = fs
        .iter()
        .filter(|f| f["socket"]["inode"].as_u64() == Some(ino))
        .collect();
    eprintln!(
        "caddy pid {pid} ino {ino}: kernel rb {rb} drops {drops}; bufscope {} finding(s): kind {} \
         verdict {} severity {} final_bytes {} drops_total {} drops/s {}\ncalls {}\nfixes {:#}",
        mine.len(),
        f["kind"],
        f["verdict"],
        f["severity"],
        f["story"]["final_bytes"],
        f["evidence"]["drops_total"],
        f["evidence"]["drops_per_second"],
        f["story"]["calls"],
        f["fixes"]
    );
    assert_eq!(mine.len(), 1, "one finding for the socket: {mine:#?}");
    assert_eq!(f["kind"], "udp_rcvbuf_drops");
    assert_eq!(f["process"]["pid"].as_u64(), Some(u64::from(pid)));
    assert_eq!(f["process"]["comm"], "caddy");
    assert_eq!(f["socket"]["proto"], "udp");
    assert!(f["evidence"]["drops_per_second"].as_f64().unwrap() > 0.0);
    let story = &f["story"];
    assert_eq!(story["direction"], "receive");
    assert_eq!(story["final_bytes"].as_u64(), Some(rb), "ss -m rb");
    let calls = story["calls"].as_array().unwrap();
    assert_eq!(
        story["calls_total"].as_f64(),
        Some(calls_seen),
        "every call bufscope counted for the process is on this socket's story: {calls:?}"
    );
    let last = calls.last().expect("quic-go sized the socket");
    assert_eq!(last["effective"].as_u64(), Some(rb), "ss -m rb: {last}");
    let requested = last["requested"].as_i64().unwrap();
    // The kernel doubles a request up to rmem_max (FORCE: without a cap): `clamped` exactly when
    // the readback is not twice the request.
    assert_eq!(
        notes(last).contains(&"clamped"),
        rb as i64 != 2 * requested,
        "{last}"
    );
    assert_eq!(story["limit"]["sysctl"], "net.core.rmem_max");
    assert_eq!(story["limit"]["bytes"].as_i64(), Some(ns_rmem_max));
    let fixes = f["fixes"].as_array().unwrap();
    let app = fixes
        .iter()
        .find(|x| x["scope"] == "application")
        .unwrap_or_else(|| panic!("{fixes:?}"));
    assert_eq!(app["possible"], false, "Caddy has no setting for it: {app}");
    let host = fixes
        .iter()
        .find(|x| x["scope"] == "host")
        .unwrap_or_else(|| panic!("{fixes:?}"));
    assert_eq!(host["possible"], true, "{host}");
    if !notes(last).contains(&"clamped") {
        // The request was granted whole: a higher ceiling changes nothing for this program.
        let how = host["how"].as_str().unwrap();
        assert!(
            !how.starts_with("sysctl -w net.core.rmem_max"),
            "a higher rmem_max does not enlarge a request already granted: {how}"
        );
        assert!(how.contains("guard"), "{how}");
    }
    let m = e.scrape();
    assert_eq!(
        m.sum(
            "bufscope_socket_drops_total",
            &[
                ("pid", pid_s.as_str()),
                ("proto", "udp"),
                ("reason", "SOCKET_RCVBUFF")
            ]
        ),
        drops as f64,
        "the kernel's drops column"
    );
    assert_eq!(
        m.sum(
            "bufscope_finding",
            &[("comm", "caddy"), ("kind", "udp_rcvbuf_drops")]
        ),
        1.0
    );

    // No more drops: once they are older than the window (10 s), the finding is benign.
    let f = eventually(
        Duration::from_secs(30),
        "Caddy's finding benign once its drops left the window",
        || of_socket(&findings(&e), ino, "benign"),
    );
    assert_eq!(
        proc_udp_drops(pid, ino),
        Some(drops),
        "kernel: no drops since"
    );
    assert_eq!(f["evidence"]["drops_per_second"].as_f64(), Some(0.0), "{f}");
    assert_ne!(f["severity"], "critical", "{f}");
    c.stop();
}

/// One field of `ss -tnieimH` for a connection: the number after `key` (up to the next
/// non-numeric character), e.g. `tb` inside `skmem:(…)`, `rtt:`, `bytes_acked:`.
fn ss_field(line: &str, key: &str) -> Option<f64> {
    line.split([' ', ',', '(', ')'])
        .find_map(|t| t.strip_prefix(key))
        .and_then(|v| {
            let n: String = v
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            n.parse().ok()
        })
}

/// The sender's connection as `ss -tnieimH` shows it in the lab's namespace `a`: the socket's
/// line and its detail lines joined.
fn ss_conn(ns: &bufscope_netlab::Netns, port: u16) -> Option<String> {
    let filter = format!("dport = :{port}");
    let text = ns
        .exec("ss", ["-tnieimH", "state", "established", filter.as_str()])
        .ok()?;
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    (!joined.is_empty()).then_some(joined)
}

/// A sender that sets `SO_SNDBUF` 96,000 on its established TCP connection (a VPN worker's
/// accepted TLS socket does this): the kernel sets `SOCK_SNDBUF_LOCK` and pins the send buffer
/// at 192,000 bytes for the connection's life. Through the WAN lab's 200 Mbit/s, 100 ms link,
/// that buffer, not the link, sets the rate. bufscope's `tcp_sndbuf_lock` finding for that
/// socket gives the buffer, the RTT and the ceiling (buffer ÷ RTT), the rate and the share of
/// time the send buffer limited the connection, each checked against the kernel's `tcp_info`
/// and skmem (`ss -tnim`), and says it costs.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn tcp_send_lock_on_an_established_connection_caps_it_at_buffer_over_rtt() {
    use bufscope_integration::Spawned;
    use bufscope_netlab::{Lab, LabConfig, LinkParams};
    const TCP_PORT: u16 = 5401;
    const SNDBUF: u32 = 96_000;
    let e = Exporter::start(&[]);
    let lab = Lab::new(LabConfig::wan("bsfs", LinkParams::mbit(200).rtt_ms(100))).unwrap();
    let b_addr = lab.addr_b().to_string();
    let _sink = Spawned::new(lab.b().command("python3").args([
        "-c",
        &format!(
            "import socket\nl=socket.socket()\nl.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n\
             l.bind(('{b_addr}',{TCP_PORT}))\nl.listen(1)\nc,_=l.accept()\n\
             while c.recv(1<<16): pass\n"
        ),
    ]));
    std::thread::sleep(Duration::from_millis(500));
    let sender = Spawned::new(
        lab.a()
            .command("python3")
            .args([
                "-c",
                &format!(
                    "import socket,sys,time\ns=socket.create_connection(('{b_addr}',{TCP_PORT}))\n\
                     s.setsockopt(socket.SOL_SOCKET,socket.SO_SNDBUF,{SNDBUF})\n\
                     print('READY',s.getsockopt(socket.SOL_SOCKET,socket.SO_SNDBUF),flush=True)\n\
                     b=b'x'*65536\nend=time.time()+40\n\
                     while time.time()<end: s.sendall(b)\n"
                ),
            ])
            .stdout(Stdio::null()),
    );
    let pid = sender.pid();
    let pid_s = pid.to_string();
    let conn = eventually(Duration::from_secs(10), "the sender's connection", || {
        ss_conn(lab.a(), TCP_PORT).filter(|c| c.contains("ino:") && ss_field(c, "tb").is_some())
    });
    let ino = ss_field(&conn, "ino:").unwrap() as u64;
    let tb = ss_field(&conn, "tb").unwrap() as u64;
    assert_eq!(
        tb,
        2 * u64::from(SNDBUF),
        "kernel: the locked send buffer is doubled: {conn}"
    );
    // The connection reaches its ceiling; bufscope reads tcp_info every 5 s.
    let f = eventually(
        Duration::from_secs(30),
        "a costing tcp_sndbuf_lock finding for the sender's socket",
        || {
            findings(&e).into_iter().find(|f| {
                f["socket"]["inode"].as_u64() == Some(ino)
                    && f["kind"] == "tcp_sndbuf_lock"
                    && f["verdict"] == "costing"
            })
        },
    );
    // The kernel's view right after: rtt (ms), bytes_acked over 3 s, send-buffer-limited time.
    let k1 = ss_conn(lab.a(), TCP_PORT).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let k2 = ss_conn(lab.a(), TCP_PORT).unwrap();
    let acked = |c: &str| ss_field(c, "bytes_acked:").unwrap();
    let kernel_bps = (acked(&k2) - acked(&k1)) * 8.0 / 3.0;
    let kernel_rtt_us = ss_field(&k2, "rtt:").unwrap() * 1000.0;
    let ev = &f["evidence"];
    let rtt_us = ev["rtt_us"].as_f64().unwrap();
    let ceiling = ev["throughput_ceiling_bps"].as_f64().unwrap();
    let observed = ev["observed_bps"].as_f64().unwrap_or(0.0);
    let limited = ev["sndbuf_limited_ratio"].as_f64().unwrap_or(-1.0);
    eprintln!(
        "tcp send lock pid {pid} ino {ino}: kernel tb {tb} rtt {kernel_rtt_us:.0} µs rate \
         {:.2} Mbit/s ({}); bufscope sndbuf_bytes {} rtt_us {rtt_us} ceiling {:.2} Mbit/s \
         observed {:.2} Mbit/s sndbuf_limited {limited:.2} severity {}\nstory {}\nfixes {:#}",
        kernel_bps / 1e6,
        k2.split(' ')
            .filter(|t| t.starts_with("sndbuf_limited") || t.starts_with("busy"))
            .collect::<Vec<_>>()
            .join(" "),
        ev["sndbuf_bytes"],
        ceiling / 1e6,
        observed / 1e6,
        f["severity"],
        f["story"],
        f["fixes"]
    );
    assert_eq!(f["process"]["pid"].as_u64(), Some(u64::from(pid)));
    assert_eq!(ev["sndbuf_bytes"].as_f64(), Some(tb as f64), "ss -m tb");
    assert_eq!(f["story"]["final_bytes"].as_u64(), Some(tb), "ss -m tb");
    assert_eq!(f["story"]["direction"], "send");
    // tcp_info's srtt, sampled at another moment of a steady 100 ms path.
    assert!(
        (rtt_us - kernel_rtt_us).abs() <= 0.2 * kernel_rtt_us && rtt_us >= 90_000.0,
        "rtt: bufscope {rtt_us} µs, kernel {kernel_rtt_us} µs"
    );
    // The ceiling is the payload share of the locked buffer over the RTT (the kernel charges
    // each queued skb's truesize against it). The share bufscope read is checked against the
    // one `ss -m` w (wmem_queued) and tcp_info's bytes show for a filled queue.
    let ratio = ev["sndbuf_payload_ratio"]
        .as_f64()
        .expect("a send-limited queue: bufscope measured its payload share");
    let kernel_ratio = [&k1, &k2].into_iter().find_map(|k| {
        let w = ss_field(k, "w")?;
        let in_flight = ss_field(k, "bytes_sent:")?
            - ss_field(k, "bytes_retrans:").unwrap_or(0.0)
            - ss_field(k, "bytes_acked:")?;
        let payload = in_flight + ss_field(k, "notsent:").unwrap_or(0.0);
        (2.0 * w >= tb as f64 && payload > 0.0).then_some(payload / w)
    });
    eprintln!(
        "payload share of the send queue: bufscope {ratio:.3}, kernel (ss) {kernel_ratio:?}; \
         kernel rate / ceiling {:.2}, bufscope's observed / ceiling {:.2} (kernel rate / \
         buffer over RTT alone: {:.2})",
        kernel_bps / ceiling,
        observed / ceiling,
        kernel_bps / (tb as f64 * 8.0 / (rtt_us / 1e6))
    );
    assert!(ratio > 0.0 && ratio <= 1.0, "payload share {ratio}");
    if let Some(k) = kernel_ratio {
        assert!(
            (ratio - k).abs() <= 0.1 * k,
            "payload share: bufscope {ratio}, kernel {k}"
        );
    }
    // sendall() sleeps until the kernel wakes it with a third of the buffer free: the queue
    // refills from 2/3, 5/6 of it in flight on average.
    let expect = tb as f64 * ratio * 5.0 / 6.0 * 8.0 / (rtt_us / 1e6);
    assert!(
        (ceiling - expect).abs() <= 0.01 * expect,
        "ceiling {ceiling} = {tb} B × {ratio} × 5/6 × 8 ÷ {rtt_us} µs"
    );
    // The kernel's rate is the ceiling's: the buffer alone (0.54–0.61x) would fail this.
    assert!(
        kernel_bps <= 1.15 * ceiling && kernel_bps >= 0.75 * ceiling,
        "kernel's rate {kernel_bps} bit/s against bufscope's ceiling {ceiling}"
    );
    assert!(kernel_bps < 100e6, "the 200 Mbit/s link is not the limit");
    assert!(
        observed >= 0.5 * kernel_bps && observed <= 1.5 * kernel_bps,
        "bufscope's observed {observed} against the kernel's {kernel_bps}"
    );
    assert!(limited >= 0.1, "tcpi_sndbuf_limited share {limited}");
    let calls = f["story"]["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["option"], "SO_SNDBUF");
    assert_eq!(calls[0]["requested"].as_u64(), Some(u64::from(SNDBUF)));
    assert_eq!(calls[0]["effective"].as_u64(), Some(tb));
    let n = notes(&calls[0]);
    assert!(n.contains(&"locked") && n.contains(&"established"), "{n:?}");
    let fixes = f["fixes"].as_array().unwrap();
    assert!(
        fixes[0]["how"]
            .as_str()
            .unwrap()
            .contains("does not change the window scale"),
        "{fixes:?}"
    );
    assert_eq!(
        e.scrape().sum(
            "bufscope_sndbuf_locks_total",
            &[("pid", pid_s.as_str()), ("proto", "tcp")]
        ),
        1.0
    );
}

const CHARON: &str = "/usr/lib/ipsec/charon";

/// strongSwan's charon as Debian packages it (`strongswan-charon`), in `ns` with a
/// strongswan.conf of its own (`STRONGSWAN_CONF`): the IKE sockets on UDP 500 and 4500, and
/// kernel-netlink's XFRM socket sized by its key (`receive_buffer_size`, with FORCE).
fn charon(ns: &Netns, dir: &Path, log: PathBuf) -> Daemon {
    let conf = dir.join("strongswan.conf");
    std::fs::write(
        &conf,
        "charon {\n    load = random nonce aes sha1 sha2 hmac gmp pem pkcs1 x509 pubkey \
         kernel-netlink socket-default\n    install_routes = no\n    port = 500\n    \
         port_nat_t = 4500\n    plugins {\n        kernel-netlink {\n            \
         receive_buffer_size = 8388608\n            force_receive_buffer_size = yes\n        \
         }\n    }\n    filelog {\n        stderr {\n            default = 1\n        }\n    \
         }\n}\n",
    )
    .unwrap();
    let conf_s = conf.display().to_string();
    Daemon::start_on(
        ns,
        &[CHARON],
        &[("STRONGSWAN_CONF", conf_s.as_str())],
        "charon",
        ("00000000", 500),
        log,
    )
}

/// charon never sizes its IKE UDP sockets (the kernel shows `rmem_default`); stopped under a
/// flood, its UDP 500 socket drops, and bufscope's one finding for it has no calls, the kernel's
/// size and drops, and fixes that fit: charon's own key sizes its netlink socket, not this one
/// (no application fix), and on the host a size the program never asks for needs
/// `rmem_default` or the guard, not `rmem_max`.
#[test]
#[ignore = "needs root and strongswan-charon: run via cargo xtask test"]
fn charon_ike_socket_never_sized_costs_when_it_drops_and_its_netlink_key_is_not_the_fix() {
    assert!(
        Path::new(CHARON).exists(),
        "{CHARON} missing: cargo xtask setup installs the Debian package strongswan-charon"
    );
    let dir = TempDir::new("findings-charon");
    let e = Exporter::start(&[]);
    let ns = Netns::new("charon");
    let rmem_default: u64 = run(&mut ns.exec(&["cat", "/proc/sys/net/core/rmem_default"]))
        .trim()
        .parse()
        .unwrap();
    let c = charon(&ns, dir.path(), dir.path().join("charon.log"));
    let (pid, ino) = (c.pid(), c.socket().unwrap());
    let pid_s = pid.to_string();
    let rb = ss_rb(&ns, ino);
    assert_eq!(
        rb, rmem_default,
        "kernel: charon never sizes its IKE socket"
    );
    let drops = c.overflow(ino, rb / 250);
    assert!(drops > 0, "the flood overflowed {rb} B");
    let f = eventually(
        Duration::from_secs(20),
        "a costing finding for charon's UDP 500 socket with the kernel's drops",
        || {
            of_socket(&findings(&e), ino, "costing")
                .filter(|f| f["evidence"]["drops_total"].as_f64() == Some(drops as f64))
        },
    );
    eprintln!(
        "charon pid {pid} ino {ino}: kernel rb {rb} (rmem_default {rmem_default}) drops {drops}; \
         bufscope kind {} final_bytes {} drops_total {} drops/s {} severity {}\nstory {}\n\
         fixes {:#}",
        f["kind"],
        f["story"]["final_bytes"],
        f["evidence"]["drops_total"],
        f["evidence"]["drops_per_second"],
        f["severity"],
        f["story"],
        f["fixes"]
    );
    let fs = findings(&e);
    assert_eq!(
        fs.iter()
            .filter(|f| f["socket"]["inode"].as_u64() == Some(ino))
            .count(),
        1,
        "one finding for the socket"
    );
    assert_eq!(f["kind"], "udp_rcvbuf_drops");
    assert_eq!(f["process"]["comm"], "charon");
    assert_eq!(f["process"]["pid"].as_u64(), Some(u64::from(pid)));
    assert_eq!(f["story"]["final_bytes"].as_u64(), Some(rb), "ss -m rb");
    assert_eq!(
        f["story"]["calls"].as_array().map_or(0, Vec::len),
        0,
        "never sized: {}",
        f["story"]
    );
    // Never sized, yet the finding is in charon's namespace, and the limit is the one that
    // namespace reads (the kernel's file there: its value and whether it can be written).
    let ns_inode: u64 = run(&mut ns.exec(&["readlink", "/proc/self/ns/net"]))
        .trim()
        .trim_start_matches("net:[")
        .trim_end_matches(']')
        .parse()
        .unwrap();
    assert_eq!(
        f["socket"]["netns"].as_u64(),
        Some(ns_inode),
        "{}",
        f["socket"]
    );
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
    let limit = &f["story"]["limit"];
    assert_eq!(limit["scope"], scope, "{limit}");
    assert_eq!(limit["bytes"].as_i64(), Some(ns_rmem_max), "{limit}");
    let fixes = f["fixes"].as_array().unwrap();
    assert_eq!(fixes[0]["scope"], "application");
    assert_eq!(
        fixes[0]["possible"], false,
        "receive_buffer_size sizes the netlink socket: {}",
        fixes[0]
    );
    assert!(fixes[0]["config_key"].is_null(), "{}", fixes[0]);
    let host = fixes
        .iter()
        .find(|x| x["scope"] == "host")
        .unwrap_or_else(|| panic!("{fixes:?}"));
    let how = host["how"].as_str().unwrap();
    assert!(
        how.contains("never asks for a size") && how.contains("net.core.rmem_default"),
        "{how}"
    );
    assert_eq!(
        e.scrape().sum(
            "bufscope_socket_drops_total",
            &[
                ("pid", pid_s.as_str()),
                ("proto", "udp"),
                ("reason", "SOCKET_RCVBUFF")
            ]
        ),
        drops as f64,
        "the kernel's drops column"
    );
    c.stop();
}
