//! Bad input: each a clear one-line error naming the problem and the fix, a non-zero exit,
//! never a panic.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

use bufscope_integration::{bufscope_bin, require_root};

fn run(args: &[&str]) -> Output {
    Command::new(bufscope_bin()).args(args).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn assert_clean_error(o: &Output, code: i32, needles: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "exit code; stderr:\n{err}");
    assert!(!err.contains("panicked"), "panic:\n{err}");
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}:\n{err}");
    }
}

#[test]
fn unknown_flag() {
    let o = run(&["run", "--no-such-flag"]);
    assert_clean_error(&o, 2, &["--no-such-flag"]);
}

#[test]
fn malformed_duration() {
    let o = run(&["run", "--retention", "5 parsecs"]);
    assert_clean_error(&o, 2, &["invalid duration"]);
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn malformed_listen_address() {
    require_root();
    let o = run(&["run", "--web.listen-address", "not-an-address"]);
    assert_clean_error(&o, 1, &["--web.listen-address", "HOST:PORT"]);
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn listen_address_in_use() {
    require_root();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let o = run(&["run", "--web.listen-address", &addr]);
    assert_clean_error(&o, 1, &["cannot listen on", &addr, "--web.listen-address"]);
    assert_eq!(
        stderr(&o).trim().lines().count(),
        1,
        "one line: {}",
        stderr(&o)
    );
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn kernel_without_btf() {
    require_root();
    let o = run(&[
        "run",
        "--kernel.btf-path",
        "/nonexistent/vmlinux",
        "--web.listen-address",
        "127.0.0.1:0",
    ]);
    assert_clean_error(&o, 1, &["BTF", "CONFIG_DEBUG_INFO_BTF"]);
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn unknown_probe_name() {
    require_root();
    let o = run(&[
        "run",
        "--probe.disable",
        "dorps",
        "--web.listen-address",
        "127.0.0.1:0",
    ]);
    // The parser takes the names from the list of probes: a usage error with the valid ones.
    assert_clean_error(
        &o,
        2,
        &[
            "invalid value 'dorps' for '--probe.disable <PROBE>'",
            "drops",
        ],
    );
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn missing_capabilities_are_named() {
    require_root();
    // Root without CAP_BPF/CAP_PERFMON/CAP_SYS_ADMIN in its bounding set (and so in the
    // permitted/effective set of the exec'd bufscope).
    let o = Command::new("setpriv")
        .args([
            "--bounding-set",
            "-bpf,-perfmon,-sys_admin",
            "--inh-caps",
            "-bpf,-perfmon,-sys_admin",
            "--",
        ])
        .arg(bufscope_bin())
        .args(["run", "--web.listen-address", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_clean_error(&o, 1, &["CAP_BPF", "CAP_PERFMON"]);
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn check_reports_every_probe_and_succeeds_here() {
    require_root();
    let o = run(&["check"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}\n{}", stderr(&o));
    let probes = bufscope_integration::default_probes();
    assert!(probes.len() >= 5, "{probes:?}");
    for p in &probes {
        assert!(
            out.lines().any(|l| l.starts_with("[ ok ]")
                && l.contains(p.as_str())
                && l.contains("attached")),
            "probe {p} not reported attached:\n{out}"
        );
    }
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn check_fails_without_a_drop_probe() {
    require_root();
    let o = run(&["check", "--probe.disable", "drops"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout).contains("no drop probe can attach"));
}
