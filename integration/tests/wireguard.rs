//! Kernel WireGuard's drops equal what the module lost, by the kernel's own counters. Two
//! namespaces the test creates, joined by a veth with static neighbours and IPv6 off (so every
//! packet the receiving veth counts is an outer WireGuard datagram), each with a kernel
//! `wireguard` device peered with the other. What the receiver's module lost is `Δ rx_packets`
//! of its veth (outer datagrams in) − `Δ rx_packets + rx_errors + rx_dropped` of its wg device
//! (every message it accounts: data, keepalives, handshakes): the module frees the rest with
//! `consume_skb` and counts them nowhere (`ip -s link` stays at 0 drops). Two loads: datagrams
//! that are no WireGuard message (`malformed`), and a real data message of the tunnel sent
//! again far faster than B decrypts, which fills its per-peer queue and decrypt ring
//! (`peer_queue_full`, `decrypt_ring_full`; what fits is decrypted and freed as a replay).
//! bufscope's `bufscope_wireguard_drops_total` of the receiver's namespace and port must equal
//! the loss exactly, the queue-full reasons must have counted, and every such series must
//! name B's device (`device="wg0"`, read from B's namespace's generic netlink).
//!
//! bufscope starts before the module is loaded (it is unloaded first where it is a module):
//! `--wireguard.queue-drops auto` must attach its hook when the module appears, without a
//! restart, before the devices carry traffic.
//!
//! Needs the `wireguard` module (the matrix's Debian guest kernels have it; this VM has none)
//! and `consume_skb` with `location` (6.3+) or, before, `fentry/consume_skb` (which reads it
//! from the trampoline's frame): elsewhere the test says why and checks what bufscope says
//! about it instead. Every process it starts is a [`Spawned`] or a
//! [`Workload`]: killed and reaped when dropped, also on a failed assertion.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bufscope_integration::{Exporter, Spawned, Workload, bufscope_bin};
use bufscope_netlab::{Netns, PREFIX, unique_name};

const DROPS: &str = "bufscope_wireguard_drops_total";

/// `args` (a program and its arguments) run in `ns`; its standard output, trimmed.
fn exec(ns: &Netns, args: &[&str]) -> String {
    ns.exec(args[0], &args[1..]).unwrap().trim().to_string()
}

fn run(args: &[&str]) {
    let st = Command::new(args[0]).args(&args[1..]).status().unwrap();
    assert!(st.success(), "{args:?} failed");
}

/// Whether this kernel has WireGuard (`wireguard`, loaded here when it is a module).
fn have_wireguard() -> bool {
    let _ = Command::new("modprobe")
        .arg("wireguard")
        .stderr(Stdio::null())
        .status();
    std::path::Path::new("/sys/module/wireguard").exists()
}

/// [`have_wireguard`], saying why the test is skipped when not: the matrix step `step` runs
/// it on the Debian guest kernels.
fn wireguard_or_skip(step: &str) -> bool {
    let have = have_wireguard();
    if !have {
        eprintln!(
            "SKIPPED: this kernel has no wireguard module (no /sys/module/wireguard after \
             modprobe); `cargo xtask matrix --step '{step}'` runs this on the Debian guest \
             kernels"
        );
    }
    have
}

/// Unloads the `wireguard` module; whether it is gone (false: built in, or in use).
fn unload_wireguard() -> bool {
    let _ = Command::new("modprobe")
        .args(["-r", "wireguard"])
        .stderr(Stdio::null())
        .status();
    !std::path::Path::new("/sys/module/wireguard").exists()
}

/// A private key (`wg genkey`) written to a file only root reads, and its public key.
struct Key {
    path: std::path::PathBuf,
    public: String,
}

