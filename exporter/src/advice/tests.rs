//! The advice rules against hand-made inputs.
#![allow(clippy::unwrap_used)]
use super::*;

fn p(t: u32) -> ProcRef {
    ProcRef {
        tgid: t,
        start_ticks: 1,
    }
}

fn inputs() -> Inputs {
    let mut meta = BTreeMap::new();
    meta.insert(
        p(1),
        ProcMeta {
            comm: "wireguard-go".into(),
            container: String::new(),
            ..ProcMeta::default()
        },
    );
    Inputs {
        meta,
        rmem_max: Some(212_992),
        wmem_max: Some(212_992),
        tcp_rmem_max: 6_291_456,
        window: Duration::from_secs(60),
        ..Inputs::default()
    }
}

#[test]
fn clamped_udp_request_names_the_sysctl() {
    let mut i = inputs();
    i.drops.push(SocketDrops {
        owner: Some(p(1)),
        inode: 77,
        proto: Proto::Udp,
        reason: "SOCKET_RCVBUFF".into(),
        packets: 5000,
        rate: 120.0,
        rcvbuf: 425_984,
        ifname: String::new(),
    });
    i.opts.push(SocketOpt {
        owner: p(1),
        inode: 77,
        proto: Proto::Udp,
        option: BufOption::Rcvbuf,
        requested: 8 << 20,
        effective: 425_984,
        ret: 0,
        clamped: true,
    });
    let f = evaluate(&i);
    let drops = f.iter().find(|f| f.kind == kind::UDP_RCVBUF_DROPS).unwrap();
    assert_eq!(drops.severity, Severity::Critical);
    assert!(
        drops.summary.contains("dropping 120/s"),
        "{}",
        drops.summary
    );
    assert!(drops.summary.contains("416 KiB"), "{}", drops.summary);
    assert!(
        drops.summary.contains("net.core.rmem_max=212992"),
        "{}",
        drops.summary
    );
    assert!(
        drops.fix.contains("sysctl -w net.core.rmem_max=8388608"),
        "{}",
        drops.fix
    );
    assert_eq!(drops.process.comm, "wireguard-go");
    assert!(f.iter().any(|f| f.kind == kind::RCVBUF_CLAMPED));
}

#[test]
fn unclamped_small_udp_buffer_recommends_policy_size() {
    let mut i = inputs();
    i.drops.push(SocketDrops {
        owner: Some(p(1)),
        inode: 5,
        proto: Proto::Udp,
        reason: "SOCKET_RCVBUFF".into(),
        packets: 10,
        rate: 0.0,
        rcvbuf: 212_992,
        ifname: String::new(),
    });
    let f = evaluate(&i);
    assert_eq!(f[0].severity, Severity::Warning, "no drops in the window");
    assert!(f[0].fix.contains("7.0 MiB"), "{}", f[0].fix);
    assert!(f[0].rule.contains("wireguard-go"));
}

#[test]
fn shrunk_connections_are_critical() {
    let mut i = inputs();
    i.tcp.push((
        p(1),
        TcpShape {
            established: 4,
            shrunk: 3,
            example: Some((1, 10)),
            locks: 3,
        },
    ));
    let f = evaluate(&i);
    assert_eq!(f[0].kind, kind::TCP_WSCALE_SHRUNK);
    assert!(
        f[0].summary.contains("window scale 1 instead of 10"),
        "{}",
        f[0].summary
    );
    assert!(f.iter().any(|f| f.kind == kind::TCP_RCVBUF_LOCK));
}

#[test]
fn autotune_reports_cap_at_rtt() {
    let mut i = inputs();
    i.tunes.push(TuneView {
        owner: Some(p(1)),
        inode: 9,
        suppressed: 12,
        rtt_us: 190_000,
        rcvbuf: 131_072,
        copied: 65536,
        interval_us: 190_000,
    });
    let f = evaluate(&i);
    let a = f
        .iter()
        .find(|f| f.kind == kind::AUTOTUNE_SUPPRESSED)
        .unwrap();
    // 64 KiB window / 190 ms = 2.76 Mbit/s
    assert!((a.evidence["throughput_cap_bps"] - 2_759_410.5).abs() < 10.0);
    assert!(a.summary.contains("190.0 ms"), "{}", a.summary);
    // 64 KiB read per 190 ms: the connection runs at that ceiling.
    assert_eq!(a.severity, Severity::Critical, "{}", a.summary);
    assert!(
        a.summary.starts_with("costs throughput now"),
        "{}",
        a.summary
    );
    assert!(
        !a.summary.contains("  "),
        "one space between words: {}",
        a.summary
    );
    assert!(
        a.summary.contains("(48x)"),
        "6 MiB / 128 KiB: {}",
        a.summary
    );
}

fn tune(rtt_us: u32, rcvbuf: i32, copied: u64, interval_us: u64) -> TuneView {
    TuneView {
        owner: Some(p(1)),
        inode: 9,
        suppressed: 3,
        rtt_us,
        rcvbuf,
        copied,
        interval_us,
    }
}

