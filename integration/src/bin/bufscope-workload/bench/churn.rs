//! Owner churn: a `socket()`/`close()` loop (every new inet socket costs the owners probe an
//! `OWNERS` insert, which evicts older owners from the LRU) and many TCP connections opened
//! over a long-RTT link while it runs (their ESTABLISHED events need owners the loop evicted),
//! with a listener that accepts and holds them.

use std::net::SocketAddr;
use std::os::fd::AsRawFd as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::args::{Args, hold, ready};

use super::*;

/// `socket-churn [--proto tcp|udp]`: `socket()` + `close()` as fast as possible until stdin
/// closes or says `exit`; stdin `count` prints `COUNT <sockets> <secs>` (since the start).
pub(crate) fn socket_churn(a: &Args) -> anyhow::Result<()> {
    let ty = match a.value("--proto").unwrap_or("tcp") {
        "tcp" => (Type::STREAM, Protocol::TCP),
        "udp" => (Type::DGRAM, Protocol::UDP),
        p => bail!("--proto must be tcp or udp, not {p:?}"),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let made = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    ready(&[("pid", std::process::id().to_string())]);
    {
        let (stop, made) = (stop.clone(), made.clone());
        std::thread::spawn(move || {
            serve_stdin(|line| {
                if line == "count" {
                    say(format!(
                        "COUNT {} {:.3}",
                        made.load(Ordering::Relaxed),
                        started.elapsed().as_secs_f64()
                    ));
                }
            });
            stop.store(true, Ordering::Relaxed);
        });
    }
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..256 {
            drop(Socket::new(Domain::IPV4, ty.0, Some(ty.1))?);
        }
        made.fetch_add(256, Ordering::Relaxed);
    }
    say(format!(
        "DONE {} {:.3}",
        made.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// `tcp-accept-hold --bind IP [--port P]`: a listener (backlog 4096) that accepts every
/// connection and holds it, quietly, until stdin closes.
pub(crate) fn tcp_accept_hold(a: &Args) -> anyhow::Result<()> {
    let ip = bind_ip(a)?;
    let port: u16 = a.num("--port", 0)?;
    let l = Socket::new(
        Domain::for_address(SocketAddr::new(ip, 0)),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    l.set_reuse_address(true)?;
    l.bind(&SockAddr::from(SocketAddr::new(ip, port)))?;
    l.listen(4096)?;
    ready(&[
        ("pid", std::process::id().to_string()),
        ("port", port_of(&l).to_string()),
    ]);
    std::thread::spawn(move || {
        let mut held = Vec::new();
        while let Ok((c, _)) = l.accept() {
            held.push(c);
        }
    });
    hold();
    Ok(())
}

/// `tcp-open --dest IP:PORT --count N [--rate R]`: opens N connections (non-blocking
/// `connect()`, started at about R per second, all in flight at once over a long RTT), prints
/// `OPENED ok=<n> failed=<n> secs=<s> p50_ms=<ms> p99_ms=<ms>` (each connection's time from
/// `connect()` to writable), then holds them until stdin closes.
pub(crate) fn tcp_open(a: &Args) -> anyhow::Result<()> {
    let to = dest(a)?;
    let n: usize = a.num("--count", 1000)?;
    let rate: f64 = a.num("--rate", 200.0)?;
    if rate.is_nan() || rate <= 0.0 {
        bail!("--rate must be above 0");
    }
    ready(&[("pid", std::process::id().to_string())]);
    let started = Instant::now();
    let mut open: Vec<Socket> = Vec::with_capacity(n);
    let mut pending: Vec<(Socket, Instant)> = Vec::new();
    let mut took: Vec<f64> = Vec::with_capacity(n);
    let mut failed = 0usize;
    let mut begun = 0usize;
    let deadline = started + Duration::from_secs_f64(n as f64 / rate) + Duration::from_secs(60);
    while (begun < n || !pending.is_empty()) && Instant::now() < deadline {
        // Start every connection that is due.
        let due = ((started.elapsed().as_secs_f64() * rate) as usize + 1).min(n);
        while begun < due {
            let s = Socket::new(Domain::for_address(to), Type::STREAM, Some(Protocol::TCP))?;
            s.set_nonblocking(true)?;
            match s.connect(&SockAddr::from(to)) {
                Ok(()) => {
                    took.push(0.0);
                    open.push(s);
                }
                Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {
                    pending.push((s, Instant::now()))
                }
                Err(_) => failed += 1,
            }
            begun += 1;
        }
        if pending.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let mut fds: Vec<libc::pollfd> = pending
            .iter()
            .map(|(s, _)| libc::pollfd {
                fd: s.as_raw_fd(),
                events: libc::POLLOUT,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd for the call's duration.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 5) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e).context("poll");
            }
            continue;
        }
        let mut still = Vec::with_capacity(pending.len());
        for ((s, t), p) in pending.into_iter().zip(&fds) {
            if p.revents == 0 {
                still.push((s, t));
            } else if matches!(s.take_error(), Ok(None)) {
                took.push(t.elapsed().as_secs_f64() * 1000.0);
                open.push(s);
            } else {
                failed += 1;
            }
        }
        pending = still;
    }
    failed += pending.len();
    took.sort_by(f64::total_cmp);
    let q = |p: f64| {
        if took.is_empty() {
            f64::NAN
        } else {
            took[((took.len() - 1) as f64 * p).round() as usize]
        }
    };
    say(format!(
        "OPENED ok={} failed={failed} secs={:.3} p50_ms={:.1} p99_ms={:.1}",
        open.len(),
        started.elapsed().as_secs_f64(),
        q(0.5),
        q(0.99)
    ));
    hold();
    // RST instead of TIME_WAIT: a bench opens thousands in a row from the same namespace.
    for s in &open {
        let _ = s.set_linger(Some(Duration::ZERO));
    }
    drop(open);
    Ok(())
}