impl Key {
    fn new(tag: &str) -> Self {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let private = Command::new("wg").arg("genkey").output().unwrap();
        assert!(private.status.success(), "wg genkey");
        let mut pubk = Command::new("wg")
            .arg("pubkey")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        pubk.stdin
            .take()
            .unwrap()
            .write_all(&private.stdout)
            .unwrap();
        let public = pubk.wait_with_output().unwrap();
        let path = std::env::temp_dir().join(format!("bs-wg-{tag}-{}.key", std::process::id()));
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .unwrap()
            .write_all(&private.stdout)
            .unwrap();
        Self {
            path,
            public: String::from_utf8_lossy(&public.stdout).trim().to_string(),
        }
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The receiver's counters: its veth's outer datagrams in, and its wg device's accounted
/// packets (rx_packets, rx_errors, rx_dropped). Read from `/proc/thread-self/net/dev` by a
/// thread inside the namespace (no process per reading: under the matrix's TCG each
/// `ip netns exec` costs about a second); its `drop` column is `rx_dropped +
/// rx_missed_errors`, and neither a veth nor a wg device counts missed packets.
fn readings(b: &Netns, vb: &str) -> (u64, u64, u64, u64) {
    let (ns, vb) = (b.name().to_string(), vb.to_string());
    std::thread::spawn(move || {
        enter(&ns);
        let dev = std::fs::read_to_string("/proc/thread-self/net/dev").unwrap();
        let row = |name: &str| -> [u64; 3] {
            let l = dev
                .lines()
                .find_map(|l| l.trim_start().strip_prefix(&format!("{name}:")))
                .unwrap_or_else(|| panic!("no {name} in {ns}'s /proc/net/dev:\n{dev}"));
            let f: Vec<u64> = l
                .split_ascii_whitespace()
                .map(|v| v.parse().unwrap())
                .collect();
            // rx: bytes packets errs drop …
            [f[1], f[2], f[3]]
        };
        let (v, w) = (row(&vb), row("wg0"));
        (v[0], w[0], w[1], w[2])
    })
    .join()
    .unwrap()
}

/// The readings once they stop moving (every queued packet is through).
fn settled(b: &Netns, vb: &str) -> (u64, u64, u64, u64) {
    let mut last = readings(b, vb);
    loop {
        std::thread::sleep(Duration::from_secs(2));
        let now = readings(b, vb);
        if now == last {
            return now;
        }
        last = now;
    }
}

/// Outer datagrams B's veth received that its wg device did not account for.
fn lost_between(before: (u64, u64, u64, u64), after: (u64, u64, u64, u64)) -> u64 {
    let outer = after.0 - before.0;
    let accounted = (after.1 - before.1) + (after.2 - before.2) + (after.3 - before.3);
    outer.saturating_sub(accounted)
}

/// Two namespaces the test creates, A and B, joined by a veth (static neighbours, IPv6 off:
/// what B's veth receives is WireGuard's outer UDP only), with one kernel WireGuard device
/// pair `wg0` (A on 51820, B on [`Tunnel::pb`]; inside 10.77.0.1 ↔ 10.77.0.2).
struct Tunnel {
    a: Netns,
    b: Netns,
    vb: String,
    ka: Key,
    kb: Key,
    /// A's and B's listen ports of `wg0`.
    pa: String,
    pb: String,
}

impl Tunnel {
    fn new() -> Self {
        let a = Netns::create(unique_name(PREFIX, "wa")).unwrap();
        let b = Netns::create(unique_name(PREFIX, "wb")).unwrap();
        let pid = std::process::id() % 100_000;
        let (va, vb) = (format!("bswa{pid}"), format!("bswb{pid}"));
        run(&[
            "ip", "link", "add", &va, "type", "veth", "peer", "name", &vb,
        ]);
        run(&["ip", "link", "set", &va, "netns", a.name()]);
        run(&["ip", "link", "set", &vb, "netns", b.name()]);
        for (ns, dev) in [(&a, &va), (&b, &vb)] {
            exec(
                ns,
                &[
                    "sysctl",
                    "-qw",
                    &format!("net.ipv6.conf.{dev}.disable_ipv6=1"),
                ],
            );
        }
        a.ip(["addr", "add", "192.168.77.1/24", "dev", &va])
            .unwrap();
        b.ip(["addr", "add", "192.168.77.2/24", "dev", &vb])
            .unwrap();
        a.ip(["link", "set", &va, "up"]).unwrap();
        b.ip(["link", "set", &vb, "up"]).unwrap();
        let mac_a = exec(&a, &["cat", &format!("/sys/class/net/{va}/address")]);
        let mac_b = exec(&b, &["cat", &format!("/sys/class/net/{vb}/address")]);
        for (ns, ip, mac, dev) in [
            (&a, "192.168.77.2", &mac_b, &va),
            (&b, "192.168.77.1", &mac_a, &vb),
        ] {
            ns.ip([
                "neigh",
                "replace",
                ip,
                "lladdr",
                mac,
                "dev",
                dev,
                "nud",
                "permanent",
            ])
            .unwrap();
        }
        let t = Self {
            a,
            b,
            vb,
            ka: Key::new("a"),
            kb: Key::new("b"),
            pa: "51820".into(),
            pb: (51821 + pid % 1000).to_string(),
        };
        t.pair("wg0", &t.pa, &t.pb, "10.77.0");
        t
    }

    /// A device pair `dev` (A listening on `pa`, B on `pb`), inside `{net}.1` ↔ `{net}.2`.
    fn pair(&self, dev: &str, pa: &str, pb: &str, net: &str) {
        for (ns, me, port, peer, peer_ip, peer_port, inner, peer_inner) in [
            (
                &self.a,
                &self.ka,
                pa,
                &self.kb,
                "192.168.77.2",
                pb,
                format!("{net}.1/24"),
                format!("{net}.2/32"),
            ),
            (
                &self.b,
                &self.kb,
                pb,
                &self.ka,
                "192.168.77.1",
                pa,
                format!("{net}.2/24"),
                format!("{net}.1/32"),
            ),
        ] {
            ns.ip(["link", "add", dev, "type", "wireguard"]).unwrap();
            exec(
                ns,
                &[
                    "wg",
                    "set",
                    dev,
                    "private-key",
                    &me.path.to_string_lossy(),
                    "listen-port",
                    port,
                    "peer",
                    &peer.public,
                    "endpoint",
                    &format!("{peer_ip}:{peer_port}"),
                    "allowed-ips",
                    &peer_inner,
                ],
            );
            ns.ip(["addr", "add", &inner, "dev", dev]).unwrap();
            ns.ip(["link", "set", dev, "up"]).unwrap();
        }
    }

    /// Pings `ip` from A until a reply comes through the tunnel (the handshake done).
    fn handshake(&self, ip: &str) {
        let t0 = Instant::now();
        while Command::new("ip")
            .args(["netns", "exec", self.a.name(), "ping", "-c1", "-W2", ip])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| !s.success())
        {
            assert!(
                t0.elapsed() < bufscope_testkit::patience(Duration::from_secs(60)),
                "no handshake through the tunnel to {ip}"
            );
        }
    }
}

#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn kernel_wireguard_queue_drops_equal_what_the_module_lost() {
    if !wireguard_or_skip("kernel WireGuard") {
        return;
    }
    let out = Command::new(bufscope_bin())
        .arg("check")
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let check = String::from_utf8_lossy(&out.stdout);
    // 6.3+: tp_btf/consume_skb carries `location`; before, fentry/consume_skb finds it.
    if check.contains("none are counted") {
        assert!(
            check.contains("consume_skb has no location"),
            "check says the drops are not counted, but not why:\n{check}"
        );
        eprintln!(
            "SKIPPED: consume_skb has no location on this kernel and fentry cannot stand in: \
             bufscope says kernel WireGuard's drops are not counted here"
        );
        return;
    }
    let hook = if check.contains("consume_skb carries location") {
        "tp_btf/consume_skb"
    } else {
        "fentry/consume_skb"
    };
    // bufscope starts without the module; `--wireguard.queue-drops auto` attaches its hook
    // when the module appears.
    let late = unload_wireguard();
    let t0 = Instant::now();
    let exporter = Exporter::start(&[]);
    let armed = |e: &Exporter| e.scrape().sum("bufscope_wireguard_hook_armed", &[]);
    if late {
        assert_eq!(armed(&exporter), 0.0, "hook attached without the module");
        assert!(
            have_wireguard(),
            "modprobe wireguard failed after unloading it"
        );
    } else {
        eprintln!("wireguard is built in (or in use): bufscope started with it loaded");
    }
    bufscope_integration::eventually(
        Duration::from_secs(30),
        "the wireguard hook attached with its 3 discard sites resolved",
        || {
            let m = exporter.scrape();
            (m.sum("bufscope_wireguard_hook_armed", &[]) == 1.0
                && m.sum("bufscope_wireguard_discard_sites", &[]) == 3.0)
                .then_some(())
        },
    );
    eprintln!(
        "module loaded after bufscope started: {late}; {hook} attached {:.1} s after bufscope's start",
        t0.elapsed().as_secs_f64()
    );
    let t = Tunnel::new();
    let (a, b, vb, pb) = (&t.a, &t.b, t.vb.as_str(), t.pb.as_str());
    t.handshake("10.77.0.2");
    let bns = b.inode().unwrap().to_string();
    let labels = [("netns", bns.as_str()), ("port", pb)];
    std::thread::sleep(Duration::from_secs(1));

