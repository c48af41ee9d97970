//! `--bpf.pin-path`: counting outlives the daemon. A receiver is flooded before, while and
//! after bufscope is down (stopped by SIGTERM, and separately by kill -9); its total stays equal
//! to the kernel's drops column across each restart; another map layout is replaced, never
//! read; `bufscope cleanup` leaves nothing of bufscope's in the kernel (bpftool).
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bufscope_integration::node::{Bpffs, in_mount_namespace};
use bufscope_integration::{
    Exporter, GC_IDLE, Workload, bufscope_bin, eventually, output, proc_udp_drops,
};

const DROPS: &str = "bufscope_socket_drops_total";

/// A pin directory of its own under /sys/fs/bpf (each test mounts a bpffs of its own there:
/// [`in_mount_namespace`]), removed (with `bufscope cleanup`) at the end.
struct PinDir(PathBuf);

impl PinDir {
    fn new(tag: &str) -> Self {
        let p = PathBuf::from(format!(
            "/sys/fs/bpf/bufscope-test-{tag}-{}",
            std::process::id()
        ));
        cleanup(&p);
        Self(p)
    }

    fn flag(&self) -> String {
        format!("--bpf.pin-path={}", self.0.display())
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = Command::new(bufscope_bin())
            .args(["cleanup", "--bpf.pin-path"])
            .arg(&self.0)
            .status();
    }
}

fn cleanup(dir: &Path) -> String {
    let (ok, out, err) = output(
        Command::new(bufscope_bin())
            .args(["cleanup", "--bpf.pin-path"])
            .arg(dir),
        "",
    );
    assert!(ok, "bufscope cleanup failed: {out}{err}");
    out
}

/// Program ids held by the pinned links in `dir` (`bufscope check` lists them).
fn pinned_prog_ids(dir: &Path) -> BTreeSet<u32> {
    let (_, out, _) = output(
        Command::new(bufscope_bin())
            .args(["check", "--no-attach", "--bpf.pin-path"])
            .arg(dir),
        "",
    );
    out.lines()
        .filter(|l| l.contains("/links/"))
        .filter_map(|l| l.rsplit("program ").next()?.trim().parse().ok())
        .collect()
}

/// `bpftool -j <args>`'s answer (null when it printed nothing parsable).
fn bpftool_json(args: &[&str]) -> serde_json::Value {
    let out = Command::new("bpftool")
        .arg("-j")
        .args(args)
        .output()
        .expect("bpftool");
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

/// Program ids of every BPF link in the kernel (bpftool).
fn linked_prog_ids() -> BTreeSet<u32> {
    bpftool_json(&["link", "list"])
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["prog_id"].as_u64())
        .map(|id| id as u32)
        .collect()
}

