//! One variant measured: idle latency, then a download and an upload through the tunnel, each
//! with a ping alongside and the outer socket's receive-buffer drops.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bufscope_netlab::measure::{self, BackgroundPing};
use bufscope_netlab::{Lab, Netns};
use bufscope_testkit::skmem_rb;

use super::report::{opt_cores, opt_ms};
use super::setup::{Keys, Tunnel, start_tunnel};
use super::{
    Args, INNER_B, IPERF_PORT, Measured, Pin, QuicFigures, TUNNEL_PORT, Transfer, Transport,
    Variant,
};

/// Sets up `v`, measures idle latency, one download and one upload.
pub(super) fn measure_variant(
    lab: &Lab,
    rtt: u64,
    v: Variant,
    a: &Args,
    bin: Option<&Path>,
    keys: &Keys,
    work: &Path,
) -> anyhow::Result<Measured> {
    // `--pin ends` on the ≈0 rows: namespace a's tunnel end and iperf3 on CPU 0, b's on CPU 1.
    let pin = (rtt == 0 && a.pin == Pin::Ends).then_some([0, 1]);
    // The inner flow's congestion control is named, not the machine's default (BBR on some
    // hosts, whose ProbeRTT halts the flow for 200 ms + one RTT every 10 s).
    let mut iperf3_args = vec!["-C", a.inner_cc.as_str()];
    if pin.is_some() {
        iperf3_args.extend(["-A", "0,1"]);
    }
    let bin = match v {
        Variant::BufscopeOther(..) => a.compare_bin.as_deref(),
        _ => bin,
    };
    let mut tunnel = start_tunnel(lab, v, bin, keys, work, &a.quic_congestion, pin)?;
    interrupted()?;
    let idle = measure::ping(lab.a(), INNER_B, 5, Duration::from_millis(200))?;
    let drop_key = match v.transport() {
        Transport::Udp | Transport::QuicDatagram | Transport::QuicStream => "Udp:RcvbufErrors",
        Transport::Tcp => "TcpExt:TCPRcvQDrop",
    };
    let (secs, omit) = if rtt == 0 {
        (a.veth_seconds, 1)
    } else {
        (a.seconds, a.omit)
    };
    let plan = Plan {
        lab,
        drop_key,
        pids: tunnel.pids(),
        secs,
        omit,
        iperf3_args: &iperf3_args,
    };
    let transfer = |reverse: bool| plan.transfer(reverse, &tunnel);
    // One transfer each way (the ≈0 rows repeat in rounds over all variants, see `run`).
    let logged = |reverse: bool| -> anyhow::Result<Transfer> {
        let t = transfer(reverse)?;
        eprintln!(
            "bench tunnel:   {} {:.1} Mbit/s, {} cores per Gbit/s, latency {} ms, {} retransmits, {} outer rcvbuf drops",
            if reverse { "down" } else { "up" },
            t.mbit,
            opt_cores(t.cores_per_gbps),
            opt_ms(t.latency_ms),
            t.retransmits,
            t.drops
        );
        Ok(t)
    };
    let down = logged(true)?;
    interrupted()?;
    let rcvbuf = outer_rcvbuf(lab.a(), v.transport());
    let up = logged(false)?;
    let logs = tunnel.stop();
    keep_logs(rtt, v, &logs);
    let quic = v
        .transport()
        .is_quic()
        .then(|| quic_figures(&logs, v.transport()));
    drop(tunnel);
    Ok(Measured {
        rcvbuf,
        idle_ms: idle.avg_ms,
        down,
        up,
        quic,
    })
}