    // 1. Datagrams to B's WireGuard port that are no WireGuard message (plain UDP from A, not
    // through the tunnel): the module frees each at the `err:` of `wg_packet_receive`, a
    // tail call whose `location` is in `wg_receive`. Exact: every one is lost and counted.
    let before = readings(b, vb);
    let counted0 = exporter.scrape().sum(DROPS, &labels);
    let mut junk = Workload::start_wrapped(
        &["ip", "netns", "exec", a.name()],
        &[
            "udp-blast",
            "--dest",
            &format!("192.168.77.2:{pb}"),
            "--seconds",
            "1",
            "--size",
            "64",
        ],
    );
    let junk_sent = junk.wait_line("SENT", Duration::from_secs(60));
    let after = settled(b, vb);
    let lost = lost_between(before, after);
    assert!(lost > 0, "no junk reached B's WireGuard port");
    let mut l = labels.to_vec();
    l.push(("reason", "malformed"));
    let got = bufscope_integration::eventually(
        Duration::from_secs(20),
        "bufscope's malformed WireGuard drops to equal the module's loss",
        || {
            let v = exporter.scrape().sum(DROPS, &l) - counted0;
            (v == lost as f64).then_some(v)
        },
    );
    eprintln!(
        "junk to the WireGuard port ({junk_sent}): lost inside WireGuard {lost}, bufscope malformed {got}"
    );
    // The device is named: B's `wg0`, read from its namespace's generic netlink.
    let devices = devices_of(&exporter.scrape(), &labels);
    assert_eq!(devices, ["wg0"], "device labels of B's drops");
    eprintln!("device label of B's drops: {devices:?}");