fn prog_exists(id: u32) -> bool {
    Command::new("bpftool")
        .args(["prog", "show", "id", &id.to_string()])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Floods the receiver's port with `count` datagrams from another process.
fn flood(port: &str, count: u32) {
    let c = count.to_string();
    let sender = Workload::start(&["udp-flood", "--port", port, "--count", c.as_str()]);
    assert!(sender.wait(), "flooder failed");
}

/// Waits until bufscope's total for `pid` equals the kernel's drops column; returns it.
fn equals_kernel(e: &Exporter, pid: u32, inode: u64, what: &str) -> u64 {
    let kernel = proc_udp_drops(pid, inode).expect("receiver socket in /proc/<pid>/net/udp");
    let pid_s = pid.to_string();
    let labels = [("pid", pid_s.as_str()), ("proto", "udp")];
    let got = eventually(Duration::from_secs(10), what, || {
        let v = e.scrape().sum(DROPS, &labels);
        (v == kernel as f64).then_some(v)
    });
    eprintln!("{what}: kernel drops column {kernel}, bufscope {got}");
    kernel
}

/// Starts bufscope and returns it with the time from exec to the first scrape whose total for
/// the receiver equals the kernel's drops column (the restart gap).
fn restart(flags: &[&str], pid: u32, inode: u64) -> (Exporter, Duration) {
    let t0 = Instant::now();
    let e = Exporter::start(flags);
    let kernel = proc_udp_drops(pid, inode).unwrap();
    let pid_s = pid.to_string();
    let labels = [("pid", pid_s.as_str()), ("proto", "udp")];
    eventually(Duration::from_secs(15), "adopted totals", || {
        (e.scrape().sum(DROPS, &labels) == kernel as f64).then_some(())
    });
    (e, t0.elapsed())
}

#[test]
#[ignore = "needs root (BPF, bpffs); run by `cargo xtask test`"]
fn counts_go_on_across_sigterm_and_kill9_restarts() {
    // A bpffs of its own: pins and links go with the test, whatever the node has.
    in_mount_namespace(Bpffs::Mounted, || {
        let dir = PinDir::new("restart");
        let flag = dir.flag();
        // `_created` samples: the adopted series' created time is checked below.
        let flags = [flag.as_str(), "--web.openmetrics-created"];
        let receiver = Workload::start(&["udp-recv", "--rcvbuf", "4096"]);
        let (pid, inode) = (
            receiver.pid(),
            receiver.get("inodes").parse::<u64>().unwrap(),
        );
        let port = receiver.get("ports").to_string();

        // Before.
        let e = Exporter::start(&flags);
        assert!(e.log().contains("pinning maps and links"), "{}", e.log());
        flood(&port, 3000);
        let before = equals_kernel(&e, pid, inode, "before the restart");
        assert!(
            before > 500,
            "the flood should overflow the buffer ({before})"
        );
        let pinned = pinned_prog_ids(&dir.0);
        assert!(pinned.len() >= 4, "links pinned: {pinned:?}");

        // During: stopped by SIGTERM, the pinned programs keep counting.
        assert!(e.stop().success());
        let linked = linked_prog_ids();
        assert!(
            pinned.is_subset(&linked),
            "after SIGTERM the pinned links stay attached: pinned {pinned:?}, kernel links {linked:?}"
        );
        flood(&port, 3000);
        let during = proc_udp_drops(pid, inode).unwrap();
        assert!(
            during > before + 500,
            "drops while down: {before} → {during}"
        );

        // A second receiver drops while bufscope is down, then closes its socket and exits: its
        // drops are still attributed to it (its owner is in the pinned OWNERS map).
        let gone = Workload::start(&["udp-recv", "--rcvbuf", "4096", "--comm", "gone-recv"]);
        let (gpid, ginode) = (gone.pid(), gone.get("inodes").parse::<u64>().unwrap());
        flood(gone.get("ports"), 3000);
        let gone_kernel = proc_udp_drops(gpid, ginode).unwrap();
        assert!(gone_kernel > 500, "{gone_kernel}");
        drop(gone);

        // After: adopted, the total includes the drops of the blind window. (Down for 2 s at
        // least, so that a `_created` of this restart would differ from the pins' creation, which
        // has whole seconds.)
        std::thread::sleep(Duration::from_secs(2));
        let restarted_at = unix_now();
        let (e, gap) = restart(&flags, pid, inode);
        assert!(e.log().contains("adopting the pinned maps"), "{}", e.log());
        let m = e.scrape();
        assert_eq!(
            m.sum("bufscope_bpf_pins_info", &[("outcome", "adopted")]),
            1.0,
            "pins info"
        );
        assert_eq!(m.sum("bufscope_probe_pinned", &[("probe", "drops")]), 1.0);
        assert_eq!(pinned_prog_ids(&dir.0), pinned, "adopted, not reloaded");
        // OpenMetrics: the adopted drop series were 0 when the pinned maps were made, not at this
        // restart (a 0 stored at the restart would turn the adopted total into a burst).
        let since = m.sum("bufscope_bpf_pins_created_timestamp_seconds", &[]);
        let created = drops_created(&e, pid);
        assert!(
            (created - since).abs() <= 1.0 && created < restarted_at - 1.0,
            "_created {created} = the pins' creation {since}, before the restart {restarted_at}"
        );
        eprintln!("SIGTERM restart gap (exec → first scrape with the adopted total): {gap:?}");
        let gpid_s = gpid.to_string();
        let got = eventually(Duration::from_secs(10), "the closed socket's drops", || {
            let v = e
                .scrape()
                .sum(DROPS, &[("pid", gpid_s.as_str()), ("comm", "gone-recv")]);
            (v == gone_kernel as f64).then_some(v)
        });
        eprintln!(
            "socket closed while bufscope was down: kernel {gone_kernel}, bufscope {got} on its exited owner"
        );
        flood(&port, 2000);
        equals_kernel(&e, pid, inode, "after the SIGTERM restart");

        // kill -9: nothing runs at exit; the pins hold everything.
        e.kill9();
        flood(&port, 3000);
        let (e, gap) = restart(&flags, pid, inode);
        eprintln!("kill -9 restart gap: {gap:?}");
        flood(&port, 2000);
        let last = equals_kernel(&e, pid, inode, "after the kill -9 restart");
        assert!(last > during, "{during} → {last}");
        assert!(e.stop().success());

        // cleanup: every program bufscope pinned is gone from the kernel.
        let out = cleanup(&dir.0);
        assert!(out.contains("removed"), "{out}");
        let linked = linked_prog_ids();
        assert!(
            pinned.is_disjoint(&linked),
            "after cleanup no link of bufscope's: pinned {pinned:?}, kernel links {linked:?}"
        );
        eventually(Duration::from_secs(5), "programs unloaded", || {
            pinned.iter().all(|id| !prog_exists(*id)).then_some(())
        });
        assert!(!dir.0.exists(), "the pin directory is removed");
    })
}

#[test]
#[ignore = "needs root (BPF, bpffs); run by `cargo xtask test`"]
fn another_layout_is_replaced_never_read() {
    // A bpffs of its own: pins and links go with the test, whatever the node has.
    in_mount_namespace(Bpffs::Mounted, || {
        let dir = PinDir::new("layout");
        let flag = dir.flag();
        let receiver = Workload::start(&["udp-recv", "--rcvbuf", "4096"]);
        let (pid, inode) = (
            receiver.pid(),
            receiver.get("inodes").parse::<u64>().unwrap(),
        );
        let port = receiver.get("ports").to_string();
        let e = Exporter::start(&[flag.as_str(), "--drops.map-entries=4096"]);
        flood(&port, 3000);
        let old = equals_kernel(&e, pid, inode, "with 4096 DROPS entries");
        assert!(e.stop().success());

        // The DROPS map pinned with 4096 entries is not this layout: replaced, counts restart.
        let e = Exporter::start(&[flag.as_str()]);
        let log = e.log();
        assert!(
            log.contains("replaced pinned maps of another layout")
                && log.contains("DROPS (entries 4096, now 16384)"),
            "{log}"
        );
        let m = e.scrape();
        assert_eq!(
            m.sum(
                "bufscope_bpf_pins_info",
                &[("outcome", "replaced"), ("replaced", "DROPS")]
            ),
            1.0
        );
        flood(&port, 3000);
        let kernel = proc_udp_drops(pid, inode).unwrap();
        let pid_s = pid.to_string();
        let want = (kernel - old) as f64;
        let got = eventually(Duration::from_secs(10), "the new drops only", || {
            let v = e.scrape().sum(DROPS, &[("pid", pid_s.as_str())]);
            (v == want).then_some(v)
        });
        eprintln!(
            "replaced DROPS: kernel {kernel} (of which {old} before the replacement), bufscope {got}"
        );
        let before = pinned_prog_ids(&dir.0);
        assert!(e.stop().success());

        // Other settings, same layout: the maps are kept (counts go on), the programs replaced.
        let e = Exporter::start(&[flag.as_str(), "--log.level=debug"]);
        assert!(e.log().contains("programs replaced"), "{}", e.log());
        assert_eq!(
            e.scrape()
                .sum("bufscope_bpf_pins_info", &[("outcome", "upgraded")]),
            1.0
        );
        let after = pinned_prog_ids(&dir.0);
        assert!(
            before.is_disjoint(&after) && after.len() == before.len(),
            "new programs: {before:?} → {after:?}"
        );
        assert!(
            before.is_disjoint(&linked_prog_ids()),
            "the old links are gone"
        );
        flood(&port, 2000);
        let kernel = proc_udp_drops(pid, inode).unwrap();
        let want = (kernel - old) as f64;
        let got = eventually(
            Duration::from_secs(10),
            "counts kept across the upgrade",
            || {
                let v = e.scrape().sum(DROPS, &[("pid", pid_s.as_str())]);
                (v == want).then_some(v)
            },
        );
        eprintln!("upgraded: kernel {kernel}, bufscope {got} (= kernel - {old})");
        assert!(e.stop().success());
    })
}

#[test]
#[ignore = "needs root (BPF, bpffs); run by `cargo xtask test`"]
fn the_guard_is_not_kept_unless_persisted() {
    // A bpffs of its own: pins and links go with the test, whatever the node has.
    in_mount_namespace(Bpffs::Mounted, || {
        let dir = PinDir::new("guard");
        let flag = dir.flag();
        let e = Exporter::start(&[flag.as_str(), "--guard.mode=observe"]);
        let m = e.scrape();
        assert_eq!(m.sum("bufscope_probe_pinned", &[("probe", "guard")]), 0.0);
        assert_eq!(
            m.sum("bufscope_probe_pinned", &[("probe", "setsockopt")]),
            0.0
        );
        assert_eq!(m.sum("bufscope_probe_pinned", &[("probe", "drops")]), 1.0);
        let pinned = pinned_prog_ids(&dir.0);
        let guard_progs: BTreeSet<u32> =
            testkit_held(e.pid()).difference(&pinned).copied().collect();
        assert!(
            !guard_progs.is_empty(),
            "the guard's programs are held by bufscope"
        );
        assert!(e.stop().success());
        let linked = linked_prog_ids();
        assert!(
            guard_progs.is_disjoint(&linked),
            "after SIGTERM no guard link stays: guard {guard_progs:?}, kernel links {linked:?}"
        );
        assert!(pinned.is_subset(&linked), "the pinned probes stay");

        // With --guard.persist the guard stays attached too.
        let e = Exporter::start(&[flag.as_str(), "--guard.mode=observe", "--guard.persist"]);
        assert_eq!(
            e.scrape()
                .sum("bufscope_probe_pinned", &[("probe", "guard")]),
            1.0
        );
        let pinned = pinned_prog_ids(&dir.0);
        assert!(e.stop().success());
        assert!(
            pinned.is_subset(&linked_prog_ids()),
            "persisted guard stays"
        );
        let (ok, _, err) = output(
            Command::new(bufscope_bin()).args(["run", "--guard.mode=observe", "--guard.persist"]),
            "",
        );
        assert!(!ok && err.contains("--bpf.pin-path"), "{err}");
    })
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The OpenMetrics `_created` of `pid`'s UDP drop series.
fn drops_created(e: &Exporter, pid: u32) -> f64 {
    let (status, _, body) = bufscope_testkit::http_get_with(
        &e.addr,
        "/metrics",
        &[("Accept", "application/openmetrics-text; version=1.0.0")],
    )
    .unwrap();
    assert_eq!(status, 200);
    let want = format!(
        "comm=\"{}\"",
        bufscope_integration::comm_of(&pid.to_string()).unwrap()
    );
    body.lines()
        .find(|l| l.starts_with("bufscope_socket_drops_created{") && l.contains(&want))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no _created sample for pid {pid}:\n{body}"))
}

/// Program ids the process holds open (fdinfo `prog_id`).
fn testkit_held(pid: u32) -> BTreeSet<u32> {
    bufscope_integration::held_bpf_ids(pid, "prog_id:")
}

#[test]
#[ignore = "needs root (BPF, bpffs); run by `cargo xtask test`"]
fn a_live_process_keeps_the_drops_of_its_closed_sockets_across_a_restart() {
    // A bpffs of its own: pins and links go with the test, whatever the node has.
    in_mount_namespace(Bpffs::Mounted, || {
        let dir = PinDir::new("retired");
        let flag = dir.flag();
        // GC every 2 s; entries go 3 s (the debug build's GC_IDLE; 30 s in a release) after their
        // last change once their socket is closed.
        let flags = [flag.as_str(), "--retention=8s"];
        let mut closer = Workload::start(&["udp-recv", "--rcvbuf", "4096", "--comm", "closer"]);
        let (pid, inode) = (closer.pid(), closer.get("inodes").parse::<u64>().unwrap());
        let port = closer.get("ports").to_string();
        let e = Exporter::start_env(&[GC_IDLE], &flags);
        flood(&port, 3000);
        let kernel = equals_kernel(&e, pid, inode, "before closing");
        // The socket closes (its /proc/net/udp line goes with it); the process lives on.
        closer.send("close");
        closer.wait_line("closed", Duration::from_secs(5));
        let pid_s = pid.to_string();
        let labels = [("pid", pid_s.as_str()), ("proto", "udp")];
        // The GC removes its DROPS entry (idle ≥ GC_IDLE, socket gone) and folds its counts into
        // the process's RETIRED entry: read the pinned map itself (bpftool).
        let drops_map = dir.0.join("maps/DROPS");
        eventually(
            Duration::from_secs(60),
            "the closed socket's entry folded",
            || {
                let keys = drop_keys(&drops_map);
                let socket_gone = !keys.iter().any(|k| k.0 == inode);
                let folded = keys.iter().any(|k| k.2 == 4 && k.1 == pid);
                (socket_gone && folded).then_some(())
            },
        );
        assert_eq!(
            e.scrape().sum(DROPS, &labels),
            kernel as f64,
            "unchanged by the GC"
        );
        assert!(e.stop().success());
        let e = Exporter::start_env(&[GC_IDLE], &flags);
        let got = eventually(
            Duration::from_secs(10),
            "the folded total after the restart",
            || {
                let v = e.scrape().sum(DROPS, &labels);
                (v == kernel as f64).then_some(v)
            },
        );
        eprintln!(
            "closed and collected before the restart: kernel counted {kernel} on the socket, bufscope {got} on the live process after the restart"
        );
        assert!(e.stop().success());
    })
}

/// (inode, id, site) of every key of the pinned `DROPS` map (`DropKey`: inode u64, netns
/// u32, id u32, reason u16, proto u8, site u8), as bpftool dumps it.
fn drop_keys(map: &Path) -> Vec<(u64, u32, u8)> {
    bpftool_json(&["map", "dump", "pinned", map.to_str().unwrap()])
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let bytes: Vec<u8> = e["key"]
                .as_array()?
                .iter()
                .filter_map(|b| u8::from_str_radix(b.as_str()?.trim_start_matches("0x"), 16).ok())
                .collect();
            (bytes.len() >= 20).then(|| {
                (
                    u64::from_le_bytes(bytes[0..8].try_into().unwrap()),
                    u32::from_le_bytes(bytes[12..16].try_into().unwrap()),
                    bytes[19],
                )
            })
        })
        .collect()
}

