//! The QUIC transport against itself in two network namespaces (it interoperates only with
//! another bufscope-tunnel): handshake, ping and iperf3 in both modes, the outer socket and the
//! QUIC windows and congestion controller as quinn reports them in effect, reconnects, clean
//! shutdown on SIGTERM/SIGINT, and the one-line errors (unreachable peer, handshake timeout,
//! mode mismatch, keys that do not pair up).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use bufscope_netlab::{Netns, Process, unique_name};
use common::*;

/// Minimum throughput that proves bulk transfer works (only catches a broken data path; the
/// bench measures performance).
const FLOOR_MBIT: f64 = 50.0;

struct Pair {
    // Tunnels first: they stop before their namespaces go.
    ta: Tunnel,
    tb: Tunnel,
    dir: TempDir,
    net: Net,
    ca: std::path::PathBuf,
    cb: std::path::PathBuf,
}

/// b listens on 51822 (no endpoint), a connects to it; `bufscope` lines go to both configs,
/// `flags_a`/`flags_b` to each command line.
fn pair(bufscope: &[&str], flags_a: &[&str], flags_b: &[&str]) -> Pair {
    let net = Net::new();
    let dir = TempDir::new();
    let (ka, kb) = (genkey(), genkey());
    let a = Side::a(&ka, None);
    let b = Side::b(&kb, Some(51822));
    let mut lines = vec!["Transport = quic"];
    lines.extend_from_slice(bufscope);
    let ep = format!("{OUTER_B}:51822");
    let ca = dir.write(
        "a.conf",
        &config(&a, &kb.public, INNER_B, Some(&ep), &lines),
    );
    let cb = dir.write("b.conf", &config(&b, &ka.public, INNER_A, None, &lines));
    let tb = Tunnel::start(&net.b, &cb, dir.path("b.log"), flags_b);
    tb.wait_log("listening on udp", Duration::from_secs(10));
    let ta = Tunnel::start(&net.a, &ca, dir.path("a.log"), flags_a);
    Pair {
        ta,
        tb,
        dir,
        net,
        ca,
        cb,
    }
}

/// Sends `sig` to a tunnel and waits for a clean exit; returns its log.
fn stop(t: &mut Tunnel, sig: i32) -> String {
    let mut proc = t.proc.take().unwrap();
    proc.signal(sig);
    let out = proc.wait_output(Duration::from_secs(5)).unwrap();
    let log = t.log();
    assert!(out.status.success(), "exit status {}: {log}", out.status);
    log
}

