//! UDP receive-buffer drops: every count lands on the process that owns the socket, equals the
//! kernel's per-socket `drops` column exactly, and nothing lands on the sender.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bufscope_integration::{Exporter, Workload, eventually, proc_udp_drops, snmp};

const DROPS: &str = "bufscope_socket_drops_total";

/// Floods a receiver (`recv_args`) from a separate process and checks bufscope against the
/// kernel. `exporter` is started before the receiver unless `pre_existing`.
fn flood_and_compare(recv_args: &[&str], v6: bool, pre_existing: bool) {
    let (exporter, receiver) = if pre_existing {
        let r = Workload::start(recv_args);
        (Exporter::start(&[]), r)
    } else {
        let e = Exporter::start(&[]);
        (e, Workload::start(recv_args))
    };
    let rpid = receiver.pid();
    let inode: u64 = receiver.get("inodes").parse().unwrap();
    let port = receiver.get("ports").to_string();
    let snmp_proto = if v6 { "Udp6" } else { "Udp" };
    let rcvbuf_errors_before = if v6 {
        0
    } else {
        snmp(rpid, snmp_proto, "RcvbufErrors")
    };

    let pid_s = rpid.to_string();
    let mut flood_args = vec!["udp-flood", "--port", port.as_str(), "--count", "5000"];
    if v6 {
        flood_args.push("--v6");
    }
    if recv_args.contains(&"--new-netns") {
        flood_args.extend(["--netns-of", pid_s.as_str()]);
    }
    let sender = Workload::start(&flood_args);
    let spid = sender.pid().to_string();
    assert!(sender.wait(), "flooder failed");

    let kernel = proc_udp_drops(rpid, inode).expect("receiver socket in /proc/<pid>/net/udp");
    assert!(
        kernel > 1000,
        "the flood should overflow the buffer (kernel drops: {kernel})"
    );
    if !v6 {
        let delta = snmp(rpid, snmp_proto, "RcvbufErrors") - rcvbuf_errors_before;
        assert!(
            delta >= kernel,
            "RcvbufErrors delta {delta} < socket drops {kernel}"
        );
    }

    let want = kernel as f64;
    let labels = [
        ("pid", pid_s.as_str()),
        ("proto", "udp"),
        ("reason", "SOCKET_RCVBUFF"),
    ];
    let got = eventually(
        Duration::from_secs(10),
        "drops to reach the kernel's count",
        || {
            let v = exporter.scrape().sum(DROPS, &labels);
            (v == want).then_some(v)
        },
    );
    assert_eq!(got, want);
    eprintln!(
        "{recv_args:?} pre_existing={pre_existing}: kernel drops column {kernel}, bufscope {got} on pid {rpid}, sender pid {spid}"
    );
    let m = exporter.scrape();
    // Exact: nothing more (e.g. double counting) shows up later either.
    assert_eq!(
        m.sum(DROPS, &[("pid", pid_s.as_str())]),
        want,
        "all of the receiver's drops"
    );
    assert_eq!(
        m.sum(DROPS, &[("pid", spid.as_str())]),
        0.0,
        "nothing on the sender"
    );
    // The receiver's series carry its program's name (bufscope-workload names itself
    // wl<pid>), not the sender's.
    let comm = format!("wl{rpid}");
    assert!(
        m.find(DROPS, &[("pid", pid_s.as_str())])
            .all(|s| s.labels["comm"] == comm)
    );
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn udp_v4_drops_land_on_the_receiver() {
    flood_and_compare(&["udp-recv", "--rcvbuf", "4096"], false, false);
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn udp_v6_drops_land_on_the_receiver() {
    flood_and_compare(&["udp-recv", "--v6", "--rcvbuf", "4096"], true, false);
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn udp_drops_in_another_network_namespace() {
    flood_and_compare(
        &["udp-recv", "--new-netns", "--rcvbuf", "4096"],
        false,
        false,
    );
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn udp_drops_on_a_socket_created_before_bufscope() {
    flood_and_compare(&["udp-recv", "--rcvbuf", "4096"], false, true);
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn udp_v6_drops_in_another_netns_on_a_socket_created_before_bufscope() {
    flood_and_compare(
        &["udp-recv", "--v6", "--new-netns", "--rcvbuf", "4096"],
        true,
        true,
    );
}

/// A receiver whose name is not UTF-8 (`prctl(PR_SET_NAME, b"\xff\xfe-rcv\xc3")`, which any
/// local user can do) floods, stays idle for longer than `--retention` (GC runs several times
/// meanwhile), and floods again: it is alive all along, so its series never expire, and
/// bufscope's total equals the kernel's drops column for the socket both times. The name is
/// rendered lossily in the `comm` label.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn a_non_utf8_name_keeps_its_counts_past_the_retention() {
    let retention = Duration::from_secs(2);
    let exporter = Exporter::start(&["--retention", "2s"]);
    let receiver = Workload::start(&[
        "udp-recv",
        "--rcvbuf",
        "4096",
        "--comm",
        "\\xff\\xfe-rcv\\xc3",
    ]);
    let rpid = receiver.pid();
    assert_eq!(
        std::fs::read(format!("/proc/{rpid}/comm")).unwrap(),
        b"\xff\xfe-rcv\xc3\n",
        "the receiver's comm is the raw bytes"
    );
    let inode: u64 = receiver.get("inodes").parse().unwrap();
    let port = receiver.get("ports").to_string();
    let pid_s = rpid.to_string();
    let on_receiver = |m: &bufscope_integration::Metrics| {
        m.sum(DROPS, &[("pid", pid_s.as_str()), ("proto", "udp")]) + 0.0
    };
    let flood = |n: &str| {
        let sender = Workload::start(&["udp-flood", "--port", port.as_str(), "--count", n]);
        assert!(sender.wait(), "flooder failed");
    };

    flood("3000");
    let first = proc_udp_drops(rpid, inode).expect("receiver socket in /proc/<pid>/net/udp");
    assert!(
        first > 1000,
        "the flood should overflow the buffer ({first})"
    );
    eventually(Duration::from_secs(10), "the first flood's drops", || {
        (on_receiver(&exporter.scrape()) == first as f64).then_some(())
    });
    // Several GC passes (every 2 s with this retention) and more than the retention.
    std::thread::sleep(retention * 4);
    assert_eq!(
        on_receiver(&exporter.scrape()),
        first as f64,
        "a live process's series are still there after the retention"
    );

    flood("3000");
    let total = proc_udp_drops(rpid, inode).unwrap();
    assert!(
        total > first + 1000,
        "the second flood should overflow too ({total})"
    );
    eventually(Duration::from_secs(10), "all drops = the kernel's", || {
        (on_receiver(&exporter.scrape()) == total as f64).then_some(())
    });
    std::thread::sleep(Duration::from_millis(1500));
    let m = exporter.scrape();
    assert_eq!(on_receiver(&m), total as f64, "nothing more later");
    let want_pid = [("pid", pid_s.as_str())];
    let comms: Vec<&str> = m
        .find(DROPS, &want_pid)
        .map(|s| s.labels["comm"].as_str())
        .collect();
    assert!(
        comms.iter().all(|c| *c == "\u{fffd}\u{fffd}-rcv\u{fffd}"),
        "comm rendered lossily: {comms:?}"
    );
    eprintln!(
        "non-UTF-8 comm: kernel drops column {first} then {total}; bufscope {} on pid {rpid} (retention {retention:?}, idle {:?} between floods)",
        on_receiver(&m),
        retention * 4
    );
}
