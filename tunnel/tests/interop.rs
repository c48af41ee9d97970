//! Interoperability with Debian's `wireguard-go` + `wg`: bufscope-tunnel in namespace a,
//! wireguard-go in namespace b, over UDP. Either side initiates the handshake; traffic flows
//! both ways; keepalives from bufscope-tunnel reach wireguard-go.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use bufscope_netlab::{Netns, Process, unique_name};
use common::*;

/// A wireguard-go device in a namespace, configured with `wg set`.
struct WireguardGo {
    iface: String,
    _proc: Process,
}

impl WireguardGo {
    fn start(
        ns: &Netns,
        key_file: &Path,
        listen_port: u16,
        peer_public: &str,
        endpoint: Option<&str>,
    ) -> WireguardGo {
        // The UAPI socket directory is shared by all namespaces: the name must be unique.
        let iface = unique_name(PREFIX, "w");
        let mut cmd = ns.command("env");
        cmd.args(["LOG_LEVEL=error", "wireguard-go", "-f", &iface])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let proc = Process::spawn(&mut cmd).unwrap();
        let sock = format!("/var/run/wireguard/{iface}.sock");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !Path::new(&sock).exists() {
            assert!(
                Instant::now() < deadline,
                "wireguard-go did not create {sock}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let port = listen_port.to_string();
        let key = key_file.to_str().unwrap();
        let allowed = format!("{INNER_A}/32");
        let mut args = vec![
            "set",
            &iface,
            "listen-port",
            &port,
            "private-key",
            key,
            "peer",
            peer_public,
            "allowed-ips",
            &allowed,
        ];
        if let Some(e) = endpoint {
            args.extend(["endpoint", e]);
        }
        ns.exec("wg", &args).unwrap();
        ns.add_addr(&iface, &format!("{INNER_B}/24")).unwrap();
        ns.link_up(&iface).unwrap();
        WireguardGo { iface, _proc: proc }
    }

    /// `wg show <if> <what>` (e.g. `latest-handshakes`, `transfer`).
    fn show(&self, ns: &Netns, what: &str) -> String {
        ns.exec("wg", ["show", &self.iface, what]).unwrap()
    }
}

/// Second field of the single-peer line of `wg show <if> <what>`.
fn field(show: &str, i: usize) -> u64 {
    show.split_whitespace().nth(i).unwrap().parse().unwrap()
}

struct Setup {
    tunnel: Tunnel,
    wg: WireguardGo,
    _dir: TempDir,
    net: Net,
}

/// bufscope-tunnel in a (listening on 51821), wireguard-go in b (on 51822). `bufscope_initiates`
/// gives bufscope the endpoint and leaves wireguard-go without one, and vice versa.
fn setup(bufscope_initiates: bool) -> Setup {
    let net = Net::new();
    let dir = TempDir::new();
    let (ka, kb) = (genkey(), genkey());
    let kb_file = dir.write("b.key", &kb.private);
    let a = Side::a(&ka, Some(51821));
    let ep_b = format!("{OUTER_B}:51822");
    let ep_a = format!("{OUTER_A}:51821");
    let conf = config(
        &a,
        &kb.public,
        INNER_B,
        bufscope_initiates.then_some(ep_b.as_str()),
        &[],
    );
    let conf = conf.replace("[Peer]\n", "[Peer]\nPersistentKeepalive = 1\n");
    let ca = dir.write("a.conf", &conf);
    let wg = WireguardGo::start(
        &net.b,
        &kb_file,
        51822,
        &ka.public,
        (!bufscope_initiates).then_some(ep_a.as_str()),
    );
    let tunnel = Tunnel::start(&net.a, &ca, dir.path("a.log"), &[]);
    tunnel.wait_log("bufscope-tunnel up", Duration::from_secs(10));
    Setup {
        tunnel,
        wg,
        _dir: dir,
        net,
    }
}

fn exercise(s: &Setup, label: &str, ping_from_b: bool) {
    let (from, to) = if ping_from_b {
        (&s.net.b, INNER_A)
    } else {
        (&s.net.a, INNER_B)
    };
    wait_ping(from, to, Duration::from_secs(10), &[&s.tunnel]);
    let ping = measure::ping(from, to, 10, Duration::from_millis(100)).unwrap();
    assert_eq!(ping.received, 10, "{label}: {ping:?}");
    println!("{label}: ping avg {:?} ms", ping.avg_ms);

    // wg's own view: a recent handshake with bufscope's key.
    let hs = s.wg.show(&s.net.b, "latest-handshakes");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let t = field(&hs, 1);
    assert!(
        t > 0 && now.abs_diff(t) < 60,
        "{label}: wg latest-handshakes {hs}"
    );
    s.tunnel
        .wait_log("handshake completed", Duration::from_secs(5));

    let up = iperf3(&s.net, label, false, 3);
    let down = iperf3(&s.net, label, true, 3);
    assert!(up.received_mbit > 100.0, "{label}: {up:?}");
    assert!(down.received_mbit > 100.0, "{label}: {down:?}");

    // PersistentKeepalive = 1 on bufscope's side: with the tunnel idle, wireguard-go keeps
    // receiving (32-byte keepalives) — its receive counter grows.
    let rx0 = field(&s.wg.show(&s.net.b, "transfer"), 1);
    std::thread::sleep(Duration::from_millis(3500));
    let rx1 = field(&s.wg.show(&s.net.b, "transfer"), 1);
    assert!(
        rx1 >= rx0 + 64,
        "{label}: keepalives not received by wireguard-go ({rx0} -> {rx1})"
    );
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn interop_bufscope_initiates_to_wireguard_go() {
    let s = setup(true);
    exercise(&s, "bufscope -> wireguard-go", false);
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn interop_wireguard_go_initiates_to_bufscope() {
    let s = setup(false);
    exercise(&s, "wireguard-go -> bufscope", true);
    // bufscope learnt wireguard-go's endpoint from the authenticated handshake.
    assert!(
        s.tunnel
            .log()
            .contains(&format!("peer endpoint is now {OUTER_B}:51822")),
        "{}",
        s.tunnel.log()
    );
}