fn autotune_finding(t: TuneView) -> Finding {
    let mut i = inputs();
    i.tcp_rmem_max = 33_554_432;
    i.tunes.push(t);
    evaluate(&i)
        .into_iter()
        .find(|f| f.kind == kind::AUTOTUNE_SUPPRESSED)
        .unwrap()
}

#[test]
fn a_lock_at_rtt_zero_costs_nothing_and_prints_no_absurd_figure() {
    // What the status page showed on loopback: 9 µs, 128 KiB, 78.8 Gbit/s observed.
    let f = autotune_finding(tune(9, 131_072, 88_650_000, 9_000));
    assert_eq!(f.severity, Severity::Info, "{}", f.summary);
    assert!(
        f.summary.starts_with("costs nothing at this RTT (9 µs"),
        "{}",
        f.summary
    );
    assert!(!f.summary.contains("0.0 ms"), "{}", f.summary);
    // No throughput figure beyond what the host moved: no "14913 Gbit/s".
    for w in f.summary.split_whitespace() {
        if let Ok(v) = w.parse::<f64>() {
            assert!(v < 1000.0, "absurd figure {v} in {}", f.summary);
        }
    }
    // On a WAN path the same lock would cap it: 64 KiB / 50 ms = 10.5 Mbit/s.
    assert!(f.summary.contains("~10.5 Mbit/s"), "{}", f.summary);
    // RTT 0 (unmeasured) is the same case, not a division by zero.
    let f = autotune_finding(tune(0, 131_072, 1_000_000, 1_000));
    assert_eq!(f.severity, Severity::Info);
    assert!(f.evidence["throughput_cap_bps"].is_finite());
}

#[test]
fn an_idle_locked_socket_costs_nothing_now() {
    let f = autotune_finding(tune(40_000, 131_072, 0, 0));
    assert_eq!(f.severity, Severity::Info);
    assert!(
        f.summary.starts_with("costs nothing now (idle)"),
        "{}",
        f.summary
    );
    assert!(
        !f.summary.contains("  "),
        "one space between words: {}",
        f.summary
    );
    assert_eq!(f.evidence["observed_bps"], 0.0);
}

#[test]
fn a_lock_below_its_ceiling_is_latent() {
    // 40 ms, 128 KiB: the ceiling is 13.1 Mbit/s; 1 Mbit/s is flowing.
    let f = autotune_finding(tune(40_000, 131_072, 5_000, 40_000));
    assert_eq!(f.severity, Severity::Warning, "{}", f.summary);
    assert!(
        f.summary.starts_with("not at its ceiling now"),
        "{}",
        f.summary
    );
    assert!(
        !f.summary.contains("  "),
        "one space between words: {}",
        f.summary
    );
    assert!(f.summary.contains("40.0 ms"), "{}", f.summary);
}

fn udp(pid: u32, packets: u64, rate: f64) -> SocketDrops {
    SocketDrops {
        owner: Some(p(pid)),
        inode: 100 + pid as u64,
        proto: Proto::Udp,
        reason: "SOCKET_RCVBUFF".into(),
        packets,
        rate,
        rcvbuf: 212_992,
        ifname: String::new(),
    }
}

#[test]
fn a_single_drop_is_sporadic_not_zero_per_second() {
    let mut i = inputs();
    i.drops.push(udp(1, 1, 1.0 / 60.0));
    let f = evaluate(&i);
    assert_eq!(f[0].severity, Severity::Warning, "{}", f[0].summary);
    assert!(
        f[0].summary
            .contains("dropped 1 in the last 60s (sporadic; 1 in total)"),
        "{}",
        f[0].summary
    );
    assert!(!f[0].summary.contains("0/s"), "{}", f[0].summary);
}

#[test]
fn findings_rank_by_what_they_cost_now() {
    let mut i = inputs();
    for (pid, comm) in [(1, "slow"), (2, "fast"), (3, "once")] {
        i.meta.insert(
            p(pid),
            ProcMeta {
                comm: comm.into(),
                container: String::new(),
                ..ProcMeta::default()
            },
        );
    }
    i.drops.push(udp(1, 600, 10.0));
    i.drops.push(udp(2, 60_000, 1000.0));
    i.drops.push(udp(3, 1, 1.0 / 60.0));
    i.tunes.push(tune(9, 131_072, 88_650_000, 9_000));
    let f = evaluate(&i);
    let order: Vec<(&str, &str)> = f
        .iter()
        .map(|f| (f.process.comm.as_str(), f.severity.as_str()))
        .collect();
    assert_eq!(
        order,
        vec![
            ("fast", "critical"),
            ("slow", "critical"),
            ("once", "warning"),
            ("slow", "info")
        ],
        "{f:#?}"
    );
    assert!(f[0].summary.contains("dropping 1000/s"), "{}", f[0].summary);
}
