//! `cargo xtask bench guard-vs-sysctl`: the guard next to the host-wide approach, on the shape
//! of bpftune's own UDP buffer test (`test/udp_rmem_test.sh` in oracle/bpftune): `iperf3 -u`
//! at 500M/1G/5G into a receiver whose default receive buffer is small
//! (`net.core.rmem_default` 16384, the test's `rmem_test`), two network namespaces joined by
//! veth.
//!
//! Three ways, each measured in the same run:
//!
//! - **(a) no tuning**: the small default as it is.
//! - **(b) host sysctls as a host-wide tuner converges them**: bpftune's `udp_buffer_tuner`
//!   rule replayed round by round — after a transfer with receive-buffer drops
//!   (`RcvbufErrors`), `rmem_max` grows by 25% if the dropping socket's buffer was within 25%
//!   of it, then `rmem_default` likewise (one step of each per socket, as the tuner's comment
//!   says; capped at its 256 MiB) — until a transfer has no drop or the rounds run out.
//!   Every new UDP socket on the node then gets the new `rmem_default`.
//! - **(c) the guard**: `bufscope run --guard.mode enforce --guard.comm iperf3`, no sysctl
//!   written: the receiver's socket is raised to the policy's floor at its bind (as much as
//!   `SO_RCVBUF` gives: at most twice `rmem_max`, which the bench leaves as it found it).
//!
//! Reported per rate and way: the receiver's throughput and loss (iperf3's, and the kernel's
//! `InDatagrams`/`RcvbufErrors` in the receiver's namespace), the receive buffer of the
//! receiver's socket and of 20 other UDP sockets opened in the receiver's namespace meanwhile
//! (`ss -uam` skmem rb: what every other UDP user on a node gets under each way), and how many
//! host sysctls differ from the start. Every sysctl the bench changes is restored at the end,
//! on error and on SIGINT/SIGTERM (and, should the bench be killed, at the start of the next
//! run, from a record written before the first change).

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bufscope_testkit::{Exporter, Metrics};

use super::{loadavg, release_dir, table};
use crate::util::{cargo, is_root, run_cmd};

/// Arguments of `cargo xtask bench guard-vs-sysctl`.
#[derive(clap::Args)]
pub struct Args {
    /// Sending rates (iperf3 -b), as bpftune's test.
    #[arg(long, value_delimiter = ',', default_value = "500M,1G,5G")]
    pub rates: Vec<String>,
    /// Measured transfers per rate and way (the table shows medians).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Length of each measured transfer, seconds.
    #[arg(long, default_value_t = 5)]
    pub seconds: u32,
    /// Length of each transfer while the host-wide tuner converges, seconds.
    #[arg(long, default_value_t = 2)]
    pub tune_seconds: u32,
    /// Most transfers the host-wide tuner gets to converge, per rate.
    #[arg(long, default_value_t = 40)]
    pub tune_rounds: usize,
    /// The small default receive buffer (net.core.rmem_default) of the test.
    #[arg(long, default_value_t = 16384)]
    pub rmem_default: u64,
    /// Directory holding a release build of `bufscope` (default: build it).
    #[arg(long)]
    pub bin_dir: Option<std::path::PathBuf>,
}

const TX: &str = "bsp-gvs-tx";
const RX: &str = "bsp-gvs-rx";
const TX_ADDR: &str = "10.203.0.1";
const RX_ADDR: &str = "10.203.0.2";
const PORT: &str = "5201";
/// Other UDP sockets opened in the receiver's namespace under each way.
const BYSTANDERS: usize = 20;
/// bpftune's `UDP_BUFFER_MAX`.
const TUNER_MAX: u64 = 256 << 20;
/// Sysctls the bench may change (global, host-wide).
const SYSCTLS: [&str; 2] = ["net/core/rmem_default", "net/core/rmem_max"];

/// Set by SIGINT/SIGTERM: the bench stops at its next step and restores what it changed.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn check_stop() -> anyhow::Result<()> {
    if STOP.load(Ordering::SeqCst) {
        bail!("interrupted: restoring the sysctls and removing the namespaces");
    }
    Ok(())
}

fn record_path() -> std::path::PathBuf {
    std::env::temp_dir().join("bufscope-guard-vs-sysctl.restore")
}

fn read_sysctl(name: &str) -> anyhow::Result<u64> {
    let p = std::path::Path::new("/proc/sys").join(name);
    std::fs::read_to_string(&p)
        .with_context(|| format!("reading {}", p.display()))?
        .trim()
        .parse()
        .with_context(|| format!("{}: not a number", p.display()))
}

