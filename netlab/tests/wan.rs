//! Accuracy of the emulated WAN link against ping and iperf3, and cleanup after drop, panic
//! and a killed run (checked with `ip netns list`). Bounds are the issue's: ping RTT within
//! ±2 ms of the configured value, one TCP flow within 10% of the configured rate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::BufRead as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use bufscope_netlab::{Lab, LabConfig, LinkParams, Netns, Process, measure};

/// Everything these tests create starts with this (unique per run through the pid).
const PREFIX: &str = "bsl";

fn netns_list() -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect()
}

/// (transmitted, received, avg rtt ms, mdev ms) of `ping a -> b`.
fn ping(lab: &Lab, count: u32, interval_ms: u64) -> (u32, u32, f64, f64) {
    let p = measure::ping(
        lab.a(),
        &lab.addr_b().to_string(),
        count,
        Duration::from_millis(interval_ms),
    )
    .unwrap();
    (
        p.transmitted,
        p.received,
        p.avg_ms.unwrap_or(f64::NAN),
        p.mdev_ms.unwrap_or(f64::NAN),
    )
}

fn wan(link: LinkParams) -> Lab {
    Lab::new(LabConfig::wan(PREFIX, link)).unwrap()
}

fn assert_rtt(rtt_ms: u64, count: u32) {
    let lab = wan(LinkParams::mbit(200).rtt_ms(rtt_ms));
    let (tx, rx, avg, mdev) = ping(&lab, count, 200);
    eprintln!("configured RTT {rtt_ms} ms: ping avg {avg:.3} ms, mdev {mdev:.3} ms ({rx}/{tx})");
    assert_eq!(rx, tx, "ping lost packets on a lossless link");
    assert!(
        (avg - rtt_ms as f64).abs() <= 2.0,
        "RTT {avg:.3} ms, configured {rtt_ms} ms"
    );
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn rtt_50ms_within_2ms() {
    assert_rtt(50, 20);
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn rtt_190ms_within_2ms() {
    assert_rtt(190, 15);
}

/// Received throughput in Mbit/s and retransmits of one iperf3 TCP flow a -> b (`-R`: b -> a).
fn iperf3_mbit(lab: &Lab, secs: u32, omit: u32, reverse: bool) -> (f64, u64) {
    let b = lab.addr_b().to_string();
    let _server = measure::iperf3_server(lab.b(), &b, 5201).unwrap();
    let r = measure::iperf3_client(lab.a(), &b, 5201, secs, omit, reverse, &[]).unwrap();
    (r.received_mbit, r.retransmits)
}

fn assert_rate(mbit: u64, rtt_ms: u64, secs: u32, omit: u32, reverse: bool) {
    let lab = wan(LinkParams::mbit(mbit).rtt_ms(rtt_ms));
    let (got, retr) = iperf3_mbit(&lab, secs, omit, reverse);
    let s = lab.stats().unwrap();
    eprintln!(
        "configured {mbit} Mbit/s at {rtt_ms} ms RTT{}: iperf3 {got:.1} Mbit/s ({:.1}%), {retr} retransmits, \
         queue drops a->b {} b->a {}",
        if reverse { " (reverse)" } else { "" },
        got / mbit as f64 * 100.0,
        s.a_to_b.dropped_queue,
        s.b_to_a.dropped_queue
    );
    let rel = (got - mbit as f64).abs() / mbit as f64;
    assert!(
        rel <= 0.10,
        "single TCP flow {got:.1} Mbit/s, configured {mbit} Mbit/s"
    );
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn rate_single_tcp_flow_50ms_within_10pct() {
    assert_rate(150, 50, 8, 2, false);
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn rate_single_tcp_flow_190ms_reverse_within_10pct() {
    // Slow start overshoots the one-BDP buffer and recovery takes ~4 s at 190 ms (iperf3
    // intervals: 3.5, 66, 77, 116, then 96 Mbit/s steady), longer when the CPUs are busy (one
    // CI run under load measured 89.5 over 8 s): measure the 12 s after that.
    assert_rate(100, 190, 12, 6, true);
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn loss_roughly_as_configured() {
    // 10% per direction: a ping survives both ways with probability 0.81.
    let lab = wan(LinkParams::unlimited().rtt_ms(10).loss(0.10));
    let (tx, rx, _, _) = ping(&lab, 600, 5);
    let lost = 1.0 - f64::from(rx) / f64::from(tx);
    let s = lab.stats().unwrap();
    let fwd = s.a_to_b.dropped_loss as f64 / s.a_to_b.packets_in as f64;
    eprintln!(
        "configured 10%/direction (19% round trip): ping lost {:.1}%, forwarder a->b dropped {:.1}%",
        lost * 100.0,
        fwd * 100.0
    );
    assert_eq!(tx, 600);
    assert!(
        (lost - 0.19).abs() <= 0.05,
        "round-trip loss {:.1}%, expected 19% ± 5",
        lost * 100.0
    );
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn jitter_spreads_rtt_around_configured_delay() {
    // One-way 10 ms ± 5 ms uniform each way: the RTT is triangular on 10..30 ms, median 20 ms,
    // interquartile range 2 × 10 × (1 - 1/√2) ≈ 5.9 ms. Judged on the median and the
    // quartiles of each reply's RTT, which a few replies the 2-core machine delayed (the
    // emulator runs in userspace) do not move, as they did ping's mean and deviation (one run:
    // mdev 8.5 ms).
    let lab = wan(LinkParams::mbit(100)
        .delay(Duration::from_millis(10))
        .jitter(Duration::from_millis(5)));
    let out = lab
        .a()
        .command("ping")
        .args(["-n", "-W", "2", "-c", "100", "-i", "0.05"])
        .arg(lab.addr_b().to_string())
        .output()
        .unwrap();
    let mut rtts: Vec<f64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            l.split("time=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(rtts.len(), 100, "every echo answered on a lossless link");
    rtts.sort_by(f64::total_cmp);
    let q = |p: f64| rtts[((rtts.len() - 1) as f64 * p).round() as usize];
    let (q1, median, q3) = (q(0.25), q(0.5), q(0.75));
    eprintln!(
        "10 ms ± 5 ms each way: RTT quartiles {q1:.2} / {median:.2} / {q3:.2} ms, range {:.2}..{:.2} ms",
        rtts[0],
        rtts[rtts.len() - 1]
    );
    assert!((median - 20.0).abs() <= 2.0, "median RTT {median:.2} ms");
    assert!(
        (3.0..=9.0).contains(&(q3 - q1)),
        "interquartile range {:.2} ms, expected ≈ 5.9",
        q3 - q1
    );
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn drop_and_panic_remove_namespaces_and_processes() {
    let lab = wan(LinkParams::mbit(100).rtt_ms(10));
    let names = [lab.a().name().to_string(), lab.b().name().to_string()];
    let server = lab.b().spawn("iperf3", ["-s"]).unwrap();
    let pid = server.pid();
    std::mem::forget(server); // the lab must kill it
    std::thread::sleep(Duration::from_millis(200));
    assert!(lab.b().pids().unwrap().contains(&pid));
    drop(lab);
    let listed = netns_list();
    assert!(
        names.iter().all(|n| !listed.contains(n)),
        "left behind: {listed:?}"
    );
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(
        stat.is_empty() || stat.contains(") Z"),
        "iperf3 survived: {stat}"
    );

    let names = std::sync::Mutex::new(Vec::new());
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {})); // the panic below is expected
    let r = std::panic::catch_unwind(|| {
        let lab = wan(LinkParams::mbit(100));
        names
            .lock()
            .unwrap()
            .extend([lab.a().name().to_string(), lab.b().name().to_string()]);
        panic!("test panic inside a lab");
    });
    std::panic::set_hook(hook);
    assert!(r.is_err());
    let listed = netns_list();
    let names = names.into_inner().unwrap();
    assert_eq!(names.len(), 2);
    assert!(
        names.iter().all(|n| !listed.contains(n)),
        "left behind after panic: {listed:?}"
    );
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn netlab_cleanup_removes_a_killed_run() {
    let bin = env!("CARGO_BIN_EXE_netlab");
    let mut cmd = Command::new(bin);
    cmd.args(["up", "--rtt-ms", "10", "--rate-mbit", "50"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut up = Process::spawn(&mut cmd).unwrap();
    let pid = up.pid();
    let stdout = up.child_mut().unwrap().stdout.take().unwrap();
    let mut lines = std::io::BufReader::new(stdout).lines();
    assert!(
        lines.any(|l| l.unwrap().contains("side b:")),
        "netlab up did not come up"
    );
    let ours: Vec<String> = netns_list()
        .into_iter()
        .filter(|n| bufscope_netlab::owner_pid(PREFIX, n) == Some(pid))
        .collect();
    assert_eq!(ours.len(), 2, "{ours:?}");
    // The lab works: ping across it.
    let a = Netns::attach(ours.iter().find(|n| n.ends_with('a')).unwrap()).unwrap();
    a.exec("ping", ["-c", "1", "-W", "2", "10.77.0.2"]).unwrap();

    // SIGKILL: no destructor runs, the namespaces stay behind.
    // SAFETY: kill(2) on our own unreaped child.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    up.kill();
    let listed = netns_list();
    assert!(
        ours.iter().all(|n| listed.contains(n)),
        "namespaces vanished without cleanup"
    );

    let out = Command::new(bin).args(["cleanup"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let listed = netns_list();
    assert!(
        ours.iter().all(|n| !listed.contains(n)),
        "cleanup left {listed:?}"
    );
    assert!(ours.iter().all(|n| text.contains(n.as_str())), "{text}");
}
