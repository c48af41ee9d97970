//! Netlink overruns: per process and netlink family, equal to the `Drops` column of the
//! socket in `/proc/<pid>/net/netlink` (the kernel's only record of them), in a network
//! namespace the test creates; with a listener that never reads and with a real daemon
//! (`ip xfrm monitor`, stopped while the kernel sends it XFRM events).
#![allow(clippy::unwrap_used)]

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use bufscope_integration::{Exporter, Spawned, Workload, eventually};
use bufscope_netlab::{Netns, PREFIX, unique_name};

const OVERRUNS: &str = "bufscope_netlink_overruns_total";

/// Runs `ip -n NS -batch` over `lines`.
fn batch(ns: &Netns, lines: &str) {
    let mut c = Spawned::new(
        Command::new("ip")
            .args(["-n", ns.name(), "-force", "-batch", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null()),
    );
    c.take_stdin().write_all(lines.as_bytes()).unwrap();
    c.wait_success();
}

/// The kernel's `Drops` for socket `inode`, from the table of `pid`'s namespace.
fn kernel_drops(pid: u32, inode: u64) -> Option<u64> {
    let t = std::fs::read_to_string(format!("/proc/{pid}/net/netlink")).ok()?;
    t.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(9)?.parse::<u64>().ok()? == inode).then(|| f[8].parse().ok())?
    })
}

/// `n` IPv4 /32 routes added then deleted (2n route events).
fn route_churn(n: usize) -> String {
    let mut s = String::new();
    for op in ["add", "del"] {
        for i in 0..n {
            s.push_str(&format!(
                "route {op} 172.16.{}.{}/32 dev lo\n",
                i / 250,
                i % 250 + 1
            ));
        }
    }
    s
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn route_listener_overruns_equal_the_drops_column() {
    let exporter = Exporter::start(&[]);
    let ns = Netns::create(unique_name(PREFIX, "nl")).unwrap();
    let wrap = ["ip", "netns", "exec", ns.name()];
    let small = Workload::start_wrapped(
        &wrap,
        &["netlink-listen", "--rcvbuf", "4096", "--groups", "0x41"],
    );
    let big = Workload::start_wrapped(
        &wrap,
        &[
            "netlink-listen",
            "--rcvbuf",
            "4194304",
            "--groups",
            "0x41",
            "--read",
        ],
    );
    let (spid, bpid) = (small.pid(), big.pid());
    let inode: u64 = small.get("inode").parse().unwrap();
    let big_inode: u64 = big.get("inode").parse().unwrap();
    let before = kernel_drops(spid, inode).unwrap();
    // Let bufscope read the namespace's table once before the churn.
    std::thread::sleep(Duration::from_millis(2500));
    batch(&ns, &route_churn(20_000));
    let kernel = kernel_drops(spid, inode).unwrap() - before;
    assert!(
        kernel > 30_000,
        "the churn should overrun the small listener (kernel Drops: {kernel})"
    );
    assert_eq!(
        kernel_drops(bpid, big_inode),
        Some(0),
        "the reading listener keeps up"
    );
    let s = spid.to_string();
    let labels = [("pid", s.as_str()), ("family", "ROUTE")];
    let got = eventually(
        Duration::from_secs(10),
        "overruns to reach the kernel's",
        || {
            let v = exporter.scrape().sum(OVERRUNS, &labels);
            (v == kernel as f64).then_some(v)
        },
    );
    eprintln!(
        "ROUTE listener rcvbuf {}: kernel Drops delta {kernel}, bufscope {got} on pid {spid}",
        small.get("rcvbuf")
    );
    std::thread::sleep(Duration::from_millis(1500));
    let m = exporter.scrape();
    assert_eq!(
        m.sum(OVERRUNS, &labels),
        kernel as f64,
        "nothing more later"
    );
    assert_eq!(
        m.sum(OVERRUNS, &[("pid", bpid.to_string().as_str())]),
        0.0,
        "nothing on the listener that keeps up"
    );
    assert!(
        m.find(OVERRUNS, &[("pid", s.as_str())])
            .all(|x| x.labels["comm"] == format!("wl{spid}") && !x.labels.contains_key("pid")),
        "the overruns are on the listener's identity (bufscope-workload names itself wl<pid>), no pid"
    );
    // The finding names the family, the buffer and the fix.
    let (code, body) = exporter.get("/api/v1/findings");
    assert_eq!(code, 200);
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    let f = doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "netlink_overruns" && f["process"]["pid"] == spid)
        .unwrap_or_else(|| panic!("no netlink_overruns finding for {spid}: {body}"));
    let summary = f["summary"].as_str().unwrap();
    assert!(summary.contains("NETLINK_ROUTE"), "{summary}");
    assert_eq!(
        f["evidence"]["rcvbuf_bytes"].as_f64(),
        Some(small.get("rcvbuf").parse::<f64>().unwrap()),
        "{f}"
    );
    assert!(f["fix"].as_str().unwrap().contains("SO_RCVBUFFORCE"), "{f}");
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn xfrm_monitor_overruns_equal_the_drops_column() {
    let exporter = Exporter::start(&[]);
    let ns = Netns::create(unique_name(PREFIX, "nx")).unwrap();
    // Killed and reaped when dropped, also if an assertion fails while it is stopped.
    let monitor = Spawned::new(
        Command::new("ip")
            .args(["-n", ns.name(), "xfrm", "monitor"])
            .stdout(Stdio::null()),
    );
    let pid = monitor.pid();
    // Its NETLINK_XFRM socket: the protocol-6 row of its namespace whose inode it holds.
    let inode = eventually(Duration::from_secs(5), "ip xfrm monitor's socket", || {
        let held: Vec<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .ok()?
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter_map(|l| {
                l.to_str()?
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .parse()
                    .ok()
            })
            .collect();
        let t = std::fs::read_to_string(format!("/proc/{pid}/net/netlink")).ok()?;
        t.lines().skip(1).find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let ino: u64 = f.get(9)?.parse().ok()?;
            (f[1] == "6" && held.contains(&ino)).then_some(ino)
        })
    });
    let before = kernel_drops(pid, inode).unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    // Stopped, it cannot read: the kernel queues what fits its buffer and drops the rest.
    monitor.signal(libc::SIGSTOP);
    let mut lines = String::new();
    for op in ["add", "delete"] {
        for i in 0..10_000 {
            let extra = if op == "add" { " action block" } else { "" };
            lines.push_str(&format!(
                "xfrm policy {op} src 10.{}.{}.1/32 dst 10.200.0.1/32 dir out{extra}\n",
                i / 250,
                i % 250
            ));
        }
    }
    batch(&ns, &lines);
    let kernel = kernel_drops(pid, inode).unwrap() - before;
    monitor.signal(libc::SIGCONT);
    assert!(
        kernel > 1000,
        "20,000 policy events should overrun ip xfrm monitor (kernel Drops: {kernel})"
    );
    let s = pid.to_string();
    let labels = [("pid", s.as_str()), ("family", "XFRM")];
    let got = eventually(
        Duration::from_secs(10),
        "overruns to reach the kernel's",
        || {
            let v = exporter.scrape().sum(OVERRUNS, &labels);
            (v == kernel as f64).then_some(v)
        },
    );
    eprintln!("ip xfrm monitor: kernel Drops delta {kernel}, bufscope {got} on pid {pid}");
    assert!(
        exporter
            .scrape()
            .find(OVERRUNS, &labels)
            .all(|x| x.labels["comm"] == "ip")
    );
}