fn write_sysctl(name: &str, v: u64) -> anyhow::Result<()> {
    let p = std::path::Path::new("/proc/sys").join(name);
    std::fs::write(&p, v.to_string()).with_context(|| format!("writing {}", p.display()))
}

/// The host sysctls as the bench found them; written back when dropped.
struct Restore(Vec<(&'static str, u64)>);

impl Restore {
    /// Restores what a killed earlier run left (its record), then records the values now.
    fn take() -> anyhow::Result<Self> {
        let rec = record_path();
        if let Ok(text) = std::fs::read_to_string(&rec) {
            for line in text.lines() {
                if let Some((name, v)) = line.split_once(' ')
                    && SYSCTLS.contains(&name)
                    && let Ok(v) = v.parse()
                {
                    write_sysctl(name, v)?;
                    eprintln!(
                        "bench guard-vs-sysctl: restored {name} = {v} left by an earlier run"
                    );
                }
            }
        }
        let saved: Vec<(&'static str, u64)> = SYSCTLS
            .iter()
            .map(|n| Ok((*n, read_sysctl(n)?)))
            .collect::<anyhow::Result<_>>()?;
        let text: String = saved.iter().map(|(n, v)| format!("{n} {v}\n")).collect();
        std::fs::write(&rec, text).with_context(|| format!("writing {}", rec.display()))?;
        Ok(Self(saved))
    }

    fn original(&self, name: &str) -> u64 {
        self.0
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, v)| *v)
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        let mut ok = true;
        for (n, v) in &self.0 {
            if let Err(e) = write_sysctl(n, *v) {
                eprintln!("bench guard-vs-sysctl: could not restore {n} = {v}: {e:#}");
                ok = false;
            }
        }
        if ok {
            let _ = std::fs::remove_file(record_path());
        }
    }
}

/// The two namespaces; removed when dropped.
struct Veth;

impl Veth {
    fn up() -> anyhow::Result<Self> {
        Self::down();
        let v = Self;
        let sh = |args: &[&str]| run_cmd(Command::new("ip").args(args));
        sh(&["netns", "add", TX])?;
        sh(&["netns", "add", RX])?;
        sh(&[
            "link", "add", "gvs-tx", "netns", TX, "type", "veth", "peer", "name", "gvs-rx",
            "netns", RX,
        ])?;
        sh(&[
            "-n",
            TX,
            "addr",
            "add",
            &format!("{TX_ADDR}/24"),
            "dev",
            "gvs-tx",
        ])?;
        sh(&[
            "-n",
            RX,
            "addr",
            "add",
            &format!("{RX_ADDR}/24"),
            "dev",
            "gvs-rx",
        ])?;
        for (ns, dev) in [(TX, "gvs-tx"), (RX, "gvs-rx")] {
            sh(&["-n", ns, "link", "set", dev, "up"])?;
            sh(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(v)
    }

    fn down() {
        for ns in [TX, RX] {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        Self::down();
    }
}

/// `Udp:` counters of the receiver's namespace: (InDatagrams, RcvbufErrors).
fn rx_udp() -> anyhow::Result<(u64, u64)> {
    let out = Command::new("ip")
        .args(["netns", "exec", RX, "cat", "/proc/net/snmp"])
        .output()
        .context("reading the receiver's /proc/net/snmp")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut udp = text.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(head), Some(vals)) = (udp.next(), udp.next()) else {
        bail!("no Udp: lines in the receiver's /proc/net/snmp");
    };
    let col = |name: &str| -> anyhow::Result<u64> {
        let i = head
            .split_whitespace()
            .position(|h| h == name)
            .with_context(|| format!("no {name} in Udp:"))?;
        vals.split_whitespace()
            .nth(i)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("{name}: no value"))
    };
    Ok((col("InDatagrams")?, col("RcvbufErrors")?))
}

/// `skmem` rb of every UDP socket in the receiver's namespace: (local port, rb).
fn rx_sockets() -> Vec<(u16, u64)> {
    let Ok(out) = Command::new("ip")
        .args(["netns", "exec", RX, "ss", "-uamnH"])
        .output()
    else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut socks = Vec::new();
    let mut port = None;
    for line in text.lines() {
        if !line.starts_with(char::is_whitespace) {
            port = line
                .split_whitespace()
                .nth(3)
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| p.parse().ok());
        }
        if let (Some(p), Some(rb)) = (port, bufscope_testkit::skmem_rb(line)) {
            socks.push((p, rb));
            port = None;
        }
    }
    socks
}

/// A process in the receiver's namespace holding [`BYSTANDERS`] UDP sockets (the node's other
/// UDP users: resolvers, NTP, …), opened under the way being measured.
struct Bystanders(Child);

impl Bystanders {
    fn open() -> anyhow::Result<Self> {
        let script = format!(
            "import socket, sys\n\
             s = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range({BYSTANDERS})]\n\
             [x.bind(('127.0.0.1', 0)) for x in s]\n\
             print('up', flush=True)\nsys.stdin.read()\n"
        );
        let mut c = Command::new("ip")
            .args(["netns", "exec", RX, "python3", "-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the bystander sockets (python3)")?;
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(c.stdout.take().context("bystanders' stdout")?),
            &mut line,
        )?;
        if line.trim() != "up" {
            bail!("the bystander sockets did not come up");
        }
        Ok(Self(c))
    }
}

impl Drop for Bystanders {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What one transfer showed.
#[derive(Clone, Copy, Debug, Default)]
struct Transfer {
    /// Receiver throughput, Mbit/s (iperf3's receiver side).
    mbit: f64,
    /// iperf3's loss, percent.
    loss: f64,
    /// Datagrams the kernel delivered to the receiver's namespace / dropped for a full buffer.
    delivered: u64,
    rcvbuf_errors: u64,
    /// The receiver's socket buffer (skmem rb).
    receiver_rb: u64,
    /// The bystanders' buffers together.
    bystanders_rb: u64,
}

/// One `iperf3 -u -b rate` transfer of `secs` from TX into RX.
fn transfer(rate: &str, secs: u32) -> anyhow::Result<Transfer> {
    check_stop()?;
    let mut server = Command::new("ip")
        .args(["netns", "exec", RX, "iperf3", "-s", "-1", "-p", PORT])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting iperf3 -s")?;
    std::thread::sleep(Duration::from_millis(300));
    let before = rx_udp()?;
    let client = Command::new("ip")
        .args([
            "netns", "exec", TX, "iperf3", "-u", "-b", rate, "-c", RX_ADDR, "-p", PORT,
        ])
        .args(["-t", &secs.to_string(), "-J"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting iperf3 -u")?;
    // The receiver's data socket, read while it runs.
    std::thread::sleep(Duration::from_millis(1000));
    let socks = rx_sockets();
    let port: u16 = PORT.parse().unwrap_or(5201);
    let receiver_rb = socks
        .iter()
        .filter(|(p, _)| *p == port)
        .map(|(_, rb)| *rb)
        .max()
        .unwrap_or(0);
    let bystanders_rb = socks
        .iter()
        .filter(|(p, _)| *p != port)
        .map(|(_, rb)| *rb)
        .sum();
    let out = client.wait_with_output().context("iperf3 -u")?;
    let _ = server.kill();
    let _ = server.wait();
    let after = rx_udp()?;
    check_stop()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("iperf3 -u output: {}", String::from_utf8_lossy(&out.stdout)))?;
    if let Some(e) = v.get("error") {
        bail!("iperf3 -u failed: {e}");
    }
    let sum = &v["end"]["sum"];
    let loss = sum["lost_percent"].as_f64().unwrap_or(f64::NAN);
    let mbit = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or_else(|| sum["bits_per_second"].as_f64().unwrap_or(0.0) * (1.0 - loss / 100.0))
        / 1e6;
    Ok(Transfer {
        mbit,
        loss,
        delivered: after.0.saturating_sub(before.0),
        rcvbuf_errors: after.1.saturating_sub(before.1),
        receiver_rb,
        bystanders_rb,
    })
}

fn median_of(v: &[Transfer], f: impl Fn(&Transfer) -> f64) -> f64 {
    let mut x: Vec<f64> = v.iter().map(f).filter(|x| x.is_finite()).collect();
    x.sort_by(f64::total_cmp);
    match x.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => x[n / 2],
        n => (x[n / 2 - 1] + x[n / 2]) / 2.0,
    }
}

/// bpftune's rule for a socket whose receive buffer is `rcvbuf` and that dropped: (rmem_max,
/// rmem_default) after its events. `BPFTUNE_WITHIN_BITSHIFT(rcvbuf, v, 2)` is
/// `rcvbuf + rcvbuf/4 > v`; a grow adds a quarter (`BPFTUNE_GROW_BY_DELTA` at the default
/// learning rate); `rmem_max` is looked at first; each value grows at most once per socket
/// (then it is out of range for it), both within one transfer that keeps dropping.
fn tuner_step(rcvbuf: u64, rmem_max: u64, rmem_default: u64) -> (u64, u64) {
    let within = |v: u64| rcvbuf + rcvbuf / 4 > v;
    let grow = |v: u64| v + v / 4;
    let mut max = rmem_max;
    let mut def = rmem_default;
    if within(max) && grow(max) < TUNER_MAX {
        max = grow(max);
    }
    if !within(max) && within(def) && grow(def) < TUNER_MAX {
        def = grow(def);
    }
    (max, def)
}

/// One way's result at one rate.
struct Way {
    runs: Vec<Transfer>,
    /// Host sysctls that differ from the bench's starting point.
    changed: usize,
    /// The sysctls in force (rmem_default, rmem_max).
    sysctls: (u64, u64),
    /// The guard's raises of the receiving sockets (bufscope_guard_decisions_total), for (c).
    raises: Option<f64>,
    note: String,
}

fn measure(a: &Args, rate: &str) -> anyhow::Result<Vec<Transfer>> {
    let _b = Bystanders::open()?;
    (0..a.runs).map(|_| transfer(rate, a.seconds)).collect()
}

pub fn run(a: &Args) -> anyhow::Result<()> {
    if !is_root() {
        bail!(
            "cargo xtask bench guard-vs-sysctl writes host sysctls and creates namespaces: run it as root"
        );
    }
    if a.runs == 0 || a.rates.is_empty() {
        bail!("--runs and --rates need at least one");
    }
    let bin = match &a.bin_dir {
        Some(d) => d.join("bufscope"),
        None => {
            run_cmd(cargo().args(["build", "--release", "-p", "bufscope"]))?;
            release_dir().join("bufscope")
        }
    };
    // SAFETY: a handler that only stores to an atomic.
    unsafe {
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
    let started = Instant::now();
    let load_before = loadavg();
    let restore = Restore::take()?;
    let _veth = Veth::up()?;
    let host_max = restore.original("net/core/rmem_max");
    let small = a.rmem_default;
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for rate in &a.rates {
        // Each way starts from the test's small default, the host's rmem_max.
        let reset = || -> anyhow::Result<()> {
            write_sysctl("net/core/rmem_default", small)?;
            write_sysctl("net/core/rmem_max", host_max)
        };
        let changed = |def: u64, max: u64| usize::from(def != small) + usize::from(max != host_max);
        reset()?;
        eprintln!("bench guard-vs-sysctl: {rate}: (a) no tuning");
        let none = Way {
            runs: measure(a, rate)?,
            changed: 0,
            sysctls: (small, host_max),
            raises: None,
            note: String::new(),
        };
        // (b) the host-wide tuner, converged round by round.
        reset()?;
        let (mut def, mut max) = (small, host_max);
        let mut rounds = 0;
        let mut converged = false;
        while rounds < a.tune_rounds {
            rounds += 1;
            let t = transfer(rate, a.tune_seconds)?;
            eprintln!(
                "bench guard-vs-sysctl: {rate}: (b) tuner round {rounds}: rmem_default {def}, \
                 rmem_max {max}: {:.0} Mbit/s, {} RcvbufErrors",
                t.mbit, t.rcvbuf_errors
            );
            if t.rcvbuf_errors == 0 {
                converged = true;
                break;
            }
            let rcvbuf = if t.receiver_rb > 0 {
                t.receiver_rb
            } else {
                def
            };
            let (m, d) = tuner_step(rcvbuf, max, def);
            if (m, d) == (max, def) {
                break;
            }
            (max, def) = (m, d);
            write_sysctl("net/core/rmem_max", max)?;
            write_sysctl("net/core/rmem_default", def)?;
        }
        let tuned = Way {
            runs: measure(a, rate)?,
            changed: changed(def, max),
            sysctls: (def, max),
            raises: None,
            note: format!(
                "{} after {rounds} transfers",
                if converged {
                    "converged (no drop)"
                } else {
                    "still dropping"
                }
            ),
        };
        // (c) the guard, from the small default.
        reset()?;
        let guard = {
            let e = Exporter::start(
                &bin,
                &[
                    "--log.level",
                    "info",
                    "--guard.mode",
                    "enforce",
                    "--guard.comm",
                    "iperf3",
                ],
            )?;
            let runs = measure(a, rate)?;
            // Each transfer's receiving socket is raised at its bind (and gives its grant back
            // when iperf3 closes it): count the raises.
            let raises = Metrics::parse(&e.metrics_text()?).sum(
                "bufscope_guard_decisions_total",
                &[
                    ("comm", "iperf3"),
                    ("rule", "udp-floor"),
                    ("action", "raised"),
                ],
            );
            Way {
                runs,
                changed: changed(
                    read_sysctl("net/core/rmem_default")?,
                    read_sysctl("net/core/rmem_max")?,
                ),
                sysctls: (small, host_max),
                raises: Some(raises),
                note: String::new(),
            }
        };
        let base = median_of(&tuned.runs, |t| t.mbit);
        for (label, w) in [
            ("(a) no tuning", &none),
            ("(b) host sysctls, tuner converged", &tuned),
            ("(c) guard (enforce, --guard.comm iperf3)", &guard),
        ] {
            let mbit = median_of(&w.runs, |t| t.mbit);
            let rb = median_of(&w.runs, |t| t.receiver_rb as f64);
            let others = median_of(&w.runs, |t| t.bystanders_rb as f64);
            rows.push(vec![
                rate.clone(),
                label.to_string(),
                format!("{mbit:.0}"),
                format!("{:.3}", mbit / base),
                format!("{:.2}", median_of(&w.runs, |t| t.loss)),
                format!(
                    "{:.0} / {:.0}",
                    median_of(&w.runs, |t| t.delivered as f64),
                    median_of(&w.runs, |t| t.rcvbuf_errors as f64)
                ),
                format!("{:.0}", rb / 1024.0),
                format!("{:.0}", others / 1024.0),
                format!("{:.1}", (rb + others) / (1 << 20) as f64),
                format!("{} ({}, {})", w.changed, w.sysctls.0, w.sysctls.1),
                match w.raises {
                    Some(g) => format!("{g:.0} receiving sockets raised by the guard"),
                    None => w.note.clone(),
                },
            ]);
        }
        let g = median_of(&guard.runs, |t| t.mbit);
        let mem = |w: &Way| {
            median_of(&w.runs, |t| t.receiver_rb as f64)
                + median_of(&w.runs, |t| t.bystanders_rb as f64)
        };
        notes.push(format!(
            "- {rate}: (c) {:.3} of (b)'s throughput (target ≥ 0.95) {}; receive buffer in the \
             namespace (c) {:.1} MiB vs (b) {:.1} MiB {}; host sysctls changed (c) {} vs (b) {}",
            g / base,
            if g >= 0.95 * base { "✓" } else { "✗" },
            mem(&guard) / (1 << 20) as f64,
            mem(&tuned) / (1 << 20) as f64,
            if mem(&guard) < mem(&tuned) {
                "✓"
            } else {
                "✗"
            },
            guard.changed,
            tuned.changed,
        ));
    }
    drop(_veth);
    drop(restore);
    let mut out = format!(
        "### The guard vs host-wide sysctls (bpftune's UDP test shape)\n\n`iperf3 -u -b RATE` \
         for {} s ({} transfers per way, medians) from one namespace into another over veth; \
         the receiver's default buffer net.core.rmem_default = {small} (bpftune's test value), \
         net.core.rmem_max = {host_max} (as found). (b) replays bpftune's udp_buffer_tuner rule \
         in {} s transfers until one has no drop (at most {}). {BYSTANDERS} other UDP sockets \
         are open in the receiver's namespace during each way. Load average before / after: \
         {load_before} / {}; took {:.0} s.\n\n",
        a.seconds,
        a.runs,
        a.tune_seconds,
        a.tune_rounds,
        loadavg(),
        started.elapsed().as_secs_f64()
    );
    out.push_str(&table(
        &[
            "rate",
            "way",
            "receiver Mbit/s",
            "vs (b)",
            "loss %",
            "kernel: delivered / RcvbufErrors",
            "receiver rb KiB",
            "20 other sockets' rb KiB",
            "namespace total MiB",
            "host sysctls changed (rmem_default, rmem_max)",
            "",
        ],
        &rows,
    ));
    out.push_str("\n\nTargets:\n");
    out.push_str(&notes.join("\n"));
    out.push('\n');
    println!("{out}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tuner_grows_each_value_once_per_socket() {
        // A socket at the default, far below rmem_max: rmem_default grows by a quarter.
        assert_eq!(tuner_step(16384, 4 << 20, 16384), (4 << 20, 20480));
        // A socket at both (bpftune's test: rmem_default = rmem_max = 16384): rmem_max grows
        // first, then (out of its range) rmem_default.
        assert_eq!(tuner_step(16384, 16384, 16384), (20480, 20480));
        // A socket already above both (grown before): nothing.
        assert_eq!(tuner_step(16384, 40960, 40960), (40960, 40960));
        // Capped at bpftune's UDP_BUFFER_MAX.
        let top = TUNER_MAX - 1;
        assert_eq!(tuner_step(top, top, top), (top, top));
    }
}