/// With `BUFSCOPE_BENCH_LOGS=DIR` (for investigations, e.g. with
/// `BUFSCOPE_TUNNEL_LOG=info,bufscope_tunnel=debug`): both ends' logs of the row, copied to
/// `DIR/<rtt>ms-<variant>-<server|client>.log` (a later row of the same name overwrites them).
fn keep_logs(rtt: u64, v: Variant, logs: &[String]) {
    let Some(dir) = std::env::var_os("BUFSCOPE_BENCH_LOGS") else {
        return;
    };
    let dir = Path::new(&dir);
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!(
            "bench tunnel: not keeping logs: creating {}: {e}",
            dir.display()
        );
        return;
    }
    let label: String = format!("{} {}", v.transport().name(), v.label())
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    for (end, log) in ["server", "client"].iter().zip(logs) {
        let path = dir.join(format!("{rtt}ms-{label}-{end}.log"));
        if let Err(e) = std::fs::write(&path, log) {
            eprintln!("bench tunnel: not keeping {}: {e}", path.display());
        }
    }
}

/// What every transfer of a variant shares.
struct Plan<'a> {
    lab: &'a Lab,
    /// The `/proc/net` counter of the outer socket's receive-buffer drops.
    drop_key: &'static str,
    /// Both tunnel processes.
    pids: Vec<u32>,
    secs: u32,
    omit: u32,
    iperf3_args: &'a [&'a str],
}

impl Plan<'_> {
    /// One iperf3 transfer (a download with `reverse`), with a ping alongside, the outer drops
    /// and the tunnels' CPU time.
    fn transfer(&self, reverse: bool, tunnel: &Tunnel) -> anyhow::Result<Transfer> {
        let lab = self.lab;
        // The outer receiver: the client for a download, the server for an upload.
        let receiver = if reverse { lab.a() } else { lab.b() };
        // A server of its own for each transfer: an iperf3 server serves one test at a time,
        // and on a slow lossy path the previous test's end could still be under way in the
        // tunnel's buffers when the next one starts (the server then refused the upload's
        // control connection: "Connection reset by peer").
        let port = IPERF_PORT + u16::from(!reverse);
        let _server = measure::iperf3_server(lab.b(), INNER_B, port)?;
        let before = counter(receiver, self.drop_key)?;
        let ping = BackgroundPing::start(lab.a(), INNER_B, Duration::from_millis(200))?;
        // Both tunnel processes' CPU time over the part of the transfer iperf3 reports (after
        // the omitted seconds), sampled on a thread while iperf3 runs.
        let (r, cpu) = std::thread::scope(|scope| {
            let sampler = scope.spawn(|| cpu_over(&self.pids, self.omit, self.secs));
            let r = measure::iperf3_client(
                lab.a(),
                INNER_B,
                port,
                self.secs,
                self.omit,
                reverse,
                self.iperf3_args,
            );
            (r, sampler.join().ok().flatten())
        });
        let r = r.with_context(|| {
            format!(
                "iperf3 {}{}",
                if reverse { "download" } else { "upload" },
                tunnel.log_tail()
            )
        })?;
        let latency = ping.finish().ok().and_then(|p| p.avg_ms);
        let after = counter(receiver, self.drop_key)?;
        Ok(Transfer {
            mbit: r.received_mbit,
            latency_ms: latency,
            retransmits: r.retransmits,
            drops: after.saturating_sub(before),
            cores_per_gbps: cpu
                .filter(|_| r.received_mbit > 0.0)
                .map(|cores| cores / (r.received_mbit / 1000.0)),
            spread: (r.received_mbit, r.received_mbit),
        })
    }
}

/// An error once a signal stopped the run (the measurement under way is abandoned).
fn interrupted() -> anyhow::Result<()> {
    match super::interrupt::signal() {
        Some(sig) => anyhow::bail!("stopped by signal {sig}"),
        None => Ok(()),
    }
}

/// The median of `runs` by throughput, with that transfer's other figures and the range of
/// all of them.
pub(super) fn median_transfer(mut runs: Vec<Transfer>) -> Option<Transfer> {
    runs.sort_by(|x, y| x.mbit.total_cmp(&y.mbit));
    let mut m = runs.get(runs.len() / 2).copied()?;
    m.spread = (
        runs.first().map_or(m.mbit, |t| t.spread.0),
        runs.last().map_or(m.mbit, |t| t.spread.1),
    );
    Some(m)
}

