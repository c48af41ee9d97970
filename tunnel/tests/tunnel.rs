//! bufscope-tunnel against itself in two network namespaces: handshake, ping and iperf3 over
//! the UDP and TCP transports, the buffer policies as the kernel reports them (`ss -m`, `ss -i`),
//! and clean shutdown on SIGINT/SIGTERM.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;

/// Minimum throughput that proves bulk transfer works (the debug build on 2 busy cores does
/// well over 1 Gbit/s; this floor only catches a broken data path).
const FLOOR_MBIT: f64 = 100.0;

struct Pair {
    // Tunnels first: they stop before their namespaces go.
    ta: Tunnel,
    tb: Tunnel,
    _dir: TempDir,
    net: Net,
}

/// b listens on 51822 without an endpoint; a has b as endpoint (and listens on 51821).
fn pair(extra_bufscope: &[&str], flags: &[&str]) -> Pair {
    pair_with(extra_bufscope, flags, false)
}

/// As [`pair`]; with `both_endpoints`, b also has a's endpoint (both may initiate at once).
fn pair_with(extra_bufscope: &[&str], flags: &[&str], both_endpoints: bool) -> Pair {
    let net = Net::new();
    let dir = TempDir::new();
    let (ka, kb) = (genkey(), genkey());
    let a = Side::a(&ka, Some(51821));
    let b = Side::b(&kb, Some(51822));
    let ep = format!("{OUTER_B}:51822");
    let ep_a = format!("{OUTER_A}:51821");
    let ca = dir.write(
        "a.conf",
        &config(&a, &kb.public, INNER_B, Some(&ep), extra_bufscope),
    );
    let cb = dir.write(
        "b.conf",
        &config(
            &b,
            &ka.public,
            INNER_A,
            both_endpoints.then_some(ep_a.as_str()),
            extra_bufscope,
        ),
    );
    let tb = Tunnel::start(&net.b, &cb, dir.path("b.log"), flags);
    tb.wait_log("bufscope-tunnel up", Duration::from_secs(10));
    let ta = Tunnel::start(&net.a, &ca, dir.path("a.log"), flags);
    Pair {
        ta,
        tb,
        _dir: dir,
        net,
    }
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn udp_handshake_ping_iperf3_and_no_outer_drops() {
    let p = pair(&[], &[]);
    wait_ping(&p.net.a, INNER_B, Duration::from_secs(10), &[&p.ta, &p.tb]);
    p.ta.wait_log("handshake completed", Duration::from_secs(5));
    p.tb.wait_log("handshake completed", Duration::from_secs(5));

    let ping = measure::ping(&p.net.a, INNER_B, 10, Duration::from_millis(100)).unwrap();
    assert_eq!(ping.received, 10, "{ping:?}");
    println!("ping through the UDP tunnel: avg {:?} ms", ping.avg_ms);

    // The recommended policy as the kernel sees it: root has CAP_NET_ADMIN, so 7 MiB is forced
    // past rmem_max (4 MiB here) and `ss` reports the doubled 14 MiB.
    let ss_b = ss(&p.net.b, &["-u", "-a", "-m", "sport = :51822"]);
    let (rb, tb) = skmem_buffers(&ss_b);
    assert_eq!(
        (rb, tb),
        (2 * 7 * 1024 * 1024, 2 * 7 * 1024 * 1024),
        "{ss_b}"
    );
    assert!(
        p.tb.log().contains("effective 14680064 (forced)"),
        "{}",
        p.tb.log()
    );

    let before_a = measure::net_counters(&p.net.a).unwrap();
    let before_b = measure::net_counters(&p.net.b).unwrap();
    let up = iperf3(&p.net, "udp transport", false, 3);
    let down = iperf3(&p.net, "udp transport", true, 3);
    assert!(up.received_mbit > FLOOR_MBIT, "{up:?}");
    assert!(down.received_mbit > FLOOR_MBIT, "{down:?}");
    let after_a = measure::net_counters(&p.net.a).unwrap();
    let after_b = measure::net_counters(&p.net.b).unwrap();
    let drops = |after: &std::collections::HashMap<String, u64>,
                 before: &std::collections::HashMap<String, u64>| {
        after["Udp:RcvbufErrors"] - before["Udp:RcvbufErrors"]
    };
    println!(
        "outer UDP receive-buffer drops: a {} b {}",
        drops(&after_a, &before_a),
        drops(&after_b, &before_b)
    );
    assert_eq!(
        drops(&after_b, &before_b),
        0,
        "outer receive-buffer drops at b"
    );
    assert_eq!(
        drops(&after_a, &before_a),
        0,
        "outer receive-buffer drops at a"
    );
}

/// Both ends know each other's endpoint (both initiate at start, as wg-quick setups do) and
/// the offloads are off: the plain one-packet-per-syscall path carries traffic too.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn udp_both_endpoints_without_offload() {
    let p = pair_with(&[], &["--no-offload"], true);
    wait_ping(&p.net.a, INNER_B, Duration::from_secs(10), &[&p.ta, &p.tb]);
    wait_ping(&p.net.b, INNER_A, Duration::from_secs(10), &[&p.ta, &p.tb]);
    for t in [&p.ta, &p.tb] {
        t.wait_log("handshake completed", Duration::from_secs(5));
        assert!(t.log().contains("offload=false"), "{}", t.log());
        assert!(t.log().contains("gso=false gro=false"), "{}", t.log());
    }
    let up = iperf3(&p.net, "udp, no offload", false, 3);
    let down = iperf3(&p.net, "udp, no offload", true, 3);
    assert!(up.received_mbit > FLOOR_MBIT, "{up:?}");
    assert!(down.received_mbit > FLOOR_MBIT, "{down:?}");
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn tcp_transport_ping_and_iperf3() {
    let p = pair(&["Transport = tcp"], &[]);
    wait_ping(&p.net.a, INNER_B, Duration::from_secs(10), &[&p.ta, &p.tb]);
    let ping = measure::ping(&p.net.a, INNER_B, 10, Duration::from_millis(100)).unwrap();
    assert_eq!(ping.received, 10, "{ping:?}");
    println!("ping through the TCP tunnel: avg {:?} ms", ping.avg_ms);

    // One established outer TCP connection a -> b:51822, and no UDP socket on that port.
    let est = ss(&p.net.a, &["-t", "state", "established", "dport = :51822"]);
    assert_eq!(est.lines().count(), 1, "{est}");
    assert!(est.contains(&format!("{OUTER_B}:51822")), "{est}");
    assert!(
        ss(&p.net.b, &["-u", "-a", "sport = :51822"])
            .trim()
            .is_empty()
    );

    let up = iperf3(&p.net, "tcp transport", false, 3);
    let down = iperf3(&p.net, "tcp transport", true, 3);
    assert!(up.received_mbit > FLOOR_MBIT, "{up:?}");
    assert!(down.received_mbit > FLOOR_MBIT, "{down:?}");
}

/// Parses `wscale:<snd>,<rcv>` from `ss -i` output; returns our (receive) window scale.
fn rcv_wscale(ss_i: &str) -> u32 {
    let w = ss_i
        .split_whitespace()
        .find_map(|t| t.strip_prefix("wscale:"))
        .unwrap_or_else(|| panic!("no wscale in {ss_i}"));
    w.split(',').nth(1).unwrap().parse().unwrap()
}

/// `fixed` is the anti-pattern on purpose: SO_RCVBUF before connect locks the outer TCP buffer
/// at 2 x the request and shrinks the window scale; `recommended` leaves autotuning on.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn tcp_buffer_policies_as_the_kernel_reports_them() {
    let mut seen = Vec::new();
    for policy in ["recommended", "fixed=65536"] {
        let p = pair(&["Transport = tcp"], &["--buffer-policy", policy]);
        wait_ping(&p.net.a, INNER_B, Duration::from_secs(10), &[&p.ta, &p.tb]);
        // Push data towards `a` (reverse: b sends), so a's outer socket is the one receiving
        // bulk data and autotuning has a reason to grow it when unlocked.
        iperf3(&p.net, policy, true, 2);
        let info = ss(
            &p.net.a,
            &["-t", "-i", "-m", "state", "established", "dport = :51822"],
        );
        let (rb, _) = skmem_buffers(&info);
        let wscale = rcv_wscale(&info);
        println!("outer TCP, policy {policy}: rcvbuf {rb}, rcv wscale {wscale}");
        seen.push((policy, rb, wscale));
    }
    let (_, rb_rec, ws_rec) = seen[0];
    let (_, rb_fixed, ws_fixed) = seen[1];
    assert_eq!(
        rb_fixed, 131072,
        "fixed=65536 reads back doubled and stays locked"
    );
    assert!(
        rb_rec > rb_fixed,
        "autotuned buffer {rb_rec} should exceed the fixed {rb_fixed}"
    );
    assert!(
        ws_fixed <= 2,
        "fixed 64 KiB before connect should give wscale <= 2, got {ws_fixed}"
    );
    assert!(
        ws_rec > ws_fixed,
        "recommended wscale {ws_rec} vs fixed {ws_fixed}"
    );
}

