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
    assert!(
        m.find(DROPS, &[("pid", pid_s.as_str())])
            .all(|s| s.labels["comm"] == "bufscope-worklo")
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
