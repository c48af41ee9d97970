//! Workloads of `cargo xtask bench overhead` and of the reliability tests: data-path load
//! (UDP/TCP blasts and sinks), event loops that fire each probe, and process populations
//! (many long-lived holders of sockets, churn of short-lived ones).

mod churn;
mod datapath;
mod loops;
mod procs;

use std::io::{BufRead as _, Write as _};
use std::net::SocketAddr;

use anyhow::{Context as _, bail};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::args::Args;

pub(crate) use churn::*;
pub(crate) use datapath::*;
pub(crate) use loops::*;
pub(crate) use procs::*;

pub(super) fn dest(a: &Args) -> anyhow::Result<SocketAddr> {
    a.value("--dest")
        .context("--dest IP:PORT is required")?
        .parse()
        .context("--dest must be IP:PORT")
}

pub(super) fn bind_ip(a: &Args) -> anyhow::Result<std::net::IpAddr> {
    a.value("--bind")
        .unwrap_or("127.0.0.1")
        .parse()
        .context("--bind must be an IP address")
}

pub(super) fn udp(ip: std::net::IpAddr) -> anyhow::Result<Socket> {
    Ok(Socket::new(
        Domain::for_address(SocketAddr::new(ip, 0)),
        Type::DGRAM,
        Some(Protocol::UDP),
    )?)
}

pub(super) fn port_of(s: &Socket) -> u16 {
    s.local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .map_or(0, |a| a.port())
}

pub(super) fn say(line: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Reads stdin lines; `on_line` gets each trimmed line until EOF or `exit`.
pub(super) fn serve_stdin(mut on_line: impl FnMut(&str)) {
    for line in std::io::stdin().lock().lines() {
        match line {
            Ok(l) if l.trim() == "exit" => return,
            Ok(l) => on_line(l.trim()),
            Err(_) => return,
        }
    }
}

/// Binds `s` to the wildcard address of `to`'s family, port 0.
pub(super) fn bind_any(s: &Socket, to: &SocketAddr) -> anyhow::Result<()> {
    let any = if to.is_ipv4() {
        std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
    } else {
        std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
    };
    s.bind(&SockAddr::from(SocketAddr::new(any, 0)))?;
    Ok(())
}

pub(super) fn read_ports(path: &str) -> anyhow::Result<Vec<u16>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    text.split_whitespace()
        .map(|p| {
            p.parse()
                .with_context(|| format!("bad port {p:?} in {path}"))
        })
        .collect()
}

/// Forks; the child runs `f` and exits with its status (never returns).
pub(super) fn fork_child(f: impl FnOnce() -> i32) -> anyhow::Result<libc::pid_t> {
    // SAFETY: the workload is single-threaded when it forks (no threads are started
    // before these commands fork); the child only makes syscalls and exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        bail!("fork: {}", std::io::Error::last_os_error());
    }
    if pid == 0 {
        let code = f();
        // SAFETY: _exit skips atexit handlers and stdio flushing inherited from the parent.
        unsafe { libc::_exit(code) };
    }
    Ok(pid)
}
