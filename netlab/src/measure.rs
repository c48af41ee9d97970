//! Ground-truth measurements inside a namespace: `ping`, `iperf3` and the kernel's protocol
//! counters (`/proc/net/snmp`, `/proc/net/netstat`).

use std::collections::HashMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::netns::run_output;
use crate::{Error, Netns, Process};

/// Summary of a `ping` run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PingStats {
    /// Echo requests sent.
    pub transmitted: u32,
    /// Replies received.
    pub received: u32,
    /// Minimum RTT in ms (`None` when nothing came back).
    pub min_ms: Option<f64>,
    /// Average RTT in ms.
    pub avg_ms: Option<f64>,
    /// Maximum RTT in ms.
    pub max_ms: Option<f64>,
    /// Mean deviation of the RTT in ms.
    pub mdev_ms: Option<f64>,
}

impl PingStats {
    /// Parses iputils `ping`'s summary (`N packets transmitted, M received, …` and
    /// `rtt min/avg/max/mdev = a/b/c/d ms`).
    pub fn parse(output: &str) -> Result<PingStats, Error> {
        let numbers = |line: &str| -> Vec<f64> {
            line.split(|c: char| !(c.is_ascii_digit() || c == '.'))
                .filter_map(|s| s.parse().ok())
                .collect()
        };
        let bad = || Error::Command {
            cmd: "ping".into(),
            detail: format!("unexpected output: {output}"),
        };
        let counts = output
            .lines()
            .find(|l| l.contains("packets transmitted"))
            .ok_or_else(bad)?;
        let c = numbers(counts);
        let (tx, rx) = match c.as_slice() {
            [tx, rx, ..] => (*tx as u32, *rx as u32),
            _ => return Err(bad()),
        };
        let rtt = output
            .lines()
            .find(|l| l.starts_with("rtt ") || l.starts_with("round-trip"))
            .and_then(|l| l.split_once('='))
            .map(|(_, v)| numbers(v));
        let at = |i: usize| rtt.as_ref().and_then(|v| v.get(i).copied());
        Ok(PingStats {
            transmitted: tx,
            received: rx,
            min_ms: at(0),
            avg_ms: at(1),
            max_ms: at(2),
            mdev_ms: at(3),
        })
    }

    /// Fraction of echo requests without a reply (0.0 to 1.0).
    pub fn loss(&self) -> f64 {
        if self.transmitted == 0 {
            return 0.0;
        }
        1.0 - f64::from(self.received) / f64::from(self.transmitted)
    }
}

/// Runs `ping -c count -i interval dest` inside `ns` (each reply waited for up to 2 s) and
/// parses its summary. A run where some or all replies are lost is not an error.
pub fn ping(ns: &Netns, dest: &str, count: u32, interval: Duration) -> Result<PingStats, Error> {
    let out = ns
        .command("ping")
        .args([
            "-n",
            "-q",
            "-W",
            "2",
            "-c",
            &count.to_string(),
            "-i",
            &secs(interval),
            dest,
        ])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::Command {
            cmd: format!("ping {dest}"),
            detail: e.to_string(),
        })?;
    PingStats::parse(&String::from_utf8_lossy(&out.stdout))
}

/// A `ping` running in the background (e.g. to measure latency under load); stop it with
/// [`BackgroundPing::finish`].
#[derive(Debug)]
pub struct BackgroundPing(Process);

impl BackgroundPing {
    /// Starts `ping -i interval dest` inside `ns`.
    pub fn start(ns: &Netns, dest: &str, interval: Duration) -> Result<BackgroundPing, Error> {
        let mut c = ns.command("ping");
        c.args(["-n", "-q", "-i", &secs(interval), dest])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        Ok(BackgroundPing(Process::spawn(&mut c)?))
    }

    /// Stops the ping (SIGINT, which makes it print its summary) and parses the summary.
    pub fn finish(mut self) -> Result<PingStats, Error> {
        self.0.signal(libc::SIGINT);
        let out = self.0.wait_output(Duration::from_secs(5))?;
        PingStats::parse(&String::from_utf8_lossy(&out.stdout))
    }
}

/// `0.2` for 200 ms (ping's -i format).
fn secs(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64())
}

/// Result of one iperf3 TCP transfer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Iperf3Result {
    /// Throughput seen by the receiver, Mbit/s (10^6 bit/s).
    pub received_mbit: f64,
    /// Throughput sent, Mbit/s.
    pub sent_mbit: f64,
    /// TCP retransmissions of the sender.
    pub retransmits: u64,
}