    // 2. Real encrypted data packets, faster than B decrypts. A flood through the tunnel does
    // not outrun the receiver when both ends share one machine's CPUs (measured under TCG:
    // 31,744 sent by three senders, 0 lost), so one data packet of the tunnel is captured on
    // B and sent again, as plain UDP from A, far faster than the tunnel could: B's module
    // queues each for its peer and its decrypt ring as it would a flood, refuses what does not
    // fit (a full per-peer queue, a full ring), decrypts the rest and frees them as replays.
    // All are lost inside WireGuard, every one at a discard site.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let capture = {
        let (ns, port) = (b.name().to_string(), pb.parse::<u16>().unwrap());
        std::thread::spawn(move || capture_data_message(&ns, port, &ready_tx))
    };
    ready_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    run(&[
        "ip",
        "netns",
        "exec",
        a.name(),
        "ping",
        "-c1",
        "-W2",
        "-s",
        "1300",
        "10.77.0.2",
    ]);
    // A large message (-s 1300): decrypting it costs far more than sending it again.
    let message = capture.join().unwrap();
    // Every round must be exact; the queues must fill in one of them (the point of the flood).
    // A round can leave them unfilled when the guest gets little CPU (beside `cargo xtask
    // test`'s host stage its vCPUs run under SCHED_IDLE): then the flood runs again.
    let mut rounds = Vec::new();
    for round in 1..=3 {
        std::thread::sleep(Duration::from_secs(1));
        let before = readings(b, vb);
        let m0 = exporter.scrape();
        let counted0 = m0.sum(DROPS, &labels);
        let senders: Vec<_> = (0..2)
            .map(|_| {
                let (ns, dest, m) = (
                    a.name().to_string(),
                    format!("192.168.77.2:{pb}"),
                    message.clone(),
                );
                std::thread::spawn(move || send_again(&ns, &dest, &m, Duration::from_secs(3)))
            })
            .collect();
        let sent: u64 = senders.into_iter().map(|t| t.join().unwrap()).sum();
        let after = settled(b, vb);
        let outer = after.0 - before.0;
        let accounted = (after.1 - before.1) + (after.2 - before.2) + (after.3 - before.3);
        let lost = lost_between(before, after);
        eprintln!(
            "data message sent again {sent} times; receiver veth rx {outer}, wg0 \
             rx {} errors {} dropped {}: lost inside WireGuard {lost}",
            after.1 - before.1,
            after.2 - before.2,
            after.3 - before.3
        );
        assert!(
            lost > 0,
            "nothing was lost inside WireGuard (outer {outer}, accounted {accounted})"
        );
        let got = bufscope_integration::eventually(
            Duration::from_secs(20),
            "bufscope's WireGuard drops to equal the module's loss",
            || {
                let v = exporter.scrape().sum(DROPS, &labels) - counted0;
                (v >= lost as f64).then_some(v)
            },
        );
        // One more poll: nothing more arrives.
        std::thread::sleep(Duration::from_secs(2));
        let m = exporter.scrape();
        let total = m.sum(DROPS, &labels) - counted0;
        let reason = |r: &str| {
            let mut l = labels.to_vec();
            l.push(("reason", r));
            m.sum(DROPS, &l) - m0.sum(DROPS, &l)
        };
        let by_reason: Vec<String> = [
            "peer_queue_full",
            "decrypt_ring_full",
            "handshake_queue_full",
            "unknown_session",
            "malformed",
            "replayed_or_invalid",
        ]
        .iter()
        .map(|r| format!("{r} {:.0}", reason(r)))
        .collect();
        eprintln!(
            "kernel WireGuard lost {lost} (its wg0 rx_dropped moved {}); bufscope {total} ({got} at \
             first): {}",
            after.3 - before.3,
            by_reason.join(", ")
        );
        assert_eq!(total, lost as f64, "bufscope's count vs the module's loss");
        let devices = devices_of(&m, &labels);
        assert!(
            !devices.is_empty() && devices.iter().all(|d| d == "wg0"),
            "device labels of B's drops: {devices:?}"
        );
        let filled = reason("peer_queue_full") + reason("decrypt_ring_full") > 0.0;
        rounds.push(by_reason);
        if filled {
            return;
        }
        eprintln!("round {round}: the module's queues did not fill: the flood again");
    }
    panic!("the module's queues never filled in 3 rounds: {rounds:?}");
}

