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
  udp-recv   [--v6] [--rcvbuf N] [--new-netns] [--comm NAME] [--count N]   (stdin: close | exit)
             N receiving sockets (never read) on loopback
  udp-flood  --port P [--port P …] [--v6] [--count N] [--size B] [--netns-of PID]
             send N datagrams to each port, then exit
  tcp-listen [--rcvbuf N]     listener (SO_RCVBUF before listen() when given); accepts and holds
  tcp-connect --port P [--rcvbuf N] [--count K]   K clients (SO_RCVBUF before connect() when given)
  tcp-bulk-recv [--rcvbuf-after N] [--bytes B]   accept one connection and read B bytes
  tcp-bulk-send --port P [--bytes B]
  setsockopt --proto udp|tcp --opt NAME --value V   one call; prints ret/errno and readbacks
  hold-comm  --comm BYTES     set comm (\\xNN escapes allowed), open a UDP socket with SO_RCVBUF, hold

Benchmark and reliability workloads:
  udp-sink   [--bind IP] [--rcvbuf N | --rcvbuf-force N] [--no-read]   one UDP socket read with
             recvmmsg (unless --no-read); stdin \"count\" prints COUNT <datagrams>
  udp-blast  --dest IP:PORT --seconds S [--size B] [--mmsg N] [--bind-any]   sendto() (or sendmmsg() of N
             addressed datagrams) as fast as possible for S seconds on one unconnected socket;
             prints SENT <datagrams> <errors> <secs>
  udp-fresh  --dest IP:PORT [--count N] [--bind-any]   N times: a new UDP socket sends one datagram, closes;
             prints DONE <n> <secs>
  udp-spray  --ports-file F --pps R --seconds S [--size B]   round-robin over every port in F
             (loopback) at about R datagrams/s; prints SENT <n>
  tcp-sink   [--bind IP]   accepts connections one after the other and reads each to EOF;
             prints RECEIVED <bytes> <secs> per connection
  tcp-blast  --dest IP:PORT --seconds S   one connection, writes for S seconds; prints SENT <bytes>
  setsockopt-loop --count N   N buffer setsockopt calls (SO_RCVBUF/SO_SNDBUF alternating) on a
             UDP socket; prints DONE
  tcp-connect-loop --count N   N loopback connections (connect, accept, close); prints DONE
  tcp-bulk-loop --conns N [--bytes B] [--lock-every K]   N loopback bulk transfers of B bytes, every
             K-th receiver locked with SO_RCVBUF=64K after accept; prints DONE
  many-procs --procs N --socks K --ports-file F [--rcvbuf R] [--activity-file A] [--every-ms M]
             N child processes holding K UDP sockets each (ports written to F); while A exists,
             each child makes one SO_RCVBUF call every M ms
  churn      --procs N [--parallel P] [--sends K] [--rcvbuf R] [--comm NAME] [--new-netns]   N short-lived
             children, each: UDP socket, SO_RCVBUF, K datagrams to itself (drops), read its own
             drops column, close, exit; prints DONE procs=N drops=<sum of the drops columns>
  in-cgroup  --root DIR --chain A/B/… -- COMMAND ARGS…   join the cgroup DIR/A/B/… (walked one
             level at a time: the path may exceed PATH_MAX), then exec COMMAND";

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

/// The socket's lock bits (`sk_userlocks`: 1 = SOCK_SNDBUF_LOCK, 2 = SOCK_RCVBUF_LOCK) as
/// `getsockopt(SO_BUF_LOCK)` reads them. Kernels before 5.14 have no `SO_BUF_LOCK`
/// (ENOPROTOOPT): there the bits are `set`, what this process's own successful `setsockopt`
/// calls set by sock.c's rule (a successful SO_RCVBUF/SO_RCVBUFFORCE sets SOCK_RCVBUF_LOCK,
/// SO_SNDBUF/SO_SNDBUFFORCE SOCK_SNDBUF_LOCK; an accepted socket inherits its listener's).
fn locks_of(fd: i32, set: i32) -> String {
    match getsockopt_int(fd, libc::SOL_SOCKET, SO_BUF_LOCK) {
        Ok(v) => v.to_string(),
        Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => set.to_string(),
        Err(_) => "?".into(),
    }
}