/// A long-lived program that makes buffer setsockopt calls and TCP connections on command and
/// says what the kernel answered (its own ground truth: errno of each call, `getsockopt`
/// readbacks), so the counts are known whoever counted them.
const EVENTS_SCRIPT: &str = r#"
import socket, sys
S = socket.SOL_SOCKET
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
lst.bind(("127.0.0.1", 0))
lst.listen(128)
port = lst.getsockname()[1]
conns = []
def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
say("READY pid=%d port=%d" % (__import__("os").getpid(), port))
for line in sys.stdin:
    w = line.split()
    if not w or w[0] == "exit":
        break
    n = int(w[1])
    if w[0] == "calls":
        clamped = failed = 0
        for _ in range(n):
            u.setsockopt(S, socket.SO_RCVBUF, 65536)
            clamped += u.getsockopt(S, socket.SO_RCVBUF) < 2 * 65536
            u.setsockopt(S, socket.SO_RCVBUF, 1 << 30)
            clamped += u.getsockopt(S, socket.SO_RCVBUF) < 2 * (1 << 30)
            try:
                u.setsockopt(S, socket.SO_SNDBUF, b"\0\0")
            except OSError as e:
                failed += e.errno == 22
        say("DONE calls=%d clamped=%d failed=%d" % (3 * n, clamped, failed))
    elif w[0] == "connect":
        for _ in range(n):
            c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            c.setsockopt(S, socket.SO_RCVBUF, 4096)
            c.connect(("127.0.0.1", port))
            a, _ = lst.accept()
            conns += [c, a]
        say("DONE connected=%d" % n)
