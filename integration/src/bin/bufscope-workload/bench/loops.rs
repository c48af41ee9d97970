//! Event loops that fire one probe each: setsockopt calls, TCP connects, bulk transfers.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd as _;
use std::time::Duration;

use anyhow::bail;

use crate::args::{Args, ready};
use crate::sys::setsockopt_int;

use super::*;

/// `setsockopt-loop`: `--count` buffer-size calls, alternating options and values.
pub(crate) fn setsockopt_loop(a: &Args) -> anyhow::Result<()> {
    let n: u64 = a.num("--count", 100_000)?;
    let s = udp(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))?;
    let fd = s.as_raw_fd();
    ready(&[("pid", std::process::id().to_string())]);
    for i in 0..n {
        let opt = if i % 2 == 0 {
            libc::SO_RCVBUF
        } else {
            libc::SO_SNDBUF
        };
        setsockopt_int(fd, libc::SOL_SOCKET, opt, 65536 + (i % 64) as i32 * 1024)?;
    }
    say(format!("DONE {n}"));
    Ok(())
}

/// `tcp-connect-loop`: `--count` loopback connections: connect, accept, close both.
pub(crate) fn tcp_connect_loop(a: &Args) -> anyhow::Result<()> {
    let n: u64 = a.num("--count", 2000)?;
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    ready(&[("pid", std::process::id().to_string())]);
    let acceptor = std::thread::spawn(move || {
        for _ in 0..n {
            match l.accept() {
                Ok((c, _)) => drop(c),
                Err(_) => break,
            }
        }
    });
    for _ in 0..n {
        let c = TcpStream::connect(addr)?;
        // RST instead of TIME_WAIT: thousands of connections must not exhaust ports.
        socket2::SockRef::from(&c).set_linger(Some(Duration::ZERO))?;
        drop(c);
    }
    let _ = acceptor.join();
    say(format!("DONE {n}"));
    Ok(())
}

/// `tcp-bulk-loop`: `--conns` loopback transfers of `--bytes` (autotuning grows each
/// receiver's buffer: `tcp_rcvbuf_grow` fires several times per connection).
pub(crate) fn tcp_bulk_loop(a: &Args) -> anyhow::Result<()> {
    let conns: u64 = a.num("--conns", 50)?;
    let bytes: u64 = a.num("--bytes", 8 << 20)?;
    let lock_every: u64 = a.num("--lock-every", 0)?;
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    ready(&[("pid", std::process::id().to_string())]);
    let receiver = std::thread::spawn(move || -> anyhow::Result<()> {
        let mut buf = vec![0u8; 1 << 16];
        for i in 0..conns {
            let (mut c, _) = l.accept()?;
            if lock_every > 0 && i % lock_every == 0 {
                setsockopt_int(c.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, 65536)?;
            }
            while c.read(&mut buf)? > 0 {}
        }
        Ok(())
    });
    let chunk = vec![0x17u8; 1 << 16];
    for _ in 0..conns {
        let mut c = TcpStream::connect(addr)?;
        let mut left = bytes;
        while left > 0 {
            let n = c.write(&chunk[..left.min(chunk.len() as u64) as usize])?;
            left -= n as u64;
        }
        c.shutdown(std::net::Shutdown::Write)?;
        let _ = c.read(&mut [0u8; 1]);
    }
    match receiver.join() {
        Ok(r) => r?,
        Err(_) => bail!("receiver thread panicked"),
    }
    say(format!("DONE {conns}"));
    Ok(())
}
