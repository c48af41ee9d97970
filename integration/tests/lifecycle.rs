//! Lifecycle: a graceful shutdown detaches and unloads every program (checked against the
//! kernel's own view, `bpftool prog show id N`), and logs can be JSON.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bufscope_integration::fixtures::setsockopt;
use bufscope_integration::{Exporter, bpf_exists, held_bpf_ids};

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn graceful_shutdown_detaches_every_program() {
    let e = Exporter::start(&[]);
    let progs = held_bpf_ids(e.pid(), "prog_id:");
    let links = held_bpf_ids(e.pid(), "link_id:");
    // 5 programs (kfree_skb, cgroup_setsockopt, inet_sock_set_state, tcp_rcvbuf_grow,
    // cgroup_sock_create; 6 on the syscall-tracepoint fallback) and at least one link per
    // attachment that uses bpf links.
    assert!(progs.len() >= 5, "programs held: {progs:?}");
    for id in &progs {
        assert!(
            bpf_exists("prog", *id),
            "prog {id} should be loaded while running"
        );
    }
    let log_before = e.log();
    let logs = e.logs.clone();
    let status = e.stop();
    assert!(
        status.success(),
        "SIGTERM must exit cleanly: {status:?}\n{log_before}"
    );
    std::thread::sleep(Duration::from_millis(300));
    let gone: Vec<u32> = progs
        .iter()
        .copied()
        .filter(|id| bpf_exists("prog", *id))
        .collect();
    assert!(
        gone.is_empty(),
        "programs still loaded after shutdown: {gone:?}"
    );
    let left: Vec<u32> = links
        .iter()
        .copied()
        .filter(|id| bpf_exists("link", *id))
        .collect();
    assert!(
        left.is_empty(),
        "links still present after shutdown: {left:?}"
    );
    let log = logs.lock().unwrap().join("\n");
    assert!(log.contains("probes detached"), "{log}");
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn json_logs_are_one_object_per_line() {
    let e = Exporter::start(&["--log.format", "json"]);
    let _ = e.scrape();
    let log = e.log();
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.len() >= 5, "{log}");
    for l in &lines {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|err| panic!("not JSON ({err}): {l}"));
        assert!(v["level"].is_string() && v["timestamp"].is_string(), "{l}");
    }
    assert!(lines.iter().any(|l| l.contains("probe attached")), "{log}");
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn bpf_side_logs_reach_the_daemon_log_at_debug() {
    let e = Exporter::start(&["--log.level", "debug"]);
    let w = setsockopt("udp", "SO_RCVBUF", "65536");
    let want = format!("setsockopt tgid={} opt=8 req=65536", w.pid());
    bufscope_integration::eventually(Duration::from_secs(10), "the BPF log line", || {
        e.log().contains(&want).then_some(())
    });
}
