//! Data-path load: UDP and TCP blasts and sinks, fresh and sprayed UDP sockets.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use socket2::SockAddr;

use crate::args::{Args, ready};
use crate::sys::{inode_of, setsockopt_int};

use super::*;

/// `udp-sink`: reads datagrams with `recvmmsg` (64 per call) on a thread; `count` on stdin
/// prints how many arrived so far.
pub(crate) fn udp_sink(a: &Args) -> anyhow::Result<()> {
    let ip = bind_ip(a)?;
    let s = udp(ip)?;
    if let Some(rb) = a.value("--rcvbuf") {
        s.set_recv_buffer_size(rb.parse()?)?;
    }
    if let Some(rb) = a.value("--rcvbuf-force") {
        // Root only; not clamped to net.core.rmem_max (which stays untouched).
        setsockopt_int(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            rb.parse()?,
        )?;
    }
    s.bind(&SockAddr::from(SocketAddr::new(ip, 0)))?;
    s.set_read_timeout(Some(Duration::from_millis(100)))?;
    let read = !a.flag("--no-read");
    let count = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let fd = s.as_raw_fd();
    ready(&[
        ("pid", std::process::id().to_string()),
        ("port", port_of(&s).to_string()),
        ("inode", inode_of(fd)?.to_string()),
    ]);
    let reader = read.then(|| {
        let (count, stop) = (count.clone(), stop.clone());
        std::thread::spawn(move || {
            const N: usize = 64;
            let mut bufs = vec![[0u8; 2048]; N];
            while !stop.load(Ordering::Relaxed) {
                let mut iov: Vec<libc::iovec> = bufs
                    .iter_mut()
                    .map(|b| libc::iovec {
                        iov_base: b.as_mut_ptr().cast(),
                        iov_len: b.len(),
                    })
                    .collect();
                // SAFETY: zeroed mmsghdr is valid; each points at one live iovec.
                let mut msgs: Vec<libc::mmsghdr> =
                    (0..N).map(|_| unsafe { std::mem::zeroed() }).collect();
                for (m, v) in msgs.iter_mut().zip(iov.iter_mut()) {
                    m.msg_hdr.msg_iov = v;
                    m.msg_hdr.msg_iovlen = 1;
                }
                // SAFETY: fd is the socket owned by `s` (alive until after join); msgs and
                // their buffers are live for the call.
                let n = unsafe {
                    libc::recvmmsg(
                        fd,
                        msgs.as_mut_ptr(),
                        N as u32,
                        libc::MSG_WAITFORONE,
                        std::ptr::null_mut(),
                    )
                };
                if n > 0 {
                    count.fetch_add(n as u64, Ordering::Relaxed);
                }
            }
        })
    });
    serve_stdin(|l| {
        if l == "count" {
            say(format!("COUNT {}", count.load(Ordering::Relaxed)));
        }
    });
    stop.store(true, Ordering::Relaxed);
    if let Some(r) = reader {
        let _ = r.join();
    }
    drop(s);
    Ok(())
}

