//! Workloads for bufscope's integration tests and benchmarks, each in its own process so that
//! attribution is tested across process boundaries (the receiver, the flooder and bufscope are
//! three different pids).
//!
//! Every command prints one `READY key=value …` line on stdout when its sockets are set up,
//! then does its work; long-lived ones wait until stdin closes (the test drops the child).

use std::io::{BufRead as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd as _;
use std::time::Duration;

use anyhow::{Context as _, bail};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

const USAGE: &str = "usage: bufscope-workload <command> [--key value …]
  udp-recv   [--v6] [--rcvbuf N] [--new-netns] [--comm NAME] [--count N]
             N receiving sockets (never read) on loopback
  udp-flood  --port P [--port P …] [--v6] [--count N] [--size B] [--netns-of PID]
             send N datagrams to each port, then exit
  tcp-listen [--rcvbuf N]     listener (SO_RCVBUF before listen() when given); accepts and holds
  tcp-connect --port P [--rcvbuf N] [--count K]   K clients (SO_RCVBUF before connect() when given)
  tcp-bulk-recv [--rcvbuf-after N] [--bytes B]   accept one connection and read B bytes
  tcp-bulk-send --port P [--bytes B]
  setsockopt --proto udp|tcp --opt NAME --value V   one call; prints ret/errno and readbacks
  hold-comm  --comm BYTES     set comm (\\xNN escapes allowed), open a UDP socket with SO_RCVBUF, hold";

struct Args(Vec<String>);

impl Args {
    fn flag(&self, name: &str) -> bool {
        self.0.iter().any(|a| a == name)
    }
    fn value(&self, name: &str) -> Option<&str> {
        let i = self.0.iter().position(|a| a == name)?;
        self.0.get(i + 1).map(String::as_str)
    }
    fn values(&self, name: &str) -> Vec<&str> {
        self.0
            .windows(2)
            .filter(|w| w[0] == name)
            .map(|w| w[1].as_str())
            .collect()
    }
    fn num<T: std::str::FromStr>(&self, name: &str, default: T) -> anyhow::Result<T> {
        match self.value(name) {
            Some(v) => v
                .parse()
                .map_err(|_| anyhow::anyhow!("bad value for {name}: {v}")),
            None => Ok(default),
        }
    }
}

fn ready(fields: &[(&str, String)]) {
    let line: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("READY {}", line.join(" "));
    let _ = std::io::stdout().flush();
}

/// Blocks until stdin is closed (the parent test dropped us) or says "exit".
fn hold() {
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        match line {
            Ok(l) if l.trim() == "exit" => return,
            Ok(_) => {}
            Err(_) => return,
        }
    }
}

fn inode_of(fd: i32) -> anyhow::Result<u64> {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}"))?;
    let s = link.to_string_lossy();
    s.strip_prefix("socket:[")
        .and_then(|x| x.strip_suffix(']'))
        .and_then(|x| x.parse().ok())
        .with_context(|| format!("fd {fd} is not a socket: {s}"))
}