/// The number after `key` in `text` (up to the next non-digit).
fn number_after(text: &str, key: &str) -> Option<u64> {
    let start = text.find(key)? + key.len();
    text[start..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()
}

/// The `RcvbufErrors` delta of the outer UDP sockets in both namespaces around `f`.
fn udp_rcvbuf_drops(net: &Net, f: impl FnOnce()) -> (u64, u64) {
    let key = "Udp:RcvbufErrors";
    let before = (
        measure::net_counters(&net.a).unwrap()[key],
        measure::net_counters(&net.b).unwrap()[key],
    );
    f();
    (
        measure::net_counters(&net.a).unwrap()[key] - before.0,
        measure::net_counters(&net.b).unwrap()[key] - before.1,
    )
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn datagram_mode_handshake_ping_iperf3_and_outer_socket() {
    let p = pair(&[], &[], &[]);
    wait_ping(&p.net.a, INNER_B, Duration::from_secs(10), &[&p.ta, &p.tb]);
    for t in [&p.ta, &p.tb] {
        t.wait_log("handshake completed", Duration::from_secs(5));
        let log = t.log();
        assert!(log.contains("mode datagram"), "{log}");
        // The default controller starts at its floor, the policy's 7 MiB UDP buffer, and only
        // grows from there (quinn's own CUBIC would start at 10 packets).
        let window: u64 = log
            .split("congestion controller tunnel in effect, window ")
            .nth(1)
            .and_then(|rest| rest.split(')').next())
            .and_then(|w| w.parse().ok())
            .unwrap_or_else(|| panic!("no tunnel controller and window in {log}"));
        let floor = bufscope_policy::UDP_DEFAULT_BUFFER as u64;
        assert!(
            (floor..floor + (1 << 20)).contains(&window),
            "window {window}"
        );
    }
    assert!(p.ta.log().contains("QUIC connected to 192.168.79.2:51822"));
    assert!(p.tb.log().contains("QUIC connection from 192.168.79.1:"));

    let ping = measure::ping(&p.net.a, INNER_B, 10, Duration::from_millis(100)).unwrap();
    assert_eq!(ping.received, 10, "{ping:?}");
    println!(
        "ping through the QUIC datagram tunnel: avg {:?} ms",
        ping.avg_ms
    );

    // The outer socket as the kernel sees it: the policy's 7 MiB, forced past rmem_max, read
    // back doubled; quinn's UDP socket is the only one on the port.
    let ss_b = ss(&p.net.b, &["-u", "-a", "-m", "sport = :51822"]);
    assert_eq!(
        ss_b.lines().filter(|l| l.contains(":51822")).count(),
        1,
        "{ss_b}"
    );
    assert_eq!(
        skmem_buffers(&ss_b),
        (2 * 7 * 1024 * 1024, 2 * 7 * 1024 * 1024),
        "{ss_b}"
    );

    let drops = udp_rcvbuf_drops(&p.net, || {
        let up = iperf3(&p.net, "quic datagram", false, 3);
        let down = iperf3(&p.net, "quic datagram", true, 3);
        assert!(up.received_mbit > FLOOR_MBIT, "{up:?}");
        assert!(down.received_mbit > FLOOR_MBIT, "{down:?}");
    });
    println!(
        "outer UDP receive-buffer drops: a {} b {}",
        drops.0, drops.1
    );
    assert_eq!(drops, (0, 0), "outer receive-buffer drops");
}

/// The receive windows in effect, read back from quinn twice: from the `TransportConfig` it
/// was given (logged at start) and from its own statistics after a transfer (MAX_DATA frames
/// it sent per byte read; quinn sends one per window/8 read, so bytes × 8 / frames is at least
/// the window in effect). Stream mode puts each chunk on a stream of its own, so the
/// connection's window bounds the tunnel: `recommended` must show the policy's (twice its
/// 16 MiB stream window), `os-default` quinn's (its 1.25 MB stream window, for the
/// connection). The chunks must have been read from many streams, each at most 1 MiB. The
/// second run also checks that `--congestion bbr` is the controller the connection runs.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn stream_mode_windows_in_effect_and_congestion_controller() {
    let policy = bufscope_policy::quic_windows();
    let defaults = quinn_default_windows();
    for (buffer_policy, congestion) in [("recommended", "cubic"), ("os-default", "bbr")] {
        let flags = ["--buffer-policy", buffer_policy, "--congestion", congestion];
        let mut p = pair(&["QuicMode = stream"], &flags, &flags);
        wait_ping(&p.net.a, INNER_B, Duration::from_secs(10), &[&p.ta, &p.tb]);
        p.tb.wait_log("handshake completed", Duration::from_secs(5));
        for t in [&p.ta, &p.tb] {
            let log = t.log();
            assert!(log.contains("mode stream"), "{log}");
            assert!(
                log.contains(&format!(
                    "congestion controller {congestion} in effect, window"
                )),
                "{log}"
            );
        }
        let up = iperf3(&p.net, &format!("quic stream {buffer_policy}"), false, 3);
        assert!(up.received_mbit > FLOOR_MBIT, "{up:?}");

        // Stop b (the receiver of the upload): its shutdown summary has quinn's counters.
        let log = stop(&mut p.tb, libc::SIGTERM);
        let configured = (
            number_after(&log, " stream_receive_window=").unwrap(),
            number_after(&log, " receive_window=").unwrap(),
            number_after(&log, " send_window=").unwrap(),
        );
        let stats = log
            .lines()
            .find(|l| l.contains("QUIC stats at shutdown"))
            .unwrap_or_else(|| panic!("no shutdown stats: {log}"));
        let conn_window = number_after(stats, "connection window in effect ≈ ")
            .unwrap_or_else(|| panic!("no MAX_DATA: {stats}"));
        let bytes = number_after(stats, "stream bytes read ").unwrap();
        let chunks = number_after(stats, &format!("stream bytes read {bytes} in ")).unwrap();
        assert!(
            log.contains("(a stream per chunk, 4096 open at most)"),
            "{log}"
        );
        // 3 s of at least FLOOR_MBIT in chunks of at most 256 KiB and a frame, and the writer
        // appends to the newest stream until a chunk is full: a chunk finished early is
        // followed by a write that did not fit, so chunks average well over 64 KiB (a stream
        // per write made them ~10 KB).
        assert!(bytes > 3 * FLOOR_MBIT as u64 * 1_000_000 / 8, "{stats}");
        assert!(chunks >= bytes / (320 << 10), "{stats}");
        assert!(chunks <= bytes / (64 << 10) + 16, "{stats}");
        println!("{buffer_policy}: configured (stream, connection, send) {configured:?}; {stats}");
        match buffer_policy {
            "recommended" => {
                assert_eq!(
                    configured,
                    (1 << 20, 2 * policy.stream_receive, policy.send)
                );
                assert!(conn_window >= 2 * policy.stream_receive, "{stats}");
            }
            _ => {
                assert_eq!(
                    configured,
                    ((1 << 20).min(defaults.0), defaults.0, defaults.2)
                );
                assert!(conn_window >= defaults.0, "{stats}");
                assert!(
                    conn_window < policy.stream_receive,
                    "quinn's 1.25 MB window should be in effect: {stats}"
                );
            }
        }
    }
}

/// quinn's default (stream, connection, send) windows, from quinn itself.
fn quinn_default_windows() -> (u64, u64, u64) {
    let text = format!("{:?}", quinn::TransportConfig::default());
    (
        number_after(&text, " stream_receive_window: ").unwrap(),
        number_after(&text, " receive_window: ").unwrap(),
        number_after(&text, " send_window: ").unwrap(),
    )
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn stream_mode_ping_and_iperf3_both_ways() {
    let p = pair(&["QuicMode = stream"], &[], &[]);
    wait_ping(&p.net.a, INNER_B, Duration::from_secs(10), &[&p.ta, &p.tb]);
    let ping = measure::ping(&p.net.a, INNER_B, 10, Duration::from_millis(100)).unwrap();
    assert_eq!(ping.received, 10, "{ping:?}");
    // Stream mode defaults to the TCP transport's jumbo inner MTU.
    assert!(p.ta.log().contains("mtu=8920"), "{}", p.ta.log());
    let drops = udp_rcvbuf_drops(&p.net, || {
        let up = iperf3(&p.net, "quic stream", false, 3);
        let down = iperf3(&p.net, "quic stream", true, 3);
        assert!(up.received_mbit > FLOOR_MBIT, "{up:?}");
        assert!(down.received_mbit > FLOOR_MBIT, "{down:?}");
    });
    assert_eq!(drops, (0, 0), "outer receive-buffer drops");
}

/// SIGTERM and SIGINT end the process with status 0 and a CONNECTION_CLOSE the peer sees; the
/// TUN device goes; the connecting side reconnects to a restarted listener.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn shuts_down_cleanly_and_reconnects() {
    let mut p = pair(&[], &[], &[]);
    wait_ping(&p.net.a, INNER_B, Duration::from_secs(10), &[&p.ta, &p.tb]);

    // The listener goes (SIGTERM) and comes back: the client notices at once and reconnects.
    let log = stop(&mut p.tb, libc::SIGTERM);
    assert!(log.contains("SIGTERM received, shutting down"), "{log}");
    assert!(log.contains("QUIC stats at shutdown"), "{log}");
    assert!(p.net.b.ip(["link", "show", "bsttun"]).is_err());
    p.ta.wait_log(
        "closed by the peer: bufscope-tunnel shutting down",
        Duration::from_secs(5),
    );
    p.tb = Tunnel::start(&p.net.b, &p.cb, p.dir.path("b2.log"), &[]);
    p.ta.wait_log("QUIC reconnected to", Duration::from_secs(15));
    wait_ping(&p.net.a, INNER_B, Duration::from_secs(10), &[&p.ta, &p.tb]);

    // The client goes with SIGINT: the listener sees the close and stays up.
    assert!(p.net.a.ip(["link", "show", "bsttun"]).is_ok());
    let log = stop(&mut p.ta, libc::SIGINT);
    assert!(log.contains("SIGINT received, shutting down"), "{log}");
    assert!(log.contains("tun in "), "stats summary missing: {log}");
    assert!(p.net.a.ip(["link", "show", "bsttun"]).is_err());
    p.tb.wait_log(
        "closed by the peer: bufscope-tunnel shutting down",
        Duration::from_secs(5),
    );
    assert!(p.tb.is_running());
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn mode_mismatch_is_a_one_line_error() {
    let mut p = pair(
        &[],
        &["--quic.mode", "datagram"],
        &["--quic.mode", "stream"],
    );
    let _ = p.ta.proc.take().map(Process::kill);
    let mut cmd = p.net.a.command(BIN);
    cmd.arg("-c").arg(&p.ca).args(["--quic.mode", "datagram"]);
    expect_one_line_error(
        cmd,
        &[
            "QUIC mode mismatch: this end uses --quic.mode datagram",
            "the peer at 192.168.79.2:51822 uses --quic.mode stream",
        ],
    );
    p.tb.wait_log("QUIC mode mismatch: the peer at", Duration::from_secs(5));
    assert!(p.tb.is_running(), "the listener stays up");
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn unreachable_peer_handshake_timeout_and_wrong_keys() {
    let dir = TempDir::new();
    let (ka, kb) = (genkey(), genkey());
    let side = |keys| Side::a(keys, None);
    let q = ["Transport = quic"];

    // No route to the endpoint.
    let ns = Netns::create(unique_name(PREFIX, "e")).unwrap();
    let conf = dir.write(
        "u.conf",
        &config(&side(&ka), &kb.public, INNER_B, Some("192.0.2.1:51820"), &q),
    );
    expect_no_route(&ns, &conf, "192.0.2.1:51820");

    // A reachable address where nothing answers QUIC.
    let net = Net::new();
    let conf = dir.write(
        "t.conf",
        &config(
            &side(&ka),
            &kb.public,
            INNER_B,
            Some(&format!("{OUTER_B}:51822")),
            &q,
        ),
    );
    let mut cmd = net.a.command(BIN);
    cmd.arg("-c").arg(&conf).args(["--connect-timeout", "2s"]);
    expect_one_line_error(
        cmd,
        &[
            "QUIC handshake with 192.168.79.2:51822 timed out after 2s",
            "is bufscope-tunnel --transport quic listening on UDP port 51822",
        ],
    );

    // A listener that expects another peer: the certificates derived from the keys differ.
    let kc = genkey();
    let b = Side::b(&kb, Some(51822));
    let cb = dir.write("b.conf", &config(&b, &kc.public, INNER_A, None, &q));
    let tb = Tunnel::start(&net.b, &cb, dir.path("b.log"), &[]);
    tb.wait_log("listening on udp", Duration::from_secs(10));
    let mut cmd = net.a.command(BIN);
    cmd.arg("-c").arg(&conf);
    expect_one_line_error(
        cmd,
        &[
            "QUIC handshake with 192.168.79.2:51822 failed",
            "do not pair up",
        ],
    );
    tb.wait_log("handshake failed", Duration::from_secs(5));
    // Nothing was left behind: the TUN device went with the process.
    assert!(!net.a.ip(["link"]).unwrap().contains("bsttun"));
}
