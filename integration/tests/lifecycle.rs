//! Lifecycle: a graceful shutdown detaches and unloads every program (checked against the
//! kernel's own view, `bpftool prog show id N`), and logs can be JSON.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use bufscope_integration::Exporter;

/// BPF object ids held open by `pid` (`prog_id:` / `link_id:` lines of /proc/<pid>/fdinfo).
fn held_ids(pid: u32, key: &str) -> BTreeSet<u32> {
    let mut ids = BTreeSet::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .unwrap()
        .flatten()
    {
        if let Ok(text) = std::fs::read_to_string(e.path()) {
            for l in text.lines() {
                if let Some(v) = l.strip_prefix(key) {
                    ids.insert(v.trim().parse().unwrap());
                }
            }
        }
    }
    ids
}

fn exists(kind: &str, id: u32) -> bool {
    Command::new("bpftool")
        .args([kind, "show", "id", &id.to_string()])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn graceful_shutdown_detaches_every_program() {
    let e = Exporter::start(&[]);
    let progs = held_ids(e.pid(), "prog_id:");
    let links = held_ids(e.pid(), "link_id:");
    // 6 programs (kfree_skb, sys_enter/exit_setsockopt, inet_sock_set_state, tcp_rcvbuf_grow,
    // sys_exit_new_socket) and at least one link per attachment that uses bpf links.
    assert!(progs.len() >= 6, "programs held: {progs:?}");
    for id in &progs {
        assert!(
            exists("prog", *id),
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
        .filter(|id| exists("prog", *id))
        .collect();
    assert!(
        gone.is_empty(),
        "programs still loaded after shutdown: {gone:?}"
    );
    let left: Vec<u32> = links
        .iter()
        .copied()
        .filter(|id| exists("link", *id))
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
    let w = bufscope_integration::Workload::start(&[
        "setsockopt",
        "--proto",
        "udp",
        "--opt",
        "SO_RCVBUF",
        "--value",
        "65536",
    ]);
    let want = format!("setsockopt tgid={} opt=8 req=65536", w.pid());
    bufscope_integration::eventually(Duration::from_secs(10), "the BPF log line", || {
        e.log().contains(&want).then_some(())
    });
}
