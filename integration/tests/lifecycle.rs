//! Lifecycle: a graceful shutdown detaches and unloads every program (checked against the
//! kernel's own view, `bpftool prog show id N`), and logs can be JSON.
#![allow(clippy::unwrap_used)]

use std::io::Write as _;
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

/// A script that starts the real binary with `BUFSCOPE_DEBUG_FAULT=<fault>` (fault injection,
/// compiled into debug builds only; the integration tests run the debug binary).
fn with_fault(dir: &std::path::Path, fault: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let script = dir.join("bufscope-with-fault");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nBUFSCOPE_DEBUG_FAULT={fault} exec {} \"$@\"\n",
            bufscope_integration::bufscope_bin().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn healthz_fails_when_the_collector_is_wedged() {
    let d = bufscope_integration::TempDir::new("wedge");
    // The poll that starts 3 s after start-up never returns and keeps the collector locked
    // (what a hung /proc read or a deadlock would do); HTTP keeps answering.
    let e = Exporter::start_bin(&with_fault(d.path(), "wedge-poll:3"), &[]);
    let (status, body) = e.get("/healthz");
    assert_eq!((status, body.as_str()), (200, "ok\n"), "healthy at first");
    let (status, body) =
        bufscope_integration::eventually(Duration::from_secs(40), "/healthz failing", || {
            let (s, b) = e.get("/healthz");
            (s != 200).then_some((s, b))
        });
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("last successful poll") && body.contains("ago"),
        "says which: {body}"
    );
    eprintln!("wedged collector: /healthz {status}: {}", body.trim());
    // Requests that need the collector now wait for it: at most MAX_IN_FLIGHT (16) on a
    // thread each and MAX_QUEUED (256) more in the queue; the next is refused at once instead
    // of adding to them.
    let waiting: Vec<std::net::TcpStream> = (0..16 + 256)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(&e.addr).unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            s
        })
        .collect();
    // (Time for them to reach their handlers; without the cap the next would wait forever
    // and the client give up after 30 s.)
    std::thread::sleep(Duration::from_secs(2));
    let (status, body) = e.get("/api/v1/status");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("too many requests in flight"), "{body}");
    eprintln!("a request while 272 wait: {status}: {}", body.trim());
    drop(waiting);
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn a_panic_ends_the_daemon() {
    let d = bufscope_integration::TempDir::new("panic");
    // A bug that panics in a poll (with the collector locked) 3 s after start-up: the daemon
    // must exit for its supervisor to restart it, not answer 500 forever.
    let e = Exporter::start_bin(&with_fault(d.path(), "panic-poll:3"), &[]);
    let pid = e.pid();
    let log = e.logs.clone();
    bufscope_integration::eventually(Duration::from_secs(20), "the daemon to exit", || {
        (!std::path::Path::new(&format!("/proc/{pid}/stat")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z'))
            }))
        .then_some(())
    });
    let status = e.stop();
    assert!(!status.success(), "exit status {status:?}");
    let log = log.lock().unwrap().join("\n");
    assert!(
        log.contains("panicked") && log.contains("exits"),
        "the panic and the exit are logged: {log}"
    );
}
