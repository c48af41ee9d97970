//! `cargo xtask bench tunnel` stopped by SIGTERM or SIGINT in the middle of a transfer leaves
//! nothing behind: no namespace of its run, none of the processes that ran in them (tunnel
//! ends, iperf3, ping), no wireguard-go socket, no work directory; and it exits with
//! 128 + the signal.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Namespaces whose names start with `prefix` (`ip netns list`).
fn namespaces(prefix: &str) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(prefix))
        .map(str::to_string)
        .collect()
}

/// (pid, command name) of the processes in namespace `ns`.
fn processes(ns: &str) -> Vec<(u32, String)> {
    let out = Command::new("ip")
        .args(["netns", "pids", ns])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .map(|pid: u32| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            (pid, comm.trim().to_string())
        })
        .collect()
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

/// Starts a bench run of wireguard-go over a 50 ms link with a long transfer, sends `sig`
/// while iperf3 runs in the lab, and checks what is left.
fn signal_mid_transfer(sig: i32) {
    let log = std::env::temp_dir().join(format!(
        "xtask-bench-signal-{}-{sig}.log",
        std::process::id()
    ));
    let file = std::fs::File::create(&log).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args([
            "bench",
            "tunnel",
            "--rtts",
            "50",
            "--no-bufscope",
            "--no-peers",
        ])
        .args(["--seconds", "30", "--omit", "1"])
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    let pid = child.id();
    let prefix = format!("bsl{pid:x}x");
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();

    // Wait for the download: both tunnel ends, the iperf3 server and client in the lab.
    let deadline = Instant::now() + Duration::from_secs(90);
    let procs = loop {
        let procs: Vec<(u32, String)> = namespaces(&prefix)
            .iter()
            .flat_map(|ns| processes(ns))
            .collect();
        let iperf3 = procs.iter().filter(|(_, c)| c == "iperf3").count();
        if iperf3 >= 2 && procs.iter().any(|(_, c)| c.starts_with("wireguard")) {
            break procs;
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!("the bench ended early ({st}):\n{}", read_log());
        }
        assert!(
            Instant::now() < deadline,
            "no transfer within 90 s:\n{}",
            read_log()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    println!("signal {sig} to the bench (pid {pid}) with {procs:?} running in its lab");

    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid as i32, sig) };
    let deadline = Instant::now() + Duration::from_secs(40);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "still running 40 s after signal {sig}:\n{}",
            read_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = read_log();
    assert_eq!(status.code(), Some(128 + sig), "{text}");
    assert!(text.contains(&format!("stopped by signal {sig}")), "{text}");
    assert_eq!(namespaces(&prefix), Vec::<String>::new(), "{text}");
    for (p, comm) in &procs {
        assert!(!alive(*p), "{comm} (pid {p}) is still running:\n{text}");
    }
    let sockets: Vec<String> = std::fs::read_dir("/run/wireguard")
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default();
    assert!(sockets.is_empty(), "{sockets:?}");
    assert!(
        !std::env::temp_dir()
            .join(format!("bsl-bench-{pid}"))
            .exists()
    );
    let _ = std::fs::remove_file(&log);
}

#[test]
#[ignore = "needs root, wireguard-go and iperf3 (builds a lab): run via cargo xtask test"]
fn bench_tunnel_stops_cleanly_on_sigterm_and_sigint() {
    signal_mid_transfer(libc::SIGTERM);
    signal_mid_transfer(libc::SIGINT);
}
