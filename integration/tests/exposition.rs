//! `/metrics` is valid Prometheus exposition (`promtool check metrics`), including for
//! processes whose `comm` is hostile text; probes degrade one by one. (That every scrape
//! shows the kernel's count, in both formats, is `scrape_truth.rs`.)
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bufscope_integration::{Exporter, Workload, eventually, promtool_check_metrics};

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn promtool_accepts_metrics_with_a_hostile_comm() {
    let e = Exporter::start(&[]);
    // quotes, a backslash and a newline in the process name
    let w = Workload::start(&["hold-comm", "--comm", "q\"b\\\\s\\nnl"]);
    let pid = w.pid().to_string();
    let kernel_comm = std::fs::read(format!("/proc/{pid}/comm")).unwrap();
    assert_eq!(
        kernel_comm, b"q\"b\\s\nnl\n",
        "the kernel holds the hostile name"
    );
    let m = eventually(Duration::from_secs(10), "the process to appear", || {
        let m = e.scrape();
        (m.sum("bufscope_setsockopt_total", &[("pid", pid.as_str())]) == 1.0).then_some(m)
    });
    let want = [("pid", pid.as_str())];
    let s = m.find("bufscope_setsockopt_total", &want).next().unwrap();
    assert_eq!(
        s.labels["comm"], "q\"b\\s\nnl",
        "label round-trips to the kernel's comm"
    );
    let (ok, msg) = promtool_check_metrics(&e.scrape_text());
    assert!(ok, "promtool check metrics failed:\n{msg}");
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn promtool_accepts_every_comm_byte() {
    let e = Exporter::start(&[]);
    // Bytes 0x01..=0xff in 15-byte comms (the kernel keeps 15 + NUL).
    let mut workers = Vec::new();
    let mut b = 1u32;
    while b <= 0xff {
        let name: String = (b..(b + 15).min(0x100))
            .map(|x| format!("\\x{x:02x}"))
            .collect();
        workers.push(Workload::start(&["hold-comm", "--comm", &name]));
        b += 15;
    }
    let pids: Vec<String> = workers.iter().map(|w| w.pid().to_string()).collect();
    let text = eventually(Duration::from_secs(15), "every process to appear", || {
        let text = e.scrape_text();
        let m = bufscope_integration::Metrics::parse(&text);
        pids.iter()
            .all(|p| m.sum("bufscope_setsockopt_total", &[("pid", p.as_str())]) == 1.0)
            .then_some(text)
    });
    let (ok, msg) = promtool_check_metrics(&text);
    assert!(ok, "promtool check metrics failed:\n{msg}");
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn a_disabled_probe_reports_zero_and_the_rest_keep_working() {
    let e = Exporter::start(&["--probe.disable", "owners,autotune"]);
    let m = e.scrape();
    let attached = |p: &str| m.sum("bufscope_probe_attached", &[("probe", p)]);
    assert_eq!(attached("owners"), 0.0);
    assert_eq!(attached("autotune"), 0.0);
    assert_eq!(attached("drops"), 1.0);
    assert_eq!(attached("setsockopt"), 1.0);
    assert_eq!(attached("tcp_state"), 1.0);
    // Drops are still attributed (through /proc, since the owner hooks are off).
    let r = Workload::start(&["udp-recv", "--rcvbuf", "4096"]);
    let port = r.get("ports").to_string();
    let inode: u64 = r.get("inodes").parse().unwrap();
    assert!(Workload::start(&["udp-flood", "--port", &port, "--count", "3000"]).wait());
    let kernel = bufscope_integration::proc_udp_drops(r.pid(), inode).unwrap() as f64;
    let pid = r.pid().to_string();
    eventually(Duration::from_secs(10), "drops", || {
        let v = e
            .scrape()
            .sum("bufscope_socket_drops_total", &[("pid", pid.as_str())]);
        (v == kernel).then_some(())
    });
    let build = e.scrape().sum("bufscope_build_info", &[]);
    assert_eq!(build, 1.0);
}