/// One row from several rounds of the same variant (each [`measure_variant`] with its own
/// tunnel): the median transfer each way with the range of all, the median idle latency, the
/// first round's buffer and the last round's QUIC figures (reconnects summed).
pub(super) fn merge_rounds(rounds: Vec<Measured>) -> Option<Measured> {
    let last = rounds.last()?.clone();
    let mut idle: Vec<f64> = rounds.iter().filter_map(|m| m.idle_ms).collect();
    idle.sort_by(f64::total_cmp);
    let reconnects = rounds
        .iter()
        .filter_map(|m| m.quic.as_ref().map(|q| q.reconnects))
        .sum();
    let transport_closes = rounds
        .iter()
        .filter_map(|m| m.quic.as_ref().map(|q| q.transport_closes))
        .sum();
    Some(Measured {
        rcvbuf: rounds.first()?.rcvbuf,
        idle_ms: idle.get(idle.len() / 2).copied(),
        down: median_transfer(rounds.iter().map(|m| m.down).collect())?,
        up: median_transfer(rounds.iter().map(|m| m.up).collect())?,
        quic: last.quic.map(|q| QuicFigures {
            reconnects,
            transport_closes,
            ..q
        }),
    })
}

/// Cores both tunnel processes used on average (user + system CPU time from
/// `/proc/<pid>/stat` ÷ wall time) from `omit` s + 0.1 s after the call until `omit + secs` s
/// after it: the part of an iperf3 transfer started at the call that iperf3 reports. `None`
/// if a process could not be read at either end.
fn cpu_over(pids: &[u32], omit: u32, secs: u32) -> Option<f64> {
    let start = Instant::now();
    let from = Duration::from_secs(u64::from(omit)) + Duration::from_millis(100);
    let to = Duration::from_secs(u64::from(omit + secs));
    sleep_until(start + from)?;
    let (t0, c0) = (Instant::now(), cpu_seconds(pids)?);
    sleep_until(start + to)?;
    let (t1, c1) = (Instant::now(), cpu_seconds(pids)?);
    let wall = (t1 - t0).as_secs_f64();
    (wall > 0.0).then(|| (c1 - c0) / wall)
}

/// Sleeps until `when`; `None` as soon as a signal stops the run (the transfer it samples has
/// been killed, and the run must not wait out its length).
fn sleep_until(when: Instant) -> Option<()> {
    loop {
        if super::interrupt::signal().is_some() {
            return None;
        }
        let left = when.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Some(());
        }
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
}

/// User + system CPU seconds of the processes `pids` (all their threads, exited ones too).
fn cpu_seconds(pids: &[u32]) -> Option<f64> {
    // SAFETY: sysconf has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let tick = if tick > 0 { tick as f64 } else { 100.0 };
    let mut total = 0.0;
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the command name (which may hold spaces): state is field 3, utime 14,
        // stime 15.
        let rest = &stat[stat.rfind(')')? + 1..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let utime: f64 = f.get(11)?.parse().ok()?;
        let stime: f64 = f.get(12)?.parse().ok()?;
        total += (utime + stime) / tick;
    }
    Some(total)
}

