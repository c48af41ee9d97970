//! Section 4: the syscall tax — what an *unrelated* syscall (getppid, `perf bench syscall
//! basic`) and a buffer `setsockopt` cost while bufscope runs, next to no bufscope at all.
//!
//! The `syscalls:sys_*` tracepoints switch every task onto the syscall-tracing slow path while
//! any program is attached to one, so they tax every syscall on the node; bufscope's default
//! hooks for setsockopt and owners are cgroup programs that run only for the calls they want.
//! The row "syscall tracepoints (no cgroup2)" runs bufscope in a mount namespace without
//! cgroup2, where it falls back to those tracepoints: what the default cost before. The guard
//! rows show what `--guard.mode observe|enforce` adds to setsockopt and bind calls.

use std::os::fd::AsRawFd as _;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context as _, bail};

use super::Args;
use super::harness::{Bins, median};
use crate::bench::table;

/// getppid calls per `perf bench syscall basic` run.
const SYSCALL_LOOPS: &str = "2000000";
/// setsockopt calls per measurement.
const SETSOCKOPT_CALLS: u32 = 200_000;

/// UDP socket + bind + close cycles per measurement.
const BIND_CYCLES: u32 = 20_000;

/// What runs while the syscalls are timed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    None,
    Default,
    NoSockoptOwners,
    Tracepoints,
    GuardObserve,
    GuardEnforce,
    RunStats,
}

impl Variant {
    const ALL: [Self; 7] = [
        Self::None,
        Self::Default,
        Self::RunStats,
        Self::NoSockoptOwners,
        Self::Tracepoints,
        Self::GuardObserve,
        Self::GuardEnforce,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::None => "no bufscope",
            Self::Default => "bufscope (default: cgroup/setsockopt, cgroup/sock_create)",
            Self::NoSockoptOwners => "bufscope --probe.disable setsockopt,owners",
            Self::Tracepoints => "bufscope on syscall tracepoints (no cgroup2: the fallback)",
            Self::GuardObserve => "bufscope --guard.mode observe",
            Self::GuardEnforce => "bufscope --guard.mode enforce",
            Self::RunStats => "bufscope --bpf.run-stats (kernel BPF run-time stats on)",
        }
    }
}

/// UDP sockets created, bound to 127.0.0.1:0 and closed, per second (the guard's bind hook
/// raises each one's buffers under enforce).
fn bind_rate() -> anyhow::Result<f64> {
    let t = Instant::now();
    for _ in 0..BIND_CYCLES {
        drop(std::net::UdpSocket::bind("127.0.0.1:0").context("UDP bind")?);
    }
    Ok(BIND_CYCLES as f64 / t.elapsed().as_secs_f64())
}

