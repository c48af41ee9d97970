//! TCP: listeners and connectors with or without a locked receive buffer, bulk transfers, and
//! where the lock bits are read from.

use std::io::Write as _;
use std::net::SocketAddr;
use std::os::fd::AsRawFd as _;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::args::*;
use crate::sys::*;

pub(crate) fn tcp_socket() -> anyhow::Result<Socket> {
    Ok(Socket::new(
        Domain::IPV4,
        Type::STREAM,
        Some(Protocol::TCP),
    )?)
}

/// The socket's lock bits (`sk_userlocks`: 1 = SOCK_SNDBUF_LOCK, 2 = SOCK_RCVBUF_LOCK) as
/// `getsockopt(SO_BUF_LOCK)` reads them. Kernels before 5.14 have no `SO_BUF_LOCK`
/// (ENOPROTOOPT): there the bits are `set`, what this process's own successful `setsockopt`
/// calls set by sock.c's rule (a successful SO_RCVBUF/SO_RCVBUFFORCE sets SOCK_RCVBUF_LOCK,
/// SO_SNDBUF/SO_SNDBUFFORCE SOCK_SNDBUF_LOCK; an accepted socket inherits its listener's).
pub(crate) fn locks_of(fd: i32, set: i32) -> String {
    match getsockopt_int(fd, libc::SOL_SOCKET, SO_BUF_LOCK) {
        Ok(v) => v.to_string(),
        Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => set.to_string(),
        Err(_) => "?".into(),
    }
}

/// Where `locks` came from, printed next to it: the readback, or the errno rule before 5.14.
pub(crate) fn locks_source(fd: i32) -> &'static str {
    match getsockopt_int(fd, libc::SOL_SOCKET, SO_BUF_LOCK) {
        Ok(_) => "SO_BUF_LOCK",
        Err(_) => "errno",
    }
}

pub(crate) fn tcp_listen(a: &Args) -> anyhow::Result<()> {
    let l = tcp_socket()?;
    l.set_reuse_address(true)?;
    let mut set = 0;
    if let Some(rb) = a.value("--rcvbuf") {
        l.set_recv_buffer_size(rb.parse()?)?;
        set = 2;
    }
    l.bind(&SockAddr::from(SocketAddr::new(loopback(false), 0)))?;
    l.listen(128)?;
    let port = l.local_addr()?.as_socket().map(|x| x.port()).unwrap_or(0);
    ready(&[
        ("pid", std::process::id().to_string()),
        ("port", port.to_string()),
        ("locks", locks_of(l.as_raw_fd(), set)),
        ("locks_source", locks_source(l.as_raw_fd()).to_string()),
    ]);
    let mut held = Vec::new();
    std::thread::spawn(move || {
        while let Ok((c, _)) = l.accept() {
            println!("ACCEPTED locks={}", locks_of(c.as_raw_fd(), set));
            let _ = std::io::stdout().flush();
            held.push(c);
        }
    });
    hold();
    Ok(())
}

pub(crate) fn tcp_connect(a: &Args) -> anyhow::Result<()> {
    let port: u16 = a.num("--port", 0)?;
    let count: usize = a.num("--count", 1)?;
    let mut socks = Vec::new();
    let mut locks = Vec::new();
    let mut lports = Vec::new();
    for _ in 0..count {
        let c = tcp_socket()?;
        let mut set = 0;
        if let Some(rb) = a.value("--rcvbuf") {
            c.set_recv_buffer_size(rb.parse()?)?;
            set = 2;
        }
        c.connect(&SockAddr::from(SocketAddr::new(loopback(false), port)))?;
        locks.push(locks_of(c.as_raw_fd(), set));
        lports.push(
            c.local_addr()?
                .as_socket()
                .map(|x| x.port())
                .unwrap_or(0)
                .to_string(),
        );
        socks.push(c);
    }
    ready(&[
        ("pid", std::process::id().to_string()),
        ("lports", lports.join(",")),
        ("locks", locks.join(",")),
    ]);
    hold();
    Ok(())
}

pub(crate) fn tcp_bulk_recv(a: &Args) -> anyhow::Result<()> {
    let l = tcp_socket()?;
    l.bind(&SockAddr::from(SocketAddr::new(loopback(false), 0)))?;
    l.listen(1)?;
    let port = l.local_addr()?.as_socket().map(|x| x.port()).unwrap_or(0);
    ready(&[
        ("pid", std::process::id().to_string()),
        ("port", port.to_string()),
    ]);
    let (c, _) = l.accept()?;
    if let Some(rb) = a.value("--rcvbuf-after") {
        c.set_recv_buffer_size(rb.parse()?)?;
    }
    let want: u64 = a.num("--bytes", 200 << 20)?;
    let mut got = 0u64;
    let mut buf = vec![std::mem::MaybeUninit::<u8>::uninit(); 1 << 16];
    while got < want {
        let n = c.recv(&mut buf)?;
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    println!("RECEIVED {got} rcvbuf={}", c.recv_buffer_size()?);
    Ok(())
}

pub(crate) fn tcp_bulk_send(a: &Args) -> anyhow::Result<()> {
    let port: u16 = a.num("--port", 0)?;
    let bytes: u64 = a.num("--bytes", 200 << 20)?;
    let c = tcp_socket()?;
    c.connect(&SockAddr::from(SocketAddr::new(loopback(false), port)))?;
    ready(&[("pid", std::process::id().to_string())]);
    let buf = vec![0x42u8; 1 << 16];
    let mut sent = 0u64;
    while sent < bytes {
        let n = c.send(&buf[..(bytes - sent).min(buf.len() as u64) as usize])?;
        sent += n as u64;
    }
    c.shutdown(std::net::Shutdown::Write)?;
    println!("SENT {sent}");
    Ok(())
}
