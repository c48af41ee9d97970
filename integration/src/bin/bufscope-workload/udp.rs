//! UDP: a receiver with a small buffer and a flooder (across network namespaces, IPv4/IPv6).

use std::io::BufRead as _;
use std::net::SocketAddr;
use std::os::fd::AsRawFd as _;
use std::time::Duration;

use anyhow::bail;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::args::*;
use crate::sys::*;

pub(crate) fn udp_socket(v6: bool) -> anyhow::Result<Socket> {
    let domain = if v6 { Domain::IPV6 } else { Domain::IPV4 };
    Ok(Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?)
}

pub(crate) fn udp_recv(a: &Args) -> anyhow::Result<()> {
    if a.flag("--new-netns") {
        new_netns()?;
    }
    if let Some(c) = a.value("--comm") {
        set_comm(&unescape(c))?;
    }
    let v6 = a.flag("--v6");
    let count: usize = a.num("--count", 1)?;
    let mut socks = Vec::new();
    let mut ports = Vec::new();
    let mut inodes = Vec::new();
    for _ in 0..count {
        let s = udp_socket(v6)?;
        if let Some(rb) = a.value("--rcvbuf") {
            s.set_recv_buffer_size(rb.parse()?)?;
        }
        s.bind(&SockAddr::from(SocketAddr::new(loopback(v6), 0)))?;
        let port = s.local_addr()?.as_socket().map(|x| x.port()).unwrap_or(0);
        ports.push(port.to_string());
        inodes.push(inode_of(s.as_raw_fd())?.to_string());
        socks.push(s);
    }
    ready(&[
        ("pid", std::process::id().to_string()),
        ("ports", ports.join(",")),
        ("inodes", inodes.join(",")),
    ]);
    // `close` on stdin closes the sockets and keeps the process (a daemon that closed a
    // socket); `exit` (or EOF) ends it.
    for line in std::io::stdin().lock().lines() {
        match line?.trim() {
            "exit" => break,
            "close" => {
                socks.clear();
                println!("closed");
            }
            _ => {}
        }
    }
    Ok(())
}

pub(crate) fn udp_flood(a: &Args) -> anyhow::Result<()> {
    if let Some(pid) = a.value("--netns-of") {
        enter_netns_of(pid.parse()?)?;
    }
    let v6 = a.flag("--v6");
    let count: usize = a.num("--count", 5000)?;
    let size: usize = a.num("--size", 1000)?;
    let ports: Vec<u16> = a
        .values("--port")
        .iter()
        .flat_map(|p| p.split(','))
        .map(|p| p.parse())
        .collect::<Result<_, _>>()?;
    if ports.is_empty() {
        bail!("udp-flood needs --port");
    }
    let s = udp_socket(v6)?;
    let buf = vec![0x5au8; size];
    let dests: Vec<SockAddr> = ports
        .iter()
        .map(|p| SockAddr::from(SocketAddr::new(loopback(v6), *p)))
        .collect();
    ready(&[("pid", std::process::id().to_string())]);
    let mut sent = 0u64;
    for _ in 0..count {
        for d in &dests {
            // Loopback never blocks for long; retry on ENOBUFS to keep the count exact.
            loop {
                match s.send_to(&buf, d) {
                    Ok(_) => break,
                    Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                        std::thread::sleep(Duration::from_micros(50))
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            sent += 1;
        }
    }
    println!("SENT {sent}");
    Ok(())
}