/// `udp-blast`: one `sendto` per datagram (or, with `--mmsg N`, `sendmmsg` of N datagrams
/// each addressed, as wireguard-go sends), as fast as possible, for `--seconds`, on one
/// unconnected socket.
pub(crate) fn udp_blast(a: &Args) -> anyhow::Result<()> {
    let to = dest(a)?;
    let secs: f64 = a.num("--seconds", 2.0)?;
    let size: usize = a.num("--size", 64)?;
    let mmsg: usize = a.num("--mmsg", 0)?;
    let s = udp(to.ip())?;
    if a.flag("--bind-any") {
        // As a tunnel's or a DNS forwarder's socket: bound before it sends.
        bind_any(&s, &to)?;
    }
    let to = SockAddr::from(to);
    let mut buf = vec![0x5au8; size];
    ready(&[("pid", std::process::id().to_string())]);
    let start = Instant::now();
    let limit = Duration::from_secs_f64(secs);
    let (mut sent, mut errors) = (0u64, 0u64);
    if mmsg > 0 {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: zeroed msghdrs are valid; every pointer below outlives the calls.
        let mut msgs: Vec<libc::mmsghdr> = (0..mmsg)
            .map(|_| {
                let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                m.msg_hdr.msg_name = to.as_ptr() as *mut libc::c_void;
                m.msg_hdr.msg_namelen = to.len();
                m.msg_hdr.msg_iov = &raw mut iov;
                m.msg_hdr.msg_iovlen = 1;
                m
            })
            .collect();
        while start.elapsed() < limit {
            for _ in 0..16 {
                // SAFETY: valid fd and message vector.
                let n = unsafe { libc::sendmmsg(s.as_raw_fd(), msgs.as_mut_ptr(), mmsg as u32, 0) };
                if n > 0 {
                    sent += n as u64;
                } else {
                    errors += 1;
                }
            }
        }
        say(format!(
            "SENT {sent} {errors} {:.6}",
            start.elapsed().as_secs_f64()
        ));
        return Ok(());
    }
    'outer: loop {
        for _ in 0..256 {
            match s.send_to(&buf, &to) {
                Ok(_) => sent += 1,
                Err(_) => errors += 1,
            }
        }
        if start.elapsed() >= limit {
            break 'outer;
        }
    }
    say(format!(
        "SENT {sent} {errors} {:.6}",
        start.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// `udp-fresh`: `--count` times a new unconnected UDP socket that sends one datagram and
/// closes (every send is its socket's first; with `--bind-any` it binds first, so its
/// bind is its first call).
pub(crate) fn udp_fresh(a: &Args) -> anyhow::Result<()> {
    let to = dest(a)?;
    let count: u64 = a.num("--count", 10_000)?;
    let buf = [0x5au8; 64];
    let addr = SockAddr::from(to);
    ready(&[("pid", std::process::id().to_string())]);
    let start = Instant::now();
    let bind = a.flag("--bind-any");
    for _ in 0..count {
        let s = udp(to.ip())?;
        if bind {
            bind_any(&s, &to)?;
        }
        let _ = s.send_to(&buf, &addr);
    }
    say(format!("DONE {count} {:.6}", start.elapsed().as_secs_f64()));
    Ok(())
}

/// `udp-spray`: paced round-robin over many loopback ports.
pub(crate) fn udp_spray(a: &Args) -> anyhow::Result<()> {
    let ports = read_ports(
        a.value("--ports-file")
            .context("--ports-file is required")?,
    )?;
    if ports.is_empty() {
        bail!("no ports to spray");
    }
    let pps: f64 = a.num("--pps", 10_000.0)?;
    let secs: f64 = a.num("--seconds", 10.0)?;
    let size: usize = a.num("--size", 200)?;
    let lo = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    let s = udp(lo)?;
    let dests: Vec<SockAddr> = ports
        .iter()
        .map(|p| SockAddr::from(SocketAddr::new(lo, *p)))
        .collect();
    let buf = vec![0x33u8; size];
    ready(&[("pid", std::process::id().to_string())]);
    let start = Instant::now();
    let mut sent = 0u64;
    let mut i = 0usize;
    while start.elapsed().as_secs_f64() < secs {
        // Pace in 1 ms slices.
        let due = (start.elapsed().as_secs_f64() * pps) as u64;
        while sent < due {
            let _ = s.send_to(&buf, &dests[i % dests.len()]);
            i += 1;
            sent += 1;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    say(format!("SENT {sent}"));
    Ok(())
}

/// `tcp-sink`: accepts connections one after the other, reads each to EOF.
pub(crate) fn tcp_sink(a: &Args) -> anyhow::Result<()> {
    let l = TcpListener::bind(SocketAddr::new(bind_ip(a)?, 0))?;
    ready(&[
        ("pid", std::process::id().to_string()),
        ("port", l.local_addr()?.port().to_string()),
    ]);
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 18];
        for c in l.incoming() {
            let Ok(mut c) = c else { break };
            let start = Instant::now();
            let mut got = 0u64;
            while let Ok(n) = c.read(&mut buf) {
                if n == 0 {
                    break;
                }
                got += n as u64;
            }
            say(format!(
                "RECEIVED {got} {:.6}",
                start.elapsed().as_secs_f64()
            ));
        }
    });
    serve_stdin(|_| {});
    Ok(())
}

/// `tcp-blast`: one connection, `write` of 64 KiB chunks for `--seconds`.
pub(crate) fn tcp_blast(a: &Args) -> anyhow::Result<()> {
    let to = dest(a)?;
    let secs: f64 = a.num("--seconds", 2.0)?;
    let mut c = TcpStream::connect(to).with_context(|| format!("connecting to {to}"))?;
    ready(&[("pid", std::process::id().to_string())]);
    let buf = vec![0x42u8; 1 << 16];
    let start = Instant::now();
    let limit = Duration::from_secs_f64(secs);
    let mut sent = 0u64;
    while start.elapsed() < limit {
        sent += c.write(&buf)? as u64;
    }
    c.shutdown(std::net::Shutdown::Write)?;
    // Wait for the sink to finish reading (it closes at EOF).
    let _ = c.read(&mut [0u8; 1]);
    say(format!("SENT {sent}"));
    Ok(())
}