/// A peer's last handshake (unix seconds) and rx bytes as the kernel reports them to `wg show
/// <dev> dump` in `ns` (its only peer).
fn wg_peer(ns: &Netns, dev: &str) -> (u64, u64) {
    let out = exec(ns, &["wg", "show", dev, "dump"]);
    // Line 2: public-key preshared-key endpoint allowed-ips latest-handshake rx tx keepalive.
    let f: Vec<&str> = out
        .lines()
        .nth(1)
        .unwrap_or_else(|| panic!("no peer in `wg show {dev} dump`: {out}"))
        .split('\t')
        .collect();
    (f[4].parse().unwrap(), f[5].parse().unwrap())
}

/// Blocks (`add`) or unblocks WireGuard data messages (type 4: the first payload byte) to UDP
/// `port` in `ns`, handshakes passing: iptables' u32 match, else a tc u32 filter on `dev`'s
/// ingress. Returns how it blocked.
fn block_data(ns: &Netns, port: &str, dev: &str, add: bool) -> &'static str {
    let rule = |op: &str| {
        vec![
            "iptables".to_string(),
            op.to_string(),
            "INPUT".into(),
            "-p".into(),
            "udp".into(),
            "--dport".into(),
            port.to_string(),
            "-m".into(),
            "u32".into(),
            "--u32".into(),
            "0>>22&0x3C@8>>24=4".into(),
            "-j".into(),
            "DROP".into(),
        ]
    };
    let try_run = |args: Vec<String>| {
        Command::new("ip")
            .args(["netns", "exec", ns.name()])
            .args(&args)
            .status()
            .is_ok_and(|s| s.success())
    };
    if add {
        if try_run(rule("-A")) {
            return "iptables u32";
        }
        let port_hex = format!("0x{:x}", port.parse::<u16>().unwrap());
        let tc = |args: &[&str]| try_run(args.iter().map(|a| a.to_string()).collect());
        assert!(
            tc(&["tc", "qdisc", "add", "dev", dev, "clsact"])
                && tc(&[
                    "tc", "filter", "add", "dev", dev, "ingress", "protocol", "ip", "u32", "match",
                    "ip", "protocol", "17", "0xff", "match", "ip", "dport", &port_hex, "0xffff",
                    "match", "u8", "4", "0xff", "at", "28", "action", "drop",
                ]),
            "neither iptables' u32 match nor a tc u32 filter could block data messages"
        );
        "tc u32"
    } else {
        if !try_run(rule("-D")) {
            assert!(
                try_run(
                    ["tc", "qdisc", "del", "dev", dev, "clsact"]
                        .iter()
                        .map(|a| a.to_string())
                        .collect()
                ),
                "unblocking"
            );
        }
        ""
    }
}