/// UDP: `fixed=65536` gives exactly 2 x 65536 (no FORCE), `os-default` the namespace's
/// `net.core.rmem_default`.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn udp_fixed_and_os_default_policies() {
    let p = pair(&[], &["--buffer-policy", "fixed=65536"]);
    wait_ping(&p.net.a, INNER_B, Duration::from_secs(10), &[&p.ta, &p.tb]);
    let (rb, tb) = skmem_buffers(&ss(&p.net.b, &["-u", "-a", "-m", "sport = :51822"]));
    assert_eq!((rb, tb), (131072, 131072));
    drop(p);

    let p = pair(&[], &["--buffer-policy", "os-default"]);
    wait_ping(&p.net.a, INNER_B, Duration::from_secs(10), &[&p.ta, &p.tb]);
    let rmem_default: u64 = p
        .net
        .b
        .sysctl("net.core.rmem_default")
        .unwrap()
        .parse()
        .unwrap();
    let wmem_default: u64 = p
        .net
        .b
        .sysctl("net.core.wmem_default")
        .unwrap()
        .parse()
        .unwrap();
    let (rb, tb) = skmem_buffers(&ss(&p.net.b, &["-u", "-a", "-m", "sport = :51822"]));
    assert_eq!((rb, tb), (rmem_default, wmem_default));
}

/// SIGTERM and SIGINT: exit status 0, a log line, and the TUN device is gone.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn shuts_down_cleanly_on_sigterm_and_sigint() {
    for (sig, name) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGINT, "SIGINT")] {
        let mut p = pair(&[], &[]);
        wait_ping(&p.net.a, INNER_B, Duration::from_secs(10), &[&p.ta, &p.tb]);
        assert!(p.net.a.ip(["link", "show", "bsttun"]).is_ok());
        let mut proc = p.ta.proc.take().unwrap();
        proc.signal(sig);
        let out = proc.wait_output(Duration::from_secs(5)).unwrap();
        assert!(out.status.success(), "{name}: exit status {}", out.status);
        let log = p.ta.log();
        assert!(
            log.contains(&format!("{name} received, shutting down")),
            "{log}"
        );
        assert!(log.contains("tun in "), "stats summary missing: {log}");
        assert!(
            p.net.a.ip(["link", "show", "bsttun"]).is_err(),
            "TUN device still present after {name}"
        );
        assert!(p.tb.is_running());
    }
}