fn setsockopt_int(fd: i32, level: i32, name: i32, v: i32) -> std::io::Result<()> {
    // SAFETY: fd is a valid socket; optval points to a live c_int of the stated size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &v as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn getsockopt_int(fd: i32, level: i32, name: i32) -> std::io::Result<i32> {
    let mut v: i32 = 0;
    let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
    // SAFETY: fd is a valid socket; v/len are live and sized.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            &mut v as *mut i32 as *mut libc::c_void,
            &mut len,
        )
    };
    if rc == 0 {
        Ok(v)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

const SO_BUF_LOCK: i32 = 72;

fn set_comm(bytes: &[u8]) -> anyhow::Result<()> {
    let mut name = [0u8; 16];
    let n = bytes.len().min(15);
    name[..n].copy_from_slice(&bytes[..n]);
    // SAFETY: PR_SET_NAME reads up to 16 bytes from a valid NUL-terminated buffer.
    let rc = unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        bail!("prctl(PR_SET_NAME): {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Decodes `\xNN`, `\n`, `\\` escapes into raw bytes.
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 1 < b.len() {
            match b[i + 1] {
                b'n' => {
                    out.push(b'\n');
                    i += 2;
                    continue;
                }
                b'\\' => {
                    out.push(b'\\');
                    i += 2;
                    continue;
                }
                b'x' if i + 3 < b.len() => {
                    if let (Some(h), Some(l)) = (hex(b[i + 2]), hex(b[i + 3])) {
                        out.push(h << 4 | l);
                        i += 4;
                        continue;
                    }
                }
                _ => {}
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

fn enter_netns_of(pid: u32) -> anyhow::Result<()> {
    let f = std::fs::File::open(format!("/proc/{pid}/ns/net"))
        .with_context(|| format!("opening /proc/{pid}/ns/net"))?;
    // SAFETY: f is an open netns fd.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("setns: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

fn new_netns() -> anyhow::Result<()> {
    // SAFETY: unshare has no memory-safety preconditions.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        bail!("unshare(CLONE_NEWNET): {}", std::io::Error::last_os_error());
    }
    let st = std::process::Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .status()
        .context("running ip link set lo up")?;
    if !st.success() {
        bail!("ip link set lo up failed");
    }
    Ok(())
}

fn loopback(v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::LOCALHOST)
    } else {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    }
}

fn udp_socket(v6: bool) -> anyhow::Result<Socket> {
    let domain = if v6 { Domain::IPV6 } else { Domain::IPV4 };
    Ok(Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?)
}

fn udp_recv(a: &Args) -> anyhow::Result<()> {
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
    hold();
    Ok(())
}

fn udp_flood(a: &Args) -> anyhow::Result<()> {
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

fn tcp_socket() -> anyhow::Result<Socket> {
    Ok(Socket::new(
        Domain::IPV4,
        Type::STREAM,
        Some(Protocol::TCP),
    )?)
}

fn locks_of(fd: i32) -> String {
    getsockopt_int(fd, libc::SOL_SOCKET, SO_BUF_LOCK)
        .map(|v| v.to_string())
        .unwrap_or_else(|_| "?".into())
}

fn tcp_listen(a: &Args) -> anyhow::Result<()> {
    let l = tcp_socket()?;
    l.set_reuse_address(true)?;
    if let Some(rb) = a.value("--rcvbuf") {
        l.set_recv_buffer_size(rb.parse()?)?;
    }
    l.bind(&SockAddr::from(SocketAddr::new(loopback(false), 0)))?;
    l.listen(128)?;
    let port = l.local_addr()?.as_socket().map(|x| x.port()).unwrap_or(0);
    ready(&[
        ("pid", std::process::id().to_string()),
        ("port", port.to_string()),
        ("locks", locks_of(l.as_raw_fd())),
    ]);
    let mut held = Vec::new();
    std::thread::spawn(move || {
        loop {
            match l.accept() {
                Ok((c, _)) => {
                    println!("ACCEPTED locks={}", locks_of(c.as_raw_fd()));
                    let _ = std::io::stdout().flush();
                    held.push(c);
                }
                Err(_) => break,
            }
        }
    });
    hold();
    Ok(())
}

fn tcp_connect(a: &Args) -> anyhow::Result<()> {
    let port: u16 = a.num("--port", 0)?;
    let count: usize = a.num("--count", 1)?;
    let mut socks = Vec::new();
    let mut locks = Vec::new();
    let mut lports = Vec::new();
    for _ in 0..count {
        let c = tcp_socket()?;
        if let Some(rb) = a.value("--rcvbuf") {
            c.set_recv_buffer_size(rb.parse()?)?;
        }
        c.connect(&SockAddr::from(SocketAddr::new(loopback(false), port)))?;
        locks.push(locks_of(c.as_raw_fd()));
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

fn tcp_bulk_recv(a: &Args) -> anyhow::Result<()> {
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

fn tcp_bulk_send(a: &Args) -> anyhow::Result<()> {
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

fn one_setsockopt(a: &Args) -> anyhow::Result<()> {
    let s = match a.value("--proto").unwrap_or("udp") {
        "tcp" => tcp_socket()?,
        _ => udp_socket(false)?,
    };
    let opt = match a.value("--opt").unwrap_or("SO_RCVBUF") {
        "SO_RCVBUF" => libc::SO_RCVBUF,
        "SO_SNDBUF" => libc::SO_SNDBUF,
        "SO_RCVBUFFORCE" => libc::SO_RCVBUFFORCE,
        "SO_SNDBUFFORCE" => libc::SO_SNDBUFFORCE,
        "SO_BUF_LOCK" => SO_BUF_LOCK,
        o => bail!("unknown option {o}"),
    };
    let value: i32 = a.num("--value", 0)?;
    let fd = s.as_raw_fd();
    let res = setsockopt_int(fd, libc::SOL_SOCKET, opt, value);
    let errno = res
        .as_ref()
        .err()
        .and_then(|e| e.raw_os_error())
        .unwrap_or(0);
    ready(&[
        ("pid", std::process::id().to_string()),
        ("inode", inode_of(fd)?.to_string()),
        ("errno", errno.to_string()),
        (
            "rcvbuf",
            getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF)?.to_string(),
        ),
        (
            "sndbuf",
            getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF)?.to_string(),
        ),
        ("locks", locks_of(fd)),
    ]);
    hold();
    Ok(())
}

fn hold_comm(a: &Args) -> anyhow::Result<()> {
    let comm = unescape(a.value("--comm").unwrap_or("bufscope-test"));
    set_comm(&comm)?;
    let s = udp_socket(false)?;
    s.set_recv_buffer_size(65536)?;
    ready(&[("pid", std::process::id().to_string())]);
    hold();
    drop(s);
    Ok(())
}

fn main() {
    let mut argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.is_empty() {
        eprintln!("{USAGE}");
        std::process::exit(2);
    }
    let cmd = argv.remove(0);
    let a = Args(argv);
    let r = match cmd.as_str() {
        "udp-recv" => udp_recv(&a),
        "udp-flood" => udp_flood(&a),
        "tcp-listen" => tcp_listen(&a),
        "tcp-connect" => tcp_connect(&a),
        "tcp-bulk-recv" => tcp_bulk_recv(&a),
        "tcp-bulk-send" => tcp_bulk_send(&a),
        "setsockopt" => one_setsockopt(&a),
        "hold-comm" => hold_comm(&a),
        _ => {
            eprintln!("unknown command {cmd}\n{USAGE}");
            std::process::exit(2);
        }
    };
    if let Err(e) = r {
        eprintln!("bufscope-workload {cmd}: {e:#}");
        std::process::exit(1);
    }
}