"#;

/// What the program's kernel said so far.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Truth {
    /// UDP calls (SO_RCVBUF twice, SO_SNDBUF once per round) and their outcomes.
    udp_rcvbuf: u64,
    udp_sndbuf: u64,
    clamped: u64,
    failed: u64,
    /// TCP SO_RCVBUF calls (one per client, before connect()).
    tcp_rcvbuf: u64,
}

fn done_field(line: &str, k: &str) -> u64 {
    line.split_whitespace()
        .find_map(|f| f.strip_prefix(&format!("{k}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{k} in {line}"))
}

/// Runs `rounds` rounds of calls and `conns` connections in the program; adds to `t`.
fn activity(p: &mut bufscope_testkit::LineChild, t: &mut Truth, rounds: u64, conns: u64) {
    p.send(&format!("calls {rounds}")).unwrap();
    let l = p.wait_line("DONE calls", Duration::from_secs(30)).unwrap();
    assert_eq!(done_field(&l, "calls"), 3 * rounds);
    t.udp_rcvbuf += 2 * rounds;
    t.udp_sndbuf += rounds;
    t.clamped += done_field(&l, "clamped");
    t.failed += done_field(&l, "failed");
    p.send(&format!("connect {conns}")).unwrap();
    p.wait_line("DONE connected", Duration::from_secs(30))
        .unwrap();
    t.tcp_rcvbuf += conns;
}

/// bufscope's event-built counters of `pid`, in the order of [`kernel_side`].
fn event_counts(m: &bufscope_integration::Metrics, pid: u32) -> [u64; 8] {
    let p = pid.to_string();
    let p = p.as_str();
    let v = |name: &str, extra: &[(&str, &str)]| {
        let mut l = vec![("pid", p)];
        l.extend_from_slice(extra);
        (m.sum(name, &l) + 0.0) as u64
    };
    [
        v(
            "bufscope_setsockopt_total",
            &[("proto", "udp"), ("option", "SO_RCVBUF")],
        ),
        v(
            "bufscope_setsockopt_total",
            &[("proto", "udp"), ("option", "SO_SNDBUF")],
        ),
        v(
            "bufscope_setsockopt_total",
            &[("proto", "tcp"), ("option", "SO_RCVBUF")],
        ),
        v("bufscope_setsockopt_clamped_total", &[]),
        v(
            "bufscope_setsockopt_failed_total",
            &[("option", "SO_SNDBUF")],
        ),
        v("bufscope_rcvbuf_locks_total", &[("proto", "tcp")]),
        v("bufscope_tcp_established_total", &[]),
        v("bufscope_tcp_wscale_shrunk_total", &[]),
    ]
}

/// The same from the kernel: the program's calls and their errno/readbacks, and `ss -tni` for
/// its connections (both ends are its own: every one counts as established; the clients, which
/// set SO_RCVBUF before connect(), have a smaller receive window scale than the accepted ends;
/// each client socket got SOCK_RCVBUF_LOCK).
fn kernel_side(t: &Truth, port: u16) -> [u64; 8] {
    let conns = bufscope_integration::ss_tcp();
    let server_scale = conns
        .iter()
        .filter(|c| c.local_port == port)
        .map(|c| c.rcv_wscale)
        .max()
        .unwrap_or(0);
    let ends = conns
        .iter()
        .filter(|c| c.local_port == port || c.peer_port == port)
        .count() as u64;
    let shrunk = conns
        .iter()
        .filter(|c| c.peer_port == port && c.rcv_wscale < server_scale)
        .count() as u64;
    assert_eq!(
        ends,
        2 * t.tcp_rcvbuf,
        "ss shows both ends of every connection"
    );
    [
        t.udp_rcvbuf,
        t.udp_sndbuf,
        t.tcp_rcvbuf,
        t.clamped,
        t.failed,
        t.tcp_rcvbuf,
        ends,
        shrunk,
    ]
}

/// Counters built from events (setsockopt calls, clamps, failures, locks, TCP established and
/// window-scale shrinks) go on across a kill -9 restart, like drops: the process's activity
/// before, while bufscope is down (its records wait in the pinned ring buffer) and after the
/// restart all count, and every family equals the kernel-side ground truth.
#[test]
#[ignore = "needs root (BPF, bpffs); run by `cargo xtask test`"]
fn event_counters_go_on_across_a_kill9_restart() {
    // A bpffs of its own: pins and links go with the test, whatever the node has.
    in_mount_namespace(Bpffs::Mounted, || {
        let dir = PinDir::new("events");
        let flag = dir.flag();
        let flags = [flag.as_str()];
        let script = std::env::temp_dir().join(format!("bsp-events-{}.py", std::process::id()));
        std::fs::write(&script, EVENTS_SCRIPT).unwrap();
        let mut cmd = Command::new("python3");
        cmd.arg(&script);
        let mut p = bufscope_testkit::LineChild::spawn(cmd, "events").unwrap();

        let e = Exporter::start(&flags);
        let ready: std::collections::HashMap<String, String> =
            p.wait_ready(Duration::from_secs(30)).unwrap();
        let pid: u32 = ready["pid"].parse().unwrap();
        let port: u16 = ready["port"].parse().unwrap();
        let mut t = Truth::default();
        let settle = |e: &Exporter, t: &Truth, what: &str| {
            let want = kernel_side(t, port);
            let got = eventually(Duration::from_secs(15), what, || {
                let got = event_counts(&e.scrape(), pid);
                (got == want).then_some(got)
            });
            eprintln!("{what}: kernel side {want:?}, bufscope {got:?}");
        };

        activity(&mut p, &mut t, 10, 3);
        assert!(t.clamped >= 10 && t.failed == 10, "{t:?}");
        settle(&e, &t, "before the restart");

        // Killed: nothing runs at exit. The program keeps calling and connecting.
        e.kill9();
        activity(&mut p, &mut t, 5, 2);

        let t0 = Instant::now();
        let e = Exporter::start(&flags);
        assert!(e.log().contains("adopting the pinned maps"), "{}", e.log());
        let want = kernel_side(&t, port);
        let first = event_counts(&e.scrape(), pid);
        eprintln!(
            "first scrape {:?} after exec: {first:?} (kernel side {want:?})",
            t0.elapsed()
        );
        assert_eq!(
            first, want,
            "the first scrape after the restart already has every count (the restart gap is 0)"
        );
        activity(&mut p, &mut t, 4, 1);
        settle(&e, &t, "after the kill -9 restart");
        assert!(e.stop().success());
        let _ = std::fs::remove_file(&script);
    })
}

/// `bufscope <args>` under `timeout 30` (a bufscope that wrongly starts is killed, exit 124,
/// instead of hanging the test); returns (exit code, stderr).
fn refused(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new("timeout")
        .arg("30")
        .arg(bufscope_bin())
        .args(args)
        .env("NO_COLOR", "1")
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("timeout(1)");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
#[ignore = "needs root (BPF, bpffs); run by `cargo xtask test`"]
fn one_bufscope_per_pin_directory() {
    // A bpffs of its own: pins and links go with the test, whatever the node has.
    in_mount_namespace(Bpffs::Mounted, || {
        let dir = PinDir::new("owner");
        let flag = dir.flag();
        let receiver = Workload::start(&["udp-recv", "--rcvbuf", "4096"]);
        let (pid, inode) = (
            receiver.pid(),
            receiver.get("inodes").parse::<u64>().unwrap(),
        );
        let port = receiver.get("ports").to_string();
        let e = Exporter::start(&[flag.as_str()]);
        let holder = format!("pid {}", e.pid());
        let pinned = pinned_prog_ids(&dir.0);
        assert!(pinned.len() >= 4, "links pinned: {pinned:?}");

        // A second daemon on the same directory (an overlapping rolling update, a local debug
        // run) is refused before it loads anything, naming the holder.
        let (code, err) = refused(&[
            "run",
            flag.as_str(),
            "--max-processes",
            "50",
            "--web.listen-address",
            "127.0.0.1:0",
        ]);
        assert_eq!(code, Some(1), "the second daemon must refuse: {err}");
        eprintln!("second daemon: {}", err.trim());
        assert!(
            err.lines().count() == 1 && err.contains("in use by") && err.contains(&holder),
            "one line naming {holder}: {err}"
        );
        // cleanup while it runs is refused too, and removes nothing.
        let (code, err) = refused(&["cleanup", "--bpf.pin-path", dir.0.to_str().unwrap()]);
        assert_eq!(code, Some(1), "cleanup while running must refuse: {err}");
        eprintln!("cleanup while running: {}", err.trim());
        assert!(err.contains(&holder), "names {holder}: {err}");
        assert_eq!(pinned_prog_ids(&dir.0), pinned, "nothing removed");

        // The first daemon still counts every drop of a flooded receiver.
        flood(&port, 3000);
        let kernel = equals_kernel(
            &e,
            pid,
            inode,
            "after the refused second daemon and cleanup",
        );
        assert!(kernel > 500, "the flood overflows the buffer ({kernel})");
        assert_eq!(
            e.scrape()
                .sum("bufscope_probe_attached", &[("probe", "drops")]),
            1.0
        );

        // `cleanup --force` removes the pins anyway: the daemon notices on its next poll that its
        // links are gone and says the probe is detached (it no longer counts).
        let (code, err) = refused(&[
            "cleanup",
            "--force",
            "--bpf.pin-path",
            dir.0.to_str().unwrap(),
        ]);
        assert_eq!(code, Some(0), "cleanup --force: {err}");
        assert!(err.contains(&holder), "the warning names {holder}: {err}");
        eventually(Duration::from_secs(10), "drops reported detached", || {
            (e.scrape()
                .sum("bufscope_probe_attached", &[("probe", "drops")])
                == 0.0)
                .then_some(())
        });
        assert!(
            e.log().contains("probe detached") && e.log().contains("is gone"),
            "{}",
            e.log()
        );
        assert!(
            pinned.is_disjoint(&linked_prog_ids()),
            "the forced cleanup detached the links"
        );
        // The status page says the same, and with every probe gone /healthz fails.
        let (_, status) = e.get("/api/v1/status");
        let status: serde_json::Value = serde_json::from_str(&status).unwrap();
        let drops = status["probes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["probe"] == "drops")
            .unwrap();
        assert_eq!(drops["attached"], false, "{drops}");
        assert!(
            drops["error"].as_str().unwrap_or("").contains("is gone"),
            "{drops}"
        );
        let (code, body) = e.get("/healthz");
        assert_eq!(code, 503, "{body}");
        assert!(body.contains("no probe attached"), "{body}");
        assert!(e.stop().success());
        // A holder that is gone holds nothing: the next start owns the directory again.
        let e = Exporter::start(&[flag.as_str()]);
        assert_eq!(
            e.scrape()
                .sum("bufscope_probe_attached", &[("probe", "drops")]),
            1.0
        );
        e.kill9();
        cleanup(&dir.0);
    })
}

/// A pinned link replaced behind bufscope's back (its pin removed, another link pinned in its
/// place, as a second tool or a careless operator would): the next poll sees the id change,
/// says which probe is detached and why, and the other probes stay attached.
#[test]
#[ignore = "needs root (BPF, bpffs); run by `cargo xtask test`"]
fn a_replaced_link_pin_is_reported_detached() {
    // A bpffs of its own: pins and links go with the test, whatever the node has.
    in_mount_namespace(Bpffs::Mounted, || {
        let dir = PinDir::new("replaced");
        let e = Exporter::start(&[dir.flag().as_str()]);
        let pin = dir.0.join("links").join("drops_0");
        assert!(
            pin.exists(),
            "the drops probe's first link is pinned at {}",
            pin.display()
        );
        let attached = |e: &Exporter| {
            e.scrape()
                .find("bufscope_probe_attached", &[])
                .filter(|s| s.value == 1.0)
                .map(|s| s.labels["probe"].clone())
                .collect::<BTreeSet<String>>()
        };
        let before = attached(&e);
        assert!(before.contains("drops"), "{before:?}");
        // Another bufscope without pins holds links of its own: one of them takes the pin's place.
        let other = Exporter::start(&[]);
        let theirs = bufscope_integration::held_bpf_ids(other.pid(), "link_id:");
        let foreign = *theirs
            .iter()
            .next()
            .expect("the other bufscope holds links");
        std::fs::remove_file(&pin).unwrap();
        let (ok, out, err) = output(
            Command::new("bpftool")
                .args(["link", "pin", "id", &foreign.to_string()])
                .arg(&pin),
            "",
        );
        assert!(ok, "bpftool link pin: {out}{err}");
        eventually(Duration::from_secs(10), "drops reported detached", || {
            (!attached(&e).contains("drops")).then_some(())
        });
        // bufscope logs why before the metric changes, but its log reaches this test through a
        // pipe and a reader thread, which may lag a loaded machine's scrape: wait for it too.
        let names_it = |log: &str| {
            log.contains("another process replaced it") && log.contains(&format!("link {foreign}"))
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !names_it(&e.log()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = e.log();
        assert!(
            names_it(&log),
            "the log names the pin and the link now in it: {log}"
        );
        let after = attached(&e);
        let mut want = before.clone();
        want.remove("drops");
        assert_eq!(after, want, "only the replaced probe is detached");
        let (code, body) = e.get("/healthz");
        assert_eq!(code, 200, "other probes still attached: {body}");
        std::fs::remove_file(&pin).unwrap();
        drop(other);
        e.kill9();
        cleanup(&dir.0);
    })
}

#[test]
#[ignore = "needs root (BPF, bpffs); run by `cargo xtask test`"]
fn symlinks_in_the_pin_directory_are_refused() {
    // A bpffs of its own: pins and links go with the test, whatever the node has.
    in_mount_namespace(Bpffs::Mounted, || {
        let dir = PinDir::new("symlink");
        let elsewhere = PathBuf::from(format!("{}-elsewhere", dir.0.display()));
        std::fs::create_dir_all(&dir.0).unwrap();
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.0.join("maps")).unwrap();
        let before = linked_prog_ids();
        let (code, err) = refused(&[
            "run",
            dir.flag().as_str(),
            "--web.listen-address",
            "127.0.0.1:0",
        ]);
        assert_eq!(code, Some(1), "{err}");
        assert!(
            err.lines().count() == 1 && err.contains("maps is a symlink"),
            "one line naming the symlink: {err}"
        );
        let (code, err) = refused(&["cleanup", "--bpf.pin-path", dir.0.to_str().unwrap()]);
        assert_eq!(code, Some(1), "cleanup refuses the symlink too: {err}");
        assert!(err.contains("symlink"), "{err}");
        eprintln!("symlinked maps/: {}", err.trim());
        assert!(
            std::fs::read_dir(&elsewhere).unwrap().next().is_none(),
            "nothing pinned through the symlink"
        );
        assert!(linked_prog_ids().is_subset(&before), "no link made");
        // The pin directory itself a symlink: refused as well.
        std::fs::remove_file(dir.0.join("maps")).unwrap();
        std::fs::remove_dir(&dir.0).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &dir.0).unwrap();
        let (code, err) = refused(&[
            "run",
            dir.flag().as_str(),
            "--web.listen-address",
            "127.0.0.1:0",
        ]);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("is a symlink"), "{err}");
        std::fs::remove_file(&dir.0).unwrap();
        std::fs::remove_dir(&elsewhere).unwrap();
    })
}

#[test]
#[ignore = "needs root (BPF, bpffs, mount namespaces); run by `cargo xtask test`"]
fn a_bpffs_bufscope_mounts_is_private_to_root() {
    // In a mount namespace of its own, with no bpffs at /sys/fs/bpf: bufscope mounts one, and
    // it and the directories bufscope makes there are rwx for root only. (The namespace's
    // bpffs, and with it what was pinned there, goes with the namespace.)
    let d = bufscope_integration::TempDir::new("bpffs-mode");
    let log = d.path().join("log");
    let script = format!(
        "set -e\n\
         while [ \"$(stat -f -c %T /sys/fs/bpf)\" = bpf_fs ]; do umount /sys/fs/bpf; done\n\
         {bin} run --web.listen-address 127.0.0.1:0 --bpf.pin-path /sys/fs/bpf/bufscope \
           >/dev/null 2>{log} &\n\
         pid=$!\n\
         for i in $(seq 1 300); do grep -q 'serving metrics' {log} && break; sleep 0.1; done\n\
         stat -f -c 'fs %T' /sys/fs/bpf\n\
         stat -c 'mode %a %n' /sys/fs/bpf /sys/fs/bpf/bufscope /sys/fs/bpf/bufscope/maps \
           /sys/fs/bpf/bufscope/links\n\
         kill $pid; wait $pid || true\n\
         {bin} cleanup --bpf.pin-path /sys/fs/bpf/bufscope\n",
        bin = bufscope_bin().display(),
        log = log.display(),
    );
    let (ok, out, err) = output(
        Command::new("unshare").args(["-m", "--propagation", "private", "sh", "-c", &script]),
        "",
    );
    let daemon = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(ok, "{out}{err}\n{daemon}");
    assert!(
        daemon.contains("mounted bpffs at /sys/fs/bpf (mode 0700)"),
        "{daemon}"
    );
    assert!(out.contains("fs bpf_fs"), "{out}");
    let modes: Vec<&str> = out.lines().filter(|l| l.starts_with("mode ")).collect();
    assert_eq!(modes.len(), 4, "{out}");
    // rwx for root only (the kernel always sets the sticky bit on a bpffs root: 1700).
    assert!(
        modes
            .iter()
            .all(|l| l.starts_with("mode 700 ") || l.starts_with("mode 1700 /sys/fs/bpf")),
        "{out}"
    );
    eprintln!("{}", modes.join("\n"));
}
