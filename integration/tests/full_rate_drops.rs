//! Drops counted exactly at the highest rate a local flood reaches, on both CPUs at once: a
//! TUN device's full ring (`FULL_RING`, against `ip -s link`'s tx dropped) under Debian's
//! wireguard-go, the tunnel's own UDP socket behind it, and a UDP receiver flooded from
//! every CPU (`SOCKET_RCVBUFF`, against the socket's drops column). Each flood is repeated:
//! a count that is exact in one run and short in the next is what these tests look for.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bufscope_integration::{Exporter, Metrics, Workload, proc_udp_drops};

const DROPS: &str = "bufscope_socket_drops_total";

/// Runs `sh -c cmd`, panicking with its stderr when it fails; returns its stdout, trimmed.
fn sh(cmd: &str) -> String {
    let o = Command::new("sh").args(["-c", cmd]).output().unwrap();
    assert!(
        o.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// Scrapes until `bufscope(m)` equals `kernel` (a poll may not have read the last drops yet),
/// at most 10 s; returns the last value bufscope showed.
fn settle(e: &Exporter, kernel: u64, bufscope: impl Fn(&Metrics) -> f64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = bufscope(&e.scrape()) as u64;
        if got == kernel || Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Two namespaces joined by veth and a Debian wireguard-go tunnel between them, started as
/// Debian starts it (it daemonizes: the process holding the TUN is not the one started).
/// Torn down on drop.
struct Tunnel {
    ns: [String; 2],
    dev: [String; 2],
    dir: std::path::PathBuf,
}

/// The tunnel's UDP port in namespace `i`.
fn wg_port(i: usize) -> u16 {
    51941 + i as u16
}

impl Tunnel {
    fn up() -> Self {
        let id = std::process::id() % 10_000;
        let ns = [format!("bsfra{id}"), format!("bsfrb{id}")];
        let dev = [format!("bsfr0w{id}"), format!("bsfr1w{id}")];
        let dir = std::env::temp_dir().join(format!("bufscope-full-rate-{id}"));
        std::fs::create_dir_all(&dir).unwrap();
        let t = Self { ns, dev, dir };
        let (a, b) = (&t.ns[0], &t.ns[1]);
        sh(&format!(
            "ip netns add {a} && ip netns add {b} && \
             ip link add bsfr0v{id} netns {a} type veth peer name bsfr1v{id} netns {b} && \
             ip -n {a} addr add 192.168.89.1/24 dev bsfr0v{id} && ip -n {a} link set bsfr0v{id} up && \
             ip -n {a} link set lo up && \
             ip -n {b} addr add 192.168.89.2/24 dev bsfr1v{id} && ip -n {b} link set bsfr1v{id} up && \
             ip -n {b} link set lo up"
        ));
        let mut keys = Vec::new();
        for i in 0..2 {
            let k = t.dir.join(format!("key{i}"));
            sh(&format!("wg genkey > {}", k.display()));
            let public = sh(&format!("wg pubkey < {}", k.display()));
            keys.push((k.display().to_string(), public));
            // Without -f it forks the daemon and returns once the device exists.
            sh(&format!(
                "LOG_LEVEL=error ip netns exec {} wireguard-go {} >/dev/null 2>&1",
                t.ns[i], t.dev[i]
            ));
        }
        for i in 0..2 {
            let j = 1 - i;
            sh(&format!(
                "ip netns exec {ns} wg set {d} listen-port {lp} private-key {k} \
                 peer {peer} endpoint 192.168.89.{e}:{rp} allowed-ips 10.89.0.{e}/32 && \
                 ip -n {ns} addr add 10.89.0.{me}/24 dev {d} && ip -n {ns} link set {d} up",
                ns = t.ns[i],
                d = t.dev[i],
                lp = wg_port(i),
                k = keys[i].0,
                peer = keys[j].1,
                e = j + 1,
                rp = wg_port(j),
                me = i + 1,
            ));
        }
        sh(&format!(
            "ip netns exec {a} ping -c 3 -i 0.2 -W 2 10.89.0.2"
        ));
        t
    }

    /// The wireguard-go daemon of namespace `i` (the process holding its TUN).
    fn wg_pid(&self, i: usize) -> u32 {
        sh(&format!("ip netns pids {}", self.ns[i]))
            .lines()
            .filter_map(|p| p.trim().parse::<u32>().ok())
            .find(|p| {
                std::fs::read_to_string(format!("/proc/{p}/comm"))
                    .is_ok_and(|c| c.trim() == "wireguard-go")
            })
            .unwrap_or_else(|| panic!("no wireguard-go in {}", self.ns[i]))
    }

    /// The kernel's tx dropped of the TUN in namespace `i` (`ip -s link`).
    fn tx_dropped(&self, i: usize) -> u64 {
        let j = sh(&format!(
            "ip -n {} -s -j link show {}",
            self.ns[i], self.dev[i]
        ));
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        v[0]["stats64"]["tx"]["dropped"]
            .as_u64()
            .unwrap_or_else(|| panic!("no tx dropped in {j}"))
    }

    /// The drops column of wireguard-go's UDP sockets (v4 and v6 on its port) in namespace `i`.
    fn wg_socket_drops(&self, i: usize) -> u64 {
        let pid = self.wg_pid(i);
        let port = format!(":{:04X}", wg_port(i));
        ["udp", "udp6"]
            .iter()
            .filter_map(|f| std::fs::read_to_string(format!("/proc/{pid}/net/{f}")).ok())
            .flat_map(|text| {
                text.lines()
                    .skip(1)
                    .filter(|l| {
                        l.split_whitespace()
                            .nth(1)
                            .is_some_and(|local| local.ends_with(&port))
                    })
                    .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
                    .collect::<Vec<_>>()
            })
            .sum()
    }

    /// iperf3 -u at full speed with 64-byte datagrams from A to B through the tunnel for
    /// `secs`: A's TUN ring overflows (wireguard-go cannot read it that fast), and so does
    /// B's wireguard-go socket.
    fn flood(&self, port: u16, secs: u32) {
        let mut server = Command::new("ip")
            .args(["netns", "exec", &self.ns[1], "iperf3", "-s", "-1", "-p"])
            .arg(port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(500));
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.ns[0],
                "iperf3",
                "-c",
                "10.89.0.2",
                "-u",
            ])
            .args(["-b", "0", "-l", "64", "-t", &secs.to_string(), "-p"])
            .arg(port.to_string())
            .output()
            .unwrap();
        let _ = server.wait();
        assert!(
            out.status.success(),
            "iperf3: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        for ns in &self.ns {
            let _ = Command::new("sh")
                .args(["-c", &format!("ip netns pids {ns} | xargs -r kill")])
                .status();
        }
        std::thread::sleep(Duration::from_millis(300));
        for ns in &self.ns {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A TUN ring overflowing at several hundred thousand drops per second, drops landing on both
/// CPUs: `FULL_RING` on the wireguard-go that holds the TUN equals the device's tx dropped
/// after each of three floods, and the UDP drops of the other end's wireguard-go socket equal
/// its drops column.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn tun_full_ring_equals_ip_s_link_at_full_rate() {
    let t = Tunnel::up();
    let e = Exporter::start(&[]);
    let (wg_a, wg_b) = (t.wg_pid(0), t.wg_pid(1));
    let (a, b) = (wg_a.to_string(), wg_b.to_string());
    let secs = 5;
    for round in 1..=3 {
        let before = t.tx_dropped(0);
        let start = Instant::now();
        t.flood(5401 + round, secs);
        let took = start.elapsed().as_secs_f64();
        let kernel = t.tx_dropped(0);
        let rate = (kernel - before) as f64 / took;
        let got = settle(&e, kernel, |m| {
            m.sum(DROPS, &[("pid", a.as_str()), ("reason", "FULL_RING")])
        });
        let sock_kernel = t.wg_socket_drops(1);
        let sock_got = settle(&e, sock_kernel, |m| {
            m.sum(DROPS, &[("pid", b.as_str()), ("reason", "SOCKET_RCVBUFF")])
        });
        eprintln!(
            "round {round}: TUN tx dropped {kernel} (+{} at {rate:.0}/s), bufscope FULL_RING {got} \
             on wireguard-go {wg_a}; wireguard-go {wg_b}'s UDP drops column {sock_kernel}, \
             bufscope {sock_got}",
            kernel - before
        );
        assert!(
            kernel - before > 10_000,
            "the flood should overflow the TUN ring: +{}",
            kernel - before
        );
        assert_eq!(
            got, kernel,
            "round {round}: FULL_RING vs ip -s link tx dropped"
        );
        assert_eq!(
            sock_got, sock_kernel,
            "round {round}: wireguard-go's UDP drops vs its drops column"
        );
    }
    let m = e.scrape();
    assert_eq!(
        m.sum(DROPS, &[("comm", "_unknown")]),
        0.0,
        "nothing left unattributed"
    );
    assert_eq!(
        m.sum(DROPS, &[("reason", "FULL_RING")]),
        t.tx_dropped(0) as f64,
        "no FULL_RING drops anywhere else"
    );
    let lost = m.sum("bufscope_bpf_events_lost_total", &[]);
    assert_eq!(lost, 0.0, "nothing counted as lost");
}

/// A UDP receiver with a 4 KiB buffer flooded from two senders at once (one per CPU, 64-byte
/// datagrams in `sendmmsg` batches): its drops, on both CPUs, equal its drops column after each
/// of three floods.
#[test]
#[ignore = "needs root: run via cargo xtask test"]
fn udp_rcvbuf_drops_equal_the_drops_column_at_full_rate() {
    let e = Exporter::start(&[]);
    let receiver = Workload::start(&["udp-recv", "--rcvbuf", "4096"]);
    let rpid = receiver.pid();
    let inode: u64 = receiver.get("inodes").parse().unwrap();
    let dest = format!("127.0.0.1:{}", receiver.get("ports"));
    let pid = rpid.to_string();
    for round in 1..=3 {
        let before = proc_udp_drops(rpid, inode).unwrap();
        let start = Instant::now();
        let senders: Vec<Workload> = (0..2)
            .map(|_| {
                Workload::start(&[
                    "udp-blast",
                    "--dest",
                    &dest,
                    "--seconds",
                    "3",
                    "--mmsg",
                    "64",
                ])
            })
            .collect();
        for s in senders {
            assert!(s.wait(), "sender failed");
        }
        let took = start.elapsed().as_secs_f64();
        let kernel = proc_udp_drops(rpid, inode).unwrap();
        let got = settle(&e, kernel, |m| {
            m.sum(
                DROPS,
                &[
                    ("pid", pid.as_str()),
                    ("proto", "udp"),
                    ("reason", "SOCKET_RCVBUFF"),
                ],
            )
        });
        eprintln!(
            "round {round}: drops column {kernel} (+{} at {:.0}/s), bufscope {got}",
            kernel - before,
            (kernel - before) as f64 / took
        );
        assert!(
            kernel - before > 10_000,
            "the flood should overflow the buffer"
        );
        assert_eq!(got, kernel, "round {round}");
    }
    let m = e.scrape();
    assert_eq!(m.sum("bufscope_bpf_events_lost_total", &[]), 0.0);
}