/// The stall signal against the kernel's own view. Two device pairs between A and B:
/// `wg0`, whose data messages to B are dropped (handshakes pass), and `wg1`, healthy; pings
/// through both from A. A's `wg0` keeps re-handshaking (no reply within
/// `KEEPALIVE_TIMEOUT + REKEY_TIMEOUT`) and receives only B's handshake responses: bufscope
/// must report A's `wg0` peer (B's key) stalled, while `wg show` shows its latest handshake
/// advancing and its rx bytes growing by handshake responses only; `wg1`, and B's `wg0`
/// (whose handshakes never complete: the confirming data message is dropped), must not be;
/// and the stall must end once data passes again.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn kernel_wireguard_stall_is_reported_for_the_blocked_peer_only() {
    if !wireguard_or_skip("WireGuard stall") {
        return;
    }
    let exporter = Exporter::start(&["--wireguard.stall-period", "2s"]);
    let t = Tunnel::new();
    let pid = std::process::id() % 1000;
    let (pa1, pb1) = ((41820 + pid).to_string(), (42820 + pid).to_string());
    t.pair("wg1", &pa1, &pb1, "10.78.0");
    t.handshake("10.77.0.2");
    t.handshake("10.78.0.2");
    let (ans, bns) = (
        t.a.inode().unwrap().to_string(),
        t.b.inode().unwrap().to_string(),
    );
    let pinger = |ip: &str| {
        Spawned::new(
            Command::new("ip")
                .args(["netns", "exec", t.a.name(), "ping", "-q", "-i", "0.2", ip])
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
    };
    let _p0 = pinger("10.77.0.2");
    let _p1 = pinger("10.78.0.2");
    let dev = |ns: &str, d: &str| vec![("netns", ns.to_string()), ("device", d.to_string())];
    let sum = |m: &bufscope_testkit::Metrics, name: &str, l: &[(&str, String)]| {
        let l: Vec<(&str, &str)> = l.iter().map(|(k, v)| (*k, v.as_str())).collect();
        m.sum(name, &l)
    };
    // Healthy: every device of both namespaces read (B's through its bind mount: nothing
    // lives there), one peer each, none stalled.
    let healthy = within(
        &exporter,
        Duration::from_secs(60),
        "bufscope to list the four WireGuard devices of A and B",
        || {
            let m = exporter.scrape();
            let all = [(&ans, "wg0"), (&ans, "wg1"), (&bns, "wg0"), (&bns, "wg1")];
            all.iter()
                .all(|(ns, d)| sum(&m, "bufscope_wireguard_peers", &dev(ns, d)) == 1.0)
                .then_some(m)
        },
    );
    assert_eq!(
        healthy.sum("bufscope_wireguard_stalled_peers", &[]),
        0.0,
        "a stall reported while both tunnels carry pings"
    );
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        exporter
            .scrape()
            .sum("bufscope_wireguard_stalled_peers", &[]),
        0.0
    );
    // Block wg0's data messages into B.
    let how = block_data(&t.b, &t.pb, &t.vb, true);
    let blocked_at = Instant::now();
    eprintln!(
        "data messages to B's wg0 (port {}) blocked with {how}",
        t.pb
    );
    // Replies to pings B had before the block may still arrive: the baseline after them.
    std::thread::sleep(Duration::from_secs(1));
    let (hs0, rx0) = wg_peer(&t.a, "wg0");
    let baseline_at = Instant::now();
    let mut handshakes = vec![hs0];
    // The room's poll time, as sampled by the scrapes (a scrape's poll reads the devices
    // when the period is due): the periodic read's price, four devices in two namespaces.
    let mut poll_max = 0f64;
    let mut polls = Vec::new();
    let stalled_after = within(
        &exporter,
        Duration::from_secs(150),
        "bufscope to report A's wg0 peer stalled",
        || {
            let (hs, _) = wg_peer(&t.a, "wg0");
            if handshakes.last() != Some(&hs) {
                handshakes.push(hs);
            }
            let m = exporter.scrape();
            let p = m.sum(
                "bufscope_signal_poll_duration_seconds",
                &[("signal", "wireguard")],
            );
            poll_max = poll_max.max(p);
            polls.push(p);
            (sum(&m, "bufscope_wireguard_stalled_peers", &dev(&ans, "wg0")) == 1.0)
                .then(|| blocked_at.elapsed())
        },
    );
    let (hs1, rx1) = wg_peer(&t.a, "wg0");
    let measured_for = baseline_at.elapsed();
    if handshakes.last() != Some(&hs1) {
        handshakes.push(hs1);
    }
    let m = exporter.scrape();
    let mut l = dev(&ans, "wg0");
    l.push(("peer", t.kb.public.clone()));
    let peer_series = sum(&m, "bufscope_wireguard_peer_stalled", &l);
    let new_handshakes = handshakes.len() - 1;
    eprintln!(
        "stall reported {:.1} s after the block; kernel (wg show, A's wg0): latest handshake \
         {handshakes:?} ({new_handshakes} new), rx {rx0} -> {rx1} (+{} bytes: handshake \
         responses are 92, initiations 148, keepalives 32); bufscope peer series for B's key \
         {peer_series}",
        stalled_after.as_secs_f64(),
        rx1 - rx0,
    );
    // The kernel's view agrees: the handshakes went on, rx grew by control messages only.
    assert!(
        new_handshakes >= 2,
        "the kernel shows {new_handshakes} new handshakes"
    );
    // What the protocol's timers let a peer send in that time besides data: one initiation
    // (148) and one response (92) per REKEY_TIMEOUT (5 s), keepalives (32) one per
    // KEEPALIVE_TIMEOUT (10 s) and one per handshake (B initiates too, after its own echo
    // replies went unanswered); the pings' replies alone would be 640 bytes a second.
    let secs = measured_for.as_secs().max(1);
    let handshake_msgs = secs.div_ceil(5) + 1;
    let control = handshake_msgs * (148 + 92) + (secs.div_ceil(10) + 1 + handshake_msgs) * 32;
    assert!(
        rx1 - rx0 <= control,
        "A's wg0 rx grew by {} in {secs} s: more than handshake and keepalive messages ({control})",
        rx1 - rx0
    );
    assert_eq!(peer_series, 1.0, "the stalled peer's own series (B's key)");
    assert_eq!(
        sum(
            &m,
            "bufscope_wireguard_peer_stalls_total",
            &dev(&ans, "wg0")
        ),
        1.0
    );
    // The healthy tunnel and B's side (its handshakes never complete) are not stalled.
    for (ns, d) in [(&ans, "wg1"), (&bns, "wg0"), (&bns, "wg1")] {
        assert_eq!(
            sum(&m, "bufscope_wireguard_stalled_peers", &dev(ns, d)),
            0.0,
            "{d} of namespace {ns} reported stalled"
        );
    }
    polls.sort_by(f64::total_cmp);
    eprintln!(
        "wireguard room's poll, sampled at {} scrapes: median {:.2} ms, max {:.2} ms",
        polls.len(),
        polls.get(polls.len() / 2).copied().unwrap_or(0.0) * 1e3,
        poll_max * 1e3
    );
    let (hs_b, _) = wg_peer(&t.b, "wg0");
    eprintln!("B's wg0 latest handshake (kernel): {hs_b}, A's first {hs0}");
    assert_eq!(m.sum("bufscope_wireguard_stalled_peers", &[]), 1.0);
    // Data passes again: the stall ends at the next read that sees rx grow.
    block_data(&t.b, &t.pb, &t.vb, false);
    let cleared = Instant::now();
    within(
        &exporter,
        Duration::from_secs(60),
        "the stall to end once data passes",
        || {
            let m = exporter.scrape();
            (m.sum("bufscope_wireguard_stalled_peers", &[]) == 0.0).then_some(())
        },
    );
    eprintln!(
        "stall ended {:.1} s after data passed again",
        cleared.elapsed().as_secs_f64()
    );
}