/// The number (digits and one dot) right after `key` in `text`.
fn number_after(text: &str, key: &str) -> Option<f64> {
    let start = text.find(key)? + key.len();
    text[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect::<String>()
        .parse()
        .ok()
}

/// What bufscope-tunnel's shutdown logs (server first, then client) say quinn did.
fn quic_figures(logs: &[String], t: Transport) -> QuicFigures {
    let line = |log: &str, needle: &str| {
        log.lines()
            .rev()
            .find(|l| l.contains(needle))
            .map(str::to_string)
    };
    let client = logs.last().map_or("", String::as_str);
    let offloads = line(client, "outer UDP sent ").unwrap_or_default();
    let stats = line(client, "QUIC stats at shutdown").unwrap_or_default();
    let quinn_drops = (t == Transport::QuicDatagram).then(|| {
        logs.iter()
            .filter_map(|l| line(l, "QUIC stats at shutdown"))
            .filter_map(|s| number_after(&s, "dropped in quinn's receive buffer "))
            .map(|d| d as u64)
            .sum()
    });
    // A connection that ended mid-row: say why (both ends), so that a low figure is explained.
    for (end, log) in ["server", "client"].iter().zip(logs) {
        for l in log.lines().filter(|l| {
            (l.contains("QUIC connection with")
                || l.contains("QUIC receive task")
                || l.contains("reconnecting:"))
                // The client stops first at teardown; the server saying so is no anomaly.
                && !l.contains("bufscope-tunnel shutting down")
        }) {
            eprintln!("bench tunnel:   {end}: {}", l.trim());
        }
    }
    // Each end's count from its shutdown summary ("QUIC connections: … N closed by the
    // transport").
    let transport_closes = logs
        .iter()
        .filter_map(|l| line(l, "QUIC connections: "))
        .filter_map(|s| {
            let at = s.find(" closed by the transport")?;
            s[..at].rsplit(' ').next()?.parse::<u64>().ok()
        })
        .sum();
    QuicFigures {
        reconnects: client.matches("QUIC reconnected to").count(),
        transport_closes,
        datagrams_per_send: number_after(&offloads, "sends ("),
        datagrams_per_recv: number_after(&offloads, "buffers ("),
        quinn_drops,
        window: number_after(&stats, "connection window in effect ≈ ").map(|w| w as u64),
        congestion: line(client, "congestion controller ").and_then(|l| {
            let start = l.find("congestion controller ")? + "congestion controller ".len();
            l[start..].split_whitespace().next().map(str::to_string)
        }),
    }
}

/// One `/proc/net` counter inside `ns`.
fn counter(ns: &Netns, key: &str) -> anyhow::Result<u64> {
    let all: HashMap<String, u64> = measure::net_counters(ns)?;
    all.get(key)
        .copied()
        .with_context(|| format!("no {key} in /proc/net of {}", ns.name()))
}

/// The outer socket's receive buffer (`rb` of `ss -m`) inside `ns`.
fn outer_rcvbuf(ns: &Netns, t: Transport) -> Option<u64> {
    let flag = match t {
        Transport::Udp | Transport::QuicDatagram | Transport::QuicStream => "-Huamn",
        Transport::Tcp => "-Htmn",
    };
    let out = ns.exec("ss", [flag]).ok()?;
    // Records span two lines: the socket, then `skmem:(r0,rb212992,…)`.
    let port = format!(":{TUNNEL_PORT}");
    let mut hit = false;
    for line in out.lines() {
        if line.contains(&port) {
            hit = true;
        }
        if hit && line.contains("skmem:(") {
            return skmem_rb(line);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quic_figures_count_reconnects_and_transport_closes_of_both_ends() {
        let server = "x INFO QUIC connections: 3 established, 0 reconnects, 2 closed by the transport (errors, resets, timeouts)\n";
        let client = "QUIC reconnected to 10.77.0.2:51820 (reconnect 1)\n\
                      QUIC connected to 10.77.0.2:51820 (mode stream, congestion controller tunnel in effect, window 7340032)\n\
                      QUIC connections: 2 established, 1 reconnects, 1 closed by the transport (errors, resets, timeouts)\n";
        let q = quic_figures(&[server.into(), client.into()], Transport::QuicStream);
        assert_eq!(q.reconnects, 1);
        assert_eq!(q.transport_closes, 3);
        assert_eq!(q.congestion.as_deref(), Some("tunnel"));
    }
}