/// Starts `iperf3 -s` bound to `bind` inside `ns` on `port` and waits (up to 5 s) until it
/// listens. The server is killed when the returned [`Process`] is dropped.
pub fn iperf3_server(ns: &Netns, bind: &str, port: u16) -> Result<Process, Error> {
    let port_s = port.to_string();
    let mut server = ns.spawn("iperf3", ["-s", "-B", bind, "-p", &port_s])?;
    let deadline = Instant::now() + Duration::from_secs(5);
    let filter = format!("sport = :{port}");
    loop {
        if ns.exec("ss", ["-Htln", &filter])?.contains(&port_s) {
            return Ok(server);
        }
        if !server.is_running() || Instant::now() > deadline {
            return Err(Error::Command {
                cmd: format!("iperf3 -s -B {bind} -p {port} in {}", ns.name()),
                detail: "the server did not start listening".into(),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs one iperf3 TCP flow from `ns` to `server:port` for `secs` seconds, the first `omit`
/// seconds (slow start) left out of the result; `reverse` makes the server send (`-R`, a
/// download as seen from `ns`). `extra` are further iperf3 flags. A refused or reset control
/// connection (a server still finishing the previous test) is retried up to 3 times.
pub fn iperf3_client(
    ns: &Netns,
    server: &str,
    port: u16,
    secs: u32,
    omit: u32,
    reverse: bool,
    extra: &[&str],
) -> Result<Iperf3Result, Error> {
    let mut c = ns.command("iperf3");
    c.args(["-c", server, "-p", &port.to_string(), "-J"])
        .args(["-t", &secs.to_string(), "-O", &omit.to_string()])
        .args(extra);
    if reverse {
        c.arg("-R");
    }
    let cmd = format!("iperf3 -c {server} in {}", ns.name());
    c.stdin(Stdio::null());
    let mut attempt = 0;
    loop {
        let out = c.output().map_err(|e| Error::Command {
            cmd: cmd.clone(),
            detail: e.to_string(),
        })?;
        match parse_iperf3(&String::from_utf8_lossy(&out.stdout)) {
            Ok(r) => return Ok(r),
            // A server that is still tearing down the previous test resets or refuses the
            // next control connection for a moment; try again before giving up.
            Err(detail)
                if attempt < IPERF3_CONNECT_RETRIES && detail.contains("unable to connect") =>
            {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(detail) => return Err(Error::Command { cmd, detail }),
        }
    }
}

/// Extra attempts of [`iperf3_client`] when the server refuses the connection.
const IPERF3_CONNECT_RETRIES: u32 = 3;

/// Extracts the totals from iperf3's JSON output.
fn parse_iperf3(json: &str) -> Result<Iperf3Result, String> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("output is not JSON ({e}): {json}"))?;
    if let Some(e) = v.get("error") {
        return Err(format!("iperf3: {e}"));
    }
    let end = &v["end"];
    let bps = |k: &str| end[k]["bits_per_second"].as_f64();
    Ok(Iperf3Result {
        received_mbit: bps("sum_received").ok_or("no end.sum_received in iperf3 output")? / 1e6,
        sent_mbit: bps("sum_sent").unwrap_or(0.0) / 1e6,
        retransmits: end["sum_sent"]["retransmits"].as_u64().unwrap_or(0),
    })
}

/// The kernel's protocol counters as seen from inside `ns`, keyed `Proto:Name` (e.g.
/// `Udp:RcvbufErrors`, `TcpExt:TCPRcvQDrop`), from `/proc/net/snmp` and `/proc/net/netstat`.
pub fn net_counters(ns: &Netns) -> Result<HashMap<String, u64>, Error> {
    let text = run_output(
        ns.command("cat")
            .args(["/proc/net/snmp", "/proc/net/netstat"]),
    )?;
    let mut map = HashMap::new();
    let lines: Vec<&str> = text.lines().collect();
    // Each protocol has a header line and a value line with the same prefix.
    for pair in lines.windows(2) {
        let (Some((p1, names)), Some((p2, values))) =
            (pair[0].split_once(':'), pair[1].split_once(':'))
        else {
            continue;
        };
        if p1 != p2
            || names
                .split_whitespace()
                .next()
                .is_some_and(|n| n.parse::<i64>().is_ok())
        {
            continue;
        }
        for (n, v) in names.split_whitespace().zip(values.split_whitespace()) {
            if let Ok(v) = v.parse::<u64>() {
                map.insert(format!("{p1}:{n}"), v);
            }
        }
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ping_summary() {
        let out = "PING 10.77.0.2 (10.77.0.2) 56(84) bytes of data.\n\n--- 10.77.0.2 ping statistics ---\n\
                   20 packets transmitted, 19 received, 5% packet loss, time 3804ms\n\
                   rtt min/avg/max/mdev = 50.446/50.705/51.379/0.271 ms\n";
        let p = PingStats::parse(out).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((p.transmitted, p.received), (20, 19));
        assert_eq!(p.avg_ms, Some(50.705));
        assert_eq!(p.mdev_ms, Some(0.271));
        assert!((p.loss() - 0.05).abs() < 1e-9);
        let none = "3 packets transmitted, 0 received, 100% packet loss, time 2003ms\n";
        assert_eq!(PingStats::parse(none).map(|p| p.avg_ms).ok(), Some(None));
        assert!(PingStats::parse("ping: connect: Network is unreachable").is_err());
    }

    #[test]
    fn parses_iperf3_totals() {
        let j = r#"{"end":{"sum_sent":{"bits_per_second":150000000.0,"retransmits":7},
                    "sum_received":{"bits_per_second":144700000.0}}}"#;
        let r = parse_iperf3(j).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.retransmits, 7);
        assert!((r.received_mbit - 144.7).abs() < 1e-9);
        assert!(parse_iperf3(r#"{"error":"unable to connect"}"#).is_err());
    }
}