/// Polls `f` until it returns `Some`; after `timeout` (times `BUFSCOPE_TEST_PATIENCE`),
/// prints bufscope's WireGuard series and the end of its log, and panics with `what`.
fn within<T>(
    exporter: &Exporter,
    timeout: Duration,
    what: &str,
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let timeout = bufscope_testkit::patience(timeout);
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        if t0.elapsed() > timeout {
            let series: Vec<String> = exporter
                .scrape_text()
                .lines()
                .filter(|l| l.starts_with("bufscope_wireguard"))
                .map(str::to_string)
                .collect();
            let log = exporter.log();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            panic!(
                "timed out after {timeout:?} waiting for {what}\nbufscope's WireGuard series:\n{}\n\
                 its log (last lines, newest first):\n{}",
                series.join("\n"),
                tail.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The `device` labels of the drops series matching `labels`, one per series.
fn devices_of(m: &bufscope_testkit::Metrics, labels: &[(&str, &str)]) -> Vec<String> {
    m.samples
        .iter()
        .filter(|s| {
            s.name == DROPS
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| {
            s.labels
                .get("device")
                .cloned()
                .unwrap_or_else(|| "<none>".into())
        })
        .collect()
}

/// Waits in namespace `ns` (this thread only) for one WireGuard data message (type 4) to UDP
/// port `port` and returns its UDP payload; says on `ready` when it listens.
fn capture_data_message(ns: &str, port: u16, ready: &std::sync::mpsc::Sender<()>) -> Vec<u8> {
    enter(ns);
    // SAFETY: plain socket(2)/setsockopt(2)/recv(2) on an fd this function owns.
    unsafe {
        let fd = libc::socket(
            libc::AF_PACKET,
            libc::SOCK_DGRAM,
            i32::from((libc::ETH_P_IP as u16).to_be()),
        );
        assert!(
            fd >= 0,
            "AF_PACKET socket: {}",
            std::io::Error::last_os_error()
        );
        let tv = libc::timeval {
            tv_sec: 1,
            tv_usec: 0,
        };
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const tv).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        );
        ready.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut buf = vec![0u8; 65536];
        while Instant::now() < deadline {
            let n = libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0);
            if n <= 0 {
                continue;
            }
            let p = &buf[..n as usize];
            let ihl = usize::from(p[0] & 0x0f) * 4;
            if p[0] >> 4 != 4 || p[9] != 17 || p.len() < ihl + 8 + 32 {
                continue;
            }
            let udp = &p[ihl..];
            let payload = &udp[8..];
            if u16::from_be_bytes([udp[2], udp[3]]) == port
                && payload[..4] == [4, 0, 0, 0]
                && payload.len() > 1000
            {
                libc::close(fd);
                return payload.to_vec();
            }
        }
        libc::close(fd);
    }
    panic!("no WireGuard data message to port {port} seen in {ns}");
}

/// Sends `message` to `dest` from namespace `ns` (this thread only) as fast as one socket
/// can for `d`; returns how many went out.
fn send_again(ns: &str, dest: &str, message: &[u8], d: Duration) -> u64 {
    enter(ns);
    let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    let dest: std::net::SocketAddr = dest.parse().unwrap();
    let end = Instant::now() + d;
    let mut sent = 0u64;
    while Instant::now() < end {
        for _ in 0..64 {
            if s.send_to(message, dest).is_ok() {
                sent += 1;
            }
        }
    }
    sent
}

/// Moves this thread into network namespace `ns` (`/run/netns/<ns>`).
fn enter(ns: &str) {
    use std::os::fd::AsRawFd as _;
    let f = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
    // SAFETY: setns(2) on a namespace fd; it changes only the calling thread's namespace.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {ns}: {}", std::io::Error::last_os_error());
}