/// Where `locks` came from, printed next to it: the readback, or the errno rule before 5.14.
fn locks_source(fd: i32) -> &'static str {
    match getsockopt_int(fd, libc::SOL_SOCKET, SO_BUF_LOCK) {
        Ok(_) => "SO_BUF_LOCK",
        Err(_) => "errno",
    }
}

fn tcp_listen(a: &Args) -> anyhow::Result<()> {
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

fn tcp_connect(a: &Args) -> anyhow::Result<()> {
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
    let set = match (errno, opt) {
        (0, libc::SO_RCVBUF | libc::SO_RCVBUFFORCE) => 2,
        (0, libc::SO_SNDBUF | libc::SO_SNDBUFFORCE) => 1,
        (0, SO_BUF_LOCK) => value & 3,
        _ => 0,
    };
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
        ("locks", locks_of(fd, set)),
        ("locks_source", locks_source(fd).to_string()),
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
    // bufscope's series are keyed by program and place: a name of its own per test child
    // (`wl<pid>`) keeps each one's series apart (children it forks share it). Commands
    // that name themselves later override it.
    if std::env::var_os("BUFSCOPE_WORKLOAD_KEEP_COMM").is_none()
        && let Err(e) = set_comm(format!("wl{}", std::process::id()).as_bytes())
    {
        eprintln!("bufscope-workload: {e:#}");
    }
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
        "udp-sink" => bench::udp_sink(&a),
        "udp-blast" => bench::udp_blast(&a),
        "udp-fresh" => bench::udp_fresh(&a),
        "udp-spray" => bench::udp_spray(&a),
        "tcp-sink" => bench::tcp_sink(&a),
        "tcp-blast" => bench::tcp_blast(&a),
        "setsockopt-loop" => bench::setsockopt_loop(&a),
        "tcp-connect-loop" => bench::tcp_connect_loop(&a),
        "tcp-bulk-loop" => bench::tcp_bulk_loop(&a),
        "many-procs" => bench::many_procs(&a),
        "churn" => bench::churn(&a),
        "in-cgroup" => bench::in_cgroup(&a),
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

/// Workloads of `cargo xtask bench overhead` and of the reliability tests: data-path load
/// (UDP/TCP blasts and sinks), event loops that fire each probe, and process populations
/// (many long-lived holders of sockets, churn of short-lived ones).
mod bench {
    use std::io::{BufRead as _, Read as _, Write as _};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::os::fd::AsRawFd as _;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use anyhow::{Context as _, bail};
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};

    use super::{Args, inode_of, new_netns, ready, set_comm, setsockopt_int};

    fn dest(a: &Args) -> anyhow::Result<SocketAddr> {
        a.value("--dest")
            .context("--dest IP:PORT is required")?
            .parse()
            .context("--dest must be IP:PORT")
    }

    fn bind_ip(a: &Args) -> anyhow::Result<std::net::IpAddr> {
        a.value("--bind")
            .unwrap_or("127.0.0.1")
            .parse()
            .context("--bind must be an IP address")
    }

    fn udp(ip: std::net::IpAddr) -> anyhow::Result<Socket> {
        Ok(Socket::new(
            Domain::for_address(SocketAddr::new(ip, 0)),
            Type::DGRAM,
            Some(Protocol::UDP),
        )?)
    }

    fn port_of(s: &Socket) -> u16 {
        s.local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map_or(0, |a| a.port())
    }

    fn say(line: String) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }

    /// Reads stdin lines; `on_line` gets each trimmed line until EOF or `exit`.
    fn serve_stdin(mut on_line: impl FnMut(&str)) {
        for line in std::io::stdin().lock().lines() {
            match line {
                Ok(l) if l.trim() == "exit" => return,
                Ok(l) => on_line(l.trim()),
                Err(_) => return,
            }
        }
    }

    /// `udp-sink`: reads datagrams with `recvmmsg` (64 per call) on a thread; `count` on stdin
    /// prints how many arrived so far.
    pub fn udp_sink(a: &Args) -> anyhow::Result<()> {
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
    pub fn udp_blast(a: &Args) -> anyhow::Result<()> {
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
                    let n =
                        unsafe { libc::sendmmsg(s.as_raw_fd(), msgs.as_mut_ptr(), mmsg as u32, 0) };
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

    /// Binds `s` to the wildcard address of `to`'s family, port 0.
    fn bind_any(s: &Socket, to: &SocketAddr) -> anyhow::Result<()> {
        let any = if to.is_ipv4() {
            std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
        } else {
            std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
        };
        s.bind(&SockAddr::from(SocketAddr::new(any, 0)))?;
        Ok(())
    }

    /// `udp-fresh`: `--count` times a new unconnected UDP socket that sends one datagram and
    /// closes (every send is its socket's first; with `--bind-any` it binds first, so its
    /// bind is its first call).
    pub fn udp_fresh(a: &Args) -> anyhow::Result<()> {
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

    fn read_ports(path: &str) -> anyhow::Result<Vec<u16>> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
        text.split_whitespace()
            .map(|p| {
                p.parse()
                    .with_context(|| format!("bad port {p:?} in {path}"))
            })
            .collect()
    }

    /// `udp-spray`: paced round-robin over many loopback ports.
    pub fn udp_spray(a: &Args) -> anyhow::Result<()> {
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
    pub fn tcp_sink(a: &Args) -> anyhow::Result<()> {
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
    pub fn tcp_blast(a: &Args) -> anyhow::Result<()> {
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

    /// `setsockopt-loop`: `--count` buffer-size calls, alternating options and values.
    pub fn setsockopt_loop(a: &Args) -> anyhow::Result<()> {
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
    pub fn tcp_connect_loop(a: &Args) -> anyhow::Result<()> {
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
    pub fn tcp_bulk_loop(a: &Args) -> anyhow::Result<()> {
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

    /// Forks; the child runs `f` and exits with its status (never returns).
    fn fork_child(f: impl FnOnce() -> i32) -> anyhow::Result<libc::pid_t> {
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

    /// `many-procs`: `--procs` children, each holding `--socks` UDP sockets (SO_RCVBUF set, never
    /// read) bound to loopback; their ports go to `--ports-file`. While `--activity-file`
    /// exists, each child makes one SO_RCVBUF call every `--every-ms`.
    pub fn many_procs(a: &Args) -> anyhow::Result<()> {
        let procs: usize = a.num("--procs", 1000)?;
        let socks: usize = a.num("--socks", 10)?;
        let rcvbuf: i32 = a.num("--rcvbuf", 4096)?;
        let every = Duration::from_millis(a.num("--every-ms", 1000)?);
        let ports_file = a
            .value("--ports-file")
            .context("--ports-file is required")?
            .to_string();
        let activity = a.value("--activity-file").map(str::to_string);
        let mut fds = [0i32; 2];
        // SAFETY: fds is a valid 2-int array.
        if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
            bail!("pipe: {}", std::io::Error::last_os_error());
        }
        let (rd, wr) = (fds[0], fds[1]);
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        let mut children = Vec::with_capacity(procs);
        for _ in 0..procs {
            let activity = activity.clone();
            let pid = fork_child(move || {
                // SAFETY: prctl/close/getppid/write on our own fds; no memory is shared.
                unsafe {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    libc::close(rd);
                    if libc::getppid() != parent {
                        return 1;
                    }
                }
                let lo = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
                let mut held = Vec::with_capacity(socks);
                let mut line = String::new();
                for _ in 0..socks {
                    let Ok(s) = udp(lo) else { return 1 };
                    if s.set_recv_buffer_size(rcvbuf as usize).is_err()
                        || s.bind(&SockAddr::from(SocketAddr::new(lo, 0))).is_err()
                    {
                        return 1;
                    }
                    line.push_str(&format!("{} ", port_of(&s)));
                    held.push(s);
                }
                line.push('\n');
                // SAFETY: wr is the pipe's write end; the line is live. Lines are far below
                // PIPE_BUF, so concurrent children's writes do not interleave.
                unsafe { libc::write(wr, line.as_ptr().cast(), line.len()) };
                // SAFETY: closing our copy of the write end.
                unsafe { libc::close(wr) };
                let mut i = 0usize;
                loop {
                    std::thread::sleep(every);
                    // SAFETY: getppid has no preconditions.
                    if unsafe { libc::getppid() } != parent {
                        return 0;
                    }
                    if activity
                        .as_deref()
                        .is_some_and(|f| std::path::Path::new(f).exists())
                    {
                        let s = &held[i % held.len()];
                        let _ = s.set_recv_buffer_size(rcvbuf as usize);
                        i += 1;
                    }
                }
            })?;
            children.push(pid);
        }
        // SAFETY: closing the parent's copy of the write end (EOF once every child closed it).
        unsafe { libc::close(wr) };
        // SAFETY: rd is the pipe's read end, owned from here on by the File.
        let mut reader = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(rd) };
        let mut text = String::new();
        reader.read_to_string(&mut text)?;
        let lines = text.lines().count();
        if lines != procs {
            bail!("only {lines} of {procs} children set up their sockets");
        }
        std::fs::write(
            &ports_file,
            text.split_whitespace().collect::<Vec<_>>().join("\n"),
        )?;
        ready(&[
            ("pid", std::process::id().to_string()),
            ("procs", procs.to_string()),
            ("sockets", (procs * socks).to_string()),
        ]);
        serve_stdin(|_| {});
        for pid in children {
            // SAFETY: signalling and reaping our own children.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
        Ok(())
    }

    /// The `drops` column of `inode` in `/proc/self/net/udp`.
    fn own_udp_drops(inode: u64) -> Option<u64> {
        let text = std::fs::read_to_string("/proc/self/net/udp").ok()?;
        text.lines().skip(1).find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 12 && f[9].parse::<u64>().ok() == Some(inode))
                .then(|| f.last().and_then(|d| d.parse().ok()))
                .flatten()
        })
    }

    /// `in-cgroup`: moves this process into a cgroup whose path may be longer than PATH_MAX
    /// (each component is opened relative to the previous one), then execs the command after
    /// `--`.
    pub fn in_cgroup(a: &Args) -> anyhow::Result<()> {
        use std::os::unix::process::CommandExt as _;
        let root = a.value("--root").context("--root DIR is required")?;
        let chain = a.value("--chain").unwrap_or("");
        let sep =
            a.0.iter()
                .position(|x| x == "--")
                .context("in-cgroup needs -- COMMAND")?;
        let cmd = a.0.get(sep + 1..).unwrap_or(&[]);
        let (prog, args) = cmd.split_first().context("no command after --")?;
        let open = |dir: Option<&std::fs::File>, name: &str, flags: i32| {
            let c = std::ffi::CString::new(name)?;
            // SAFETY: c is NUL-terminated; dir (when given) is an open directory.
            let fd = unsafe {
                match dir {
                    Some(d) => libc::openat(d.as_raw_fd(), c.as_ptr(), flags),
                    None => libc::open(c.as_ptr(), flags),
                }
            };
            if fd < 0 {
                bail!("opening {name}: {}", std::io::Error::last_os_error());
            }
            // SAFETY: fd was just opened and is owned by nobody else.
            Ok(unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) })
        };
        let mut dir = open(None, root, libc::O_DIRECTORY | libc::O_RDONLY)?;
        for comp in chain.split('/').filter(|c| !c.is_empty()) {
            dir = open(Some(&dir), comp, libc::O_DIRECTORY | libc::O_RDONLY)?;
        }
        let mut procs = open(Some(&dir), "cgroup.procs", libc::O_WRONLY)?;
        procs
            .write_all(std::process::id().to_string().as_bytes())
            .context("writing cgroup.procs")?;
        drop((procs, dir));
        let err = std::process::Command::new(prog).args(args).exec();
        bail!("exec {prog}: {err}")
    }

    /// One churn child: socket, SO_RCVBUF, bind, `sends` datagrams to itself, read its own
    /// drops column, close. Returns the drops, or the step that failed (1-6).
    fn churn_one(rcvbuf: i32, sends: usize) -> Result<u64, i32> {
        let lo = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
        let s = udp(lo).map_err(|_| 1)?;
        setsockopt_int(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, rcvbuf).map_err(|_| 2)?;
        s.bind(&SockAddr::from(SocketAddr::new(lo, 0)))
            .map_err(|_| 3)?;
        let me = s.local_addr().map_err(|_| 3)?;
        let buf = [0x77u8; 1000];
        for _ in 0..sends {
            s.send_to(&buf, &me).map_err(|_| 4)?;
        }
        let inode = inode_of(s.as_raw_fd()).map_err(|_| 5)?;
        // /proc/net/udp is walked hash slot by hash slot while other children bind and close
        // sockets in the same table: a read can miss a line. Read again until ours shows up.
        let mut drops = None;
        for _ in 0..50 {
            drops = own_udp_drops(inode);
            if drops.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let drops = drops.ok_or(6)?;
        drop(s);
        Ok(drops)
    }

    /// `churn`: `--procs` short-lived children, at most `--parallel` at a time. Each reports its
    /// socket's own drops column (read just before close) through a pipe; the parent prints the
    /// sum, then holds (so its network namespace stays readable).
    pub fn churn(a: &Args) -> anyhow::Result<()> {
        let procs: usize = a.num("--procs", 5000)?;
        let parallel: usize = a.num("--parallel", 8)?;
        let sends: usize = a.num("--sends", 20)?;
        let rcvbuf: i32 = a.num("--rcvbuf", 1)?;
        let comm = a.value("--comm").map(|c| c.as_bytes().to_vec());
        if a.flag("--new-netns") {
            new_netns()?;
        }
        let mut fds = [0i32; 2];
        // SAFETY: fds is a valid 2-int array.
        if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
            bail!("pipe: {}", std::io::Error::last_os_error());
        }
        let (rd, wr) = (fds[0], fds[1]);
        ready(&[("pid", std::process::id().to_string())]);
        let (mut running, mut started, mut failed) = (0usize, 0usize, 0usize);
        let mut why: std::collections::BTreeMap<i32, usize> = Default::default();
        let mut reap = |failed: &mut usize| {
            let mut status = 0;
            // SAFETY: waiting for any of our children.
            let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
            if pid > 0 && !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
                *failed += 1;
                let code = if libc::WIFEXITED(status) {
                    libc::WEXITSTATUS(status)
                } else {
                    -libc::WTERMSIG(status)
                };
                *why.entry(code).or_default() += 1;
            }
            pid > 0
        };
        while started < procs {
            if running >= parallel.max(1) {
                if reap(&mut failed) {
                    running -= 1;
                }
                continue;
            }
            let comm = comm.clone();
            fork_child(move || {
                // SAFETY: closing the child's copy of the read end.
                unsafe { libc::close(rd) };
                if let Some(c) = &comm
                    && set_comm(c).is_err()
                {
                    return 9;
                }
                match churn_one(rcvbuf, sends) {
                    Ok(d) => {
                        let b = d.to_ne_bytes();
                        // SAFETY: 8-byte write (< PIPE_BUF: atomic) from a live buffer.
                        unsafe { libc::write(wr, b.as_ptr().cast(), b.len()) };
                        0
                    }
                    Err(step) => 10 + step,
                }
            })?;
            started += 1;
            running += 1;
        }
        while running > 0 && reap(&mut failed) {
            running -= 1;
        }
        // SAFETY: closing the parent's write end: EOF after the last child's record.
        unsafe { libc::close(wr) };
        // SAFETY: rd is the read end, owned by the File from here on.
        let mut reader = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(rd) };
        let mut raw = Vec::new();
        reader.read_to_end(&mut raw)?;
        let drops: u64 = raw
            .chunks_exact(8)
            .map(|c| u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .sum();
        let why: Vec<String> = why.iter().map(|(c, n)| format!("{c}:{n}")).collect();
        say(format!(
            "DONE procs={procs} reported={} failed={failed} drops={drops} exit_codes={}",
            raw.len() / 8,
            why.join(",")
        ));
        serve_stdin(|_| {});
        Ok(())
    }
}