/// `perf bench syscall basic`: ns per getppid call.
fn getppid_ns() -> anyhow::Result<f64> {
    let o = Command::new("perf")
        .args(["bench", "syscall", "basic", "--loop", SYSCALL_LOOPS])
        .output()
        .context("running perf bench syscall basic (perf is installed by cargo xtask setup)")?;
    let text = String::from_utf8_lossy(&o.stdout);
    text.lines()
        .find_map(|l| {
            let l = l.trim();
            l.strip_suffix("usecs/op")
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .map(|us| us * 1000.0)
        .with_context(|| format!("no usecs/op in perf's output: {text}"))
}

/// Buffer `setsockopt` calls per second on one UDP socket (SO_RCVBUF/SO_SNDBUF alternating).
fn setsockopt_rate() -> anyhow::Result<f64> {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").context("UDP socket")?;
    let fd = s.as_raw_fd();
    let t = Instant::now();
    for i in 0..SETSOCKOPT_CALLS {
        let opt = if i % 2 == 0 {
            libc::SO_RCVBUF
        } else {
            libc::SO_SNDBUF
        };
        let v: libc::c_int = 65536 + (i % 64) as libc::c_int * 1024;
        // SAFETY: a valid fd and a pointer to a live c_int of the size passed.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&raw const v).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            bail!("setsockopt: {}", std::io::Error::last_os_error());
        }
    }
    Ok(SETSOCKOPT_CALLS as f64 / t.elapsed().as_secs_f64())
}

/// Runs the section and returns its table.
pub(super) fn section(a: &Args, bins: &Bins) -> anyhow::Result<String> {
    let dir = std::env::temp_dir().join(format!("bufscope-bench-{}", std::process::id()));
    let mut ns: Vec<Vec<f64>> = vec![Vec::new(); Variant::ALL.len()];
    let mut rate: Vec<Vec<f64>> = vec![Vec::new(); Variant::ALL.len()];
    let mut binds: Vec<Vec<f64>> = vec![Vec::new(); Variant::ALL.len()];
    for round in 0..a.runs {
        // Rotate the order every round so no variant always runs first or last.
        for k in 0..Variant::ALL.len() {
            let i = (k + round) % Variant::ALL.len();
            let v = Variant::ALL[i];
            let exporter = match v {
                Variant::None => None,
                Variant::Default => Some(bins.exporter(&[])?),
                Variant::NoSockoptOwners => {
                    Some(bins.exporter(&["--probe.disable", "setsockopt,owners"])?)
                }
                Variant::Tracepoints => Some(bins.exporter_without_cgroup2(&dir)?),
                Variant::GuardObserve => Some(bins.exporter(&["--guard.mode", "observe"])?),
                Variant::GuardEnforce => Some(bins.exporter(&["--guard.mode", "enforce"])?),
                Variant::RunStats => Some(bins.exporter(&["--bpf.run-stats"])?),
            };
            ns[i].push(getppid_ns()?);
            rate[i].push(setsockopt_rate()?);
            binds[i].push(bind_rate()?);
            drop(exporter);
            eprintln!(
                "syscalls round {}/{}: {}: {:.1} ns/getppid, {:.0} setsockopt/s",
                round + 1,
                a.runs,
                v.label(),
                ns[i].last().copied().unwrap_or(f64::NAN),
                rate[i].last().copied().unwrap_or(f64::NAN)
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let base_ns = median(&ns[0]);
    let base_rate = median(&rate[0]);
    let base_binds = median(&binds[0]);
    let rows: Vec<Vec<String>> = Variant::ALL
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let n = median(&ns[i]);
            let r = median(&rate[i]);
            let b = median(&binds[i]);
            vec![
                v.label().to_string(),
                format!("{n:.1}"),
                format!("{:+.1}%", (n / base_ns - 1.0) * 100.0),
                format!("{:.0}", r / 1000.0),
                format!("{:.1}%", r / base_rate * 100.0),
                format!("{:.1}", b / 1000.0),
                format!("{:.1}%", b / base_binds * 100.0),
            ]
        })
        .collect();
    // --bpf.run-stats next to the same bufscope without it: what two clock reads per program
    // run add to a call that runs one (cgroup/setsockopt) and to a socket+bind+close cycle
    // (cgroup/sock_create).
    let per = |v: Variant, xs: &[Vec<f64>]| {
        Variant::ALL
            .iter()
            .position(|x| *x == v)
            .map(|i| median(&xs[i]))
            .unwrap_or(f64::NAN)
    };
    let (on, off) = (per(Variant::RunStats, &rate), per(Variant::Default, &rate));
    let (bon, boff) = (
        per(Variant::RunStats, &binds),
        per(Variant::Default, &binds),
    );
    let run_stats = format!(
        "--bpf.run-stats vs bufscope without it: setsockopt {:+.0} ns/call ({:.1}% of the \
         calls/s), UDP socket+bind+close {:+.0} ns/cycle ({:.1}%)",
        1e9 / on - 1e9 / off,
        on / off * 100.0,
        1e9 / bon - 1e9 / boff,
        bon / boff * 100.0
    );
    Ok(format!(
        "Syscall tax (median of {} alternating rounds; getppid: `perf bench syscall basic --loop {SYSCALL_LOOPS}`; \
         setsockopt: {SETSOCKOPT_CALLS} SO_RCVBUF/SO_SNDBUF calls on one UDP socket; bind: \
         {BIND_CYCLES} UDP socket+bind+close cycles):\n\n{}\n",
        a.runs,
        table(
            &[
                "attached",
                "getppid ns/call",
                "vs no bufscope",
                "setsockopt k calls/s",
                "vs no bufscope",
                "UDP bind k cycles/s",
                "vs no bufscope",
            ],
            &rows,
        ) + "\n\n"
            + &run_stats
    ))
}
