//! WireGuard over one TCP connection, each packet preceded by its length (2 bytes, big
//! endian). The side with an endpoint connects (and reconnects); the other listens.
//!
//! Threads: one writer (TUN → encrypt → TCP, plus handshake/keepalive packets from a control
//! queue, so that only one thread ever writes to the stream), one reader per connection
//! (TCP → decrypt → TUN), a connection manager (connect or accept) and boringtun's timers.
//! On the listening side a new connection only replaces the current one once a packet on it
//! has authenticated as the peer, so a stranger connecting cannot cut the tunnel.

use std::io::{self, Write};
use std::net::{Shutdown as SockShutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use boringtun::noise::TunnResult;
use bufscope_policy::Transport;
use socket2::{Domain, Protocol, Socket, Type};

use crate::buffers;
use crate::config::{BufferPolicy, Settings};
use crate::framing;
use crate::offload::Coalescer;
use crate::sys::{Shutdown, Wake, wait_readable, would_block};
use crate::tun::Tun;
use crate::wg::{self, Ends, Peer, SLOT, Stats};
use crate::{Workers, spawn};

/// Packets encrypted or decrypted per lock of the noise state.
const BATCH: usize = 64;
/// Size of a connection's receive buffer (many frames per `recv`).
const READ_BUF: usize = 1 << 20;
/// Size of the writer's buffer (many frames per `send`).
const WRITE_BUF: usize = 1 << 20;
/// Connections accepted but not yet authenticated, at most.
const MAX_PENDING: usize = 4;
/// An accepted connection that does not authenticate within this time is closed.
const PENDING_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone)]
struct Conn {
    id: u64,
    stream: Arc<TcpStream>,
    addr: SocketAddr,
}

/// The current connection, and the control queue feeding the writer.
struct Link {
    current: Mutex<Option<Conn>>,
    changed: Condvar,
    next_id: AtomicU64,
    pending: AtomicUsize,
    control: framing::Control,
}

impl Link {
    fn new() -> io::Result<Self> {
        Ok(Self {
            current: Mutex::new(None),
            changed: Condvar::new(),
            next_id: AtomicU64::new(1),
            pending: AtomicUsize::new(0),
            control: framing::Control::new()?,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Option<Conn>> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn current(&self) -> Option<Conn> {
        self.lock().clone()
    }

    fn is_current(&self, id: u64) -> bool {
        self.lock().as_ref().is_some_and(|c| c.id == id)
    }

    /// Makes `conn` the current connection, closing the previous one.
    fn promote(&self, conn: &Conn) {
        let mut cur = self.lock();
        if cur.as_ref().is_some_and(|c| c.id == conn.id) {
            return;
        }
        if let Some(old) = cur.replace(conn.clone()) {
            tracing::info!(
                "TCP connection from {} replaces the one from {}",
                conn.addr,
                old.addr
            );
            let _ = old.stream.shutdown(SockShutdown::Both);
        }
        self.changed.notify_all();
    }

    /// Forgets connection `id` if it is the current one.
    fn drop_conn(&self, id: u64) {
        let mut cur = self.lock();
        if cur.as_ref().is_some_and(|c| c.id == id) {
            if let Some(old) = cur.take() {
                let _ = old.stream.shutdown(SockShutdown::Both);
            }
            self.changed.notify_all();
        }
    }

    /// Queues a handshake/keepalive packet for the writer.
    fn push_control(&self, p: &[u8]) {
        self.control.push(p);
    }
}

/// Starts the TCP transport: connection manager, writer, timers.
pub fn start(s: &Settings, tun: Arc<Tun>, peer: Arc<Peer>, shutdown: &Shutdown) -> Result<Workers> {
    let link = Arc::new(Link::new().context("cannot create an eventfd")?);
    let mut threads = Vec::new();
    let ctx = Ctx {
        ends: Ends::new(tun, peer, shutdown),
        link,
        policy: s.buffer_policy,
        target: s.target,
        mtu: s.mtu,
    };

    match s.endpoint {
        Some(endpoint) => {
            // Connect once now, so that an unreachable endpoint is a clear startup error.
            let conn = connect_first(&ctx, endpoint, s.connect_timeout)?;
            ctx.install_client(conn)?;
            let c = ctx.clone();
            threads.push(spawn("tcp-connect", move || client_manager(&c, endpoint))?);
        }
        None => {
            let port = s.listen_port.unwrap_or(0);
            let listener = listen(&ctx, port)?;
            let c = ctx.clone();
            threads.push(spawn("tcp-accept", move || server_manager(&c, &listener))?);
        }
    }
    {
        let c = ctx.clone();
        threads.push(spawn("tun-to-tcp", move || writer(&c))?);
    }
    {
        let c = ctx.clone();
        threads.push(spawn("timers", move || {
            wg::run_timers(&c.ends.peer, &c.ends.shutdown, |p| c.link.push_control(p));
            Ok(())
        })?);
    }
    Ok(threads)
}

#[derive(Clone)]
struct Ctx {
    ends: Ends,
    link: Arc<Link>,
    policy: BufferPolicy,
    target: Option<bufscope_policy::Target>,
    mtu: u16,
}

impl Ctx {
    fn new_conn(&self, stream: TcpStream, addr: SocketAddr) -> Conn {
        Conn {
            id: self.link.next_id.fetch_add(1, Ordering::Relaxed),
            stream: Arc::new(stream),
            addr,
        }
    }

    /// Client side: our own connection is trusted at once.
    fn install_client(&self, conn: Conn) -> Result<()> {
        self.link.promote(&conn);
        let c = self.clone();
        let reader_conn = conn.clone();
        spawn("tcp-to-tun", move || {
            reader(&c, &reader_conn, true);
            Ok(())
        })?;
        // A new connection may have lost an earlier handshake message: start one now unless
        // a session exists.
        if self.ends.peer.tunn().stats().0.is_none() {
            wg::initiate(&self.ends.peer, true, |p| self.link.push_control(p));
        }
        Ok(())
    }
}

fn new_socket(addr: &SocketAddr) -> Result<Socket> {
    let domain = if addr.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    Socket::new(domain, Type::STREAM.cloexec(), Some(Protocol::TCP))
        .context("cannot create the outer TCP socket")
}

fn connect_once(ctx: &Ctx, endpoint: SocketAddr, log_policy: bool) -> io::Result<Conn> {
    let sock = new_socket(&endpoint).map_err(io::Error::other)?;
    if log_policy {
        // Before connect, on purpose for `fixed`: that is when the window scale is decided.
        buffers::apply(
            &sock,
            ctx.policy,
            Transport::Tcp,
            ctx.target,
            "outer TCP socket",
        )
        .map_err(io::Error::other)?;
    } else {
        quiet_apply(&sock, ctx)?;
    }
    sock.connect_timeout(&endpoint.into(), Duration::from_secs(3))?;
    sock.set_tcp_nodelay(true)?;
    buffers::log_effective(&sock, ctx.policy, "connected TCP socket");
    Ok(ctx.new_conn(sock.into(), endpoint))
}

/// Applies the buffer policy again on reconnects without repeating the full log.
fn quiet_apply(sock: &Socket, ctx: &Ctx) -> io::Result<()> {
    match ctx.policy {
        BufferPolicy::Fixed(n) => {
            sock.set_recv_buffer_size(n)?;
            sock.set_send_buffer_size(n)
        }
        BufferPolicy::Recommended => bufscope_policy::Plan::for_current(Transport::Tcp, ctx.target)
            .apply(sock)
            .map(drop)
            .map_err(io::Error::other),
        BufferPolicy::OsDefault => Ok(()),
    }
}

fn connect_first(ctx: &Ctx, endpoint: SocketAddr, timeout: Duration) -> Result<Conn> {
    let deadline = Instant::now() + timeout;
    let mut first = true;
    loop {
        match connect_once(ctx, endpoint, first) {
            Ok(c) => {
                tracing::info!("TCP connected to {endpoint}");
                return Ok(c);
            }
            Err(e) => {
                let fatal = matches!(
                    e.raw_os_error(),
                    Some(libc::ENETUNREACH | libc::EHOSTUNREACH | libc::EACCES | libc::EPERM)
                );
                if fatal || Instant::now() >= deadline || ctx.ends.shutdown.is_triggered() {
                    return Err(anyhow!(e)).with_context(|| {
                        format!("cannot connect to endpoint {endpoint} over TCP")
                    });
                }
                tracing::debug!("connecting to {endpoint}: {e}; retrying");
            }
        }
        first = false;
        if ctx.ends.shutdown.sleep(Duration::from_millis(200))? {
            bail!("interrupted while connecting to {endpoint}");
        }
    }
}

/// Client: reconnects whenever the connection drops, with a backoff up to 5 s.
fn client_manager(ctx: &Ctx, endpoint: SocketAddr) -> Result<()> {
    let mut backoff = Duration::from_millis(100);
    loop {
        // Wait until there is no connection (or shutdown).
        {
            let mut cur = ctx.link.lock();
            while cur.is_some() && !ctx.ends.shutdown.is_triggered() {
                cur = ctx
                    .link
                    .changed
                    .wait_timeout(cur, Duration::from_millis(250))
                    .map(|(g, _)| g)
                    .unwrap_or_else(|e| e.into_inner().0);
            }
        }
        if ctx.ends.shutdown.is_triggered() {
            return Ok(());
        }
        match connect_once(ctx, endpoint, false) {
            Ok(conn) => {
                tracing::info!("TCP reconnected to {endpoint}");
                backoff = Duration::from_millis(100);
                ctx.install_client(conn)?;
            }
            Err(e) => {
                tracing::warn!("reconnecting to {endpoint}: {e}; next try in {backoff:?}");
                if ctx.ends.shutdown.sleep(backoff)? {
                    return Ok(());
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

fn listen(ctx: &Ctx, port: u16) -> Result<Socket> {
    let addr: SocketAddr = ([0, 0, 0, 0], port).into();
    let sock = new_socket(&addr)?;
    sock.set_reuse_address(true).context("SO_REUSEADDR")?;
    // Before listen: accepted connections inherit the listener's buffers (and for `fixed`,
    // the small window scale that comes with them).
    buffers::apply(
        &sock,
        ctx.policy,
        Transport::Tcp,
        ctx.target,
        "outer TCP listener",
    )?;
    sock.bind(&addr.into())
        .with_context(|| format!("cannot bind TCP port {port}"))?;
    sock.listen(16).context("listen")?;
    sock.set_nonblocking(true)
        .context("O_NONBLOCK on the listener")?;
    tracing::info!(
        "listening on tcp {}",
        sock.local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map_or_else(|| "?".into(), |a| a.to_string())
    );
    Ok(sock)
}

/// Server: accepts connections; each gets a reader that promotes it once it authenticates.
fn server_manager(ctx: &Ctx, listener: &Socket) -> Result<()> {
    loop {
        match listener.accept() {
            Ok((sock, addr)) => {
                let addr = addr.as_socket().unwrap_or_else(|| ([0, 0, 0, 0], 0).into());
                if ctx.link.pending.load(Ordering::Relaxed) >= MAX_PENDING {
                    tracing::warn!(
                        "dropping TCP connection from {addr}: too many unauthenticated connections"
                    );
                    continue;
                }
                // Accepted sockets do not inherit O_NONBLOCK on Linux; make sure.
                sock.set_nonblocking(false).context("accepted socket")?;
                sock.set_tcp_nodelay(true).context("TCP_NODELAY")?;
                tracing::info!("TCP connection from {addr}");
                buffers::log_effective(&sock, ctx.policy, "accepted TCP socket");
                let conn = ctx.new_conn(sock.into(), addr);
                ctx.link.pending.fetch_add(1, Ordering::Relaxed);
                let c = ctx.clone();
                spawn("tcp-to-tun", move || {
                    reader(&c, &conn, false);
                    Ok(())
                })?;
            }
            Err(e) if would_block(&e) => {
                if wait_readable(listener.as_raw_fd(), None, &ctx.ends.shutdown, None)?
                    == Wake::Shutdown
                {
                    return Ok(());
                }
            }
            Err(e) => {
                tracing::warn!("accept: {e}");
                if ctx.ends.shutdown.sleep(Duration::from_millis(100))? {
                    return Ok(());
                }
            }
        }
    }
}

/// TUN → (segment) → encrypt → framed → TCP, and the control queue.
fn writer(ctx: &Ctx) -> Result<()> {
    let mut w = framing::Writer::new(ctx.mtu, WRITE_BUF, usize::MAX);
    let peer = &ctx.ends.peer;
    loop {
        let f = w.fill(&ctx.ends, &ctx.link.control)?;
        if f.len == 0 {
            if f.read_any {
                continue;
            }
            match wait_readable(
                ctx.ends.tun.raw_fd(),
                Some(ctx.link.control.ready.raw()),
                &ctx.ends.shutdown,
                None,
            )? {
                Wake::Shutdown => return Ok(()),
                _ => continue,
            }
        }
        let Some(conn) = ctx.link.current() else {
            Stats::add(&peer.stats.send_dropped, f.frames);
            continue;
        };
        match (&*conn.stream).write_all(w.framed(&f)) {
            Ok(()) => Stats::add(&peer.stats.net_out, f.frames),
            Err(e) => {
                Stats::add(&peer.stats.send_dropped, f.frames);
                if !ctx.ends.shutdown.is_triggered() {
                    tracing::warn!("TCP connection to {} lost while sending: {e}", conn.addr);
                }
                ctx.link.drop_conn(conn.id);
            }
        }
    }
}

/// TCP → decrypt → TUN for one connection, until it closes. Unpromoted (accepted) connections
/// are promoted on their first authenticated packet.
fn reader(ctx: &Ctx, conn: &Conn, mut promoted: bool) {
    let why = read_loop(ctx, conn, &mut promoted);
    if !promoted {
        ctx.link.pending.fetch_sub(1, Ordering::Relaxed);
    }
    let current = ctx.link.is_current(conn.id);
    match why {
        Ok(()) if ctx.ends.shutdown.is_triggered() => {}
        Ok(()) if current => tracing::warn!("TCP connection with {} closed by the peer", conn.addr),
        Ok(()) => tracing::debug!("TCP connection with {} closed", conn.addr),
        Err(e) => tracing::warn!("TCP connection with {}: {e:#}", conn.addr),
    }
    ctx.link.drop_conn(conn.id);
}

fn read_loop(ctx: &Ctx, conn: &Conn, promoted: &mut bool) -> Result<()> {
    let peer = &ctx.ends.peer;
    let fd = conn.stream.as_raw_fd();
    let mut rbuf = vec![0u8; READ_BUF];
    let mut out = vec![0u8; BATCH * SLOT];
    let mut ready: Vec<(usize, usize)> = Vec::with_capacity(BATCH);
    let mut co = Coalescer::new();
    let mut scratch = vec![0u8; SLOT];
    let (mut start, mut filled) = (0usize, 0usize);
    let since = Instant::now();
    let src_ip = Some(conn.addr.ip());
    loop {
        // SAFETY: receives into the free tail of rbuf.
        let n = unsafe {
            libc::recv(
                fd,
                rbuf[filled..].as_mut_ptr().cast(),
                rbuf.len() - filled,
                libc::MSG_DONTWAIT,
            )
        };
        if n == 0 {
            return Ok(());
        }
        if n < 0 {
            let e = io::Error::last_os_error();
            if !would_block(&e) {
                return Err(e).context("receiving");
            }
            let timeout = (!*promoted).then_some(Duration::from_secs(1));
            if wait_readable(fd, None, &ctx.ends.shutdown, timeout)? == Wake::Shutdown {
                return Ok(());
            }
            if !*promoted && since.elapsed() > PENDING_TIMEOUT {
                bail!("closed: did not authenticate within {PENDING_TIMEOUT:?}");
            }
            if !ctx.link.is_current(conn.id) && *promoted {
                // Replaced by a newer connection.
                return Ok(());
            }
            continue;
        }
        filled += n as usize;

        // Decrypt complete frames, BATCH per lock.
        loop {
            ready.clear();
            let mut authenticated = false;
            {
                let mut tunn = peer.tunn();
                while ready.len() < BATCH {
                    let Some(frame) = framing::next_frame(&rbuf, &mut start, filled)? else {
                        break;
                    };
                    Stats::add(&peer.stats.net_in, 1);
                    let i = ready.len();
                    let slot = &mut out[i * SLOT..(i + 1) * SLOT];
                    let base = slot.as_ptr() as usize;
                    match tunn.decapsulate(src_ip, frame, slot) {
                        TunnResult::WriteToTunnelV4(p, src)
                            if peer.allowed.contains(src.into()) =>
                        {
                            ready.push((i * SLOT + p.as_ptr() as usize - base, p.len()));
                            authenticated = true;
                        }
                        TunnResult::WriteToTunnelV6(p, src)
                            if peer.allowed.contains(src.into()) =>
                        {
                            ready.push((i * SLOT + p.as_ptr() as usize - base, p.len()));
                            authenticated = true;
                        }
                        TunnResult::WriteToTunnelV4(..) | TunnResult::WriteToTunnelV6(..) => {
                            Stats::add(&peer.stats.not_allowed, 1)
                        }
                        TunnResult::WriteToNetwork(p) => {
                            // Type 2 (handshake response: we authenticated its initiation) or
                            // 4 (keepalive after its response) prove the peer; a cookie (3)
                            // does not.
                            // Promote before queueing the reply, so the writer sends it here.
                            if matches!(p.first(), Some(2 | 4)) {
                                promote(ctx, conn, promoted);
                            }
                            ctx.link.push_control(p);
                            while let TunnResult::WriteToNetwork(q) =
                                tunn.decapsulate(None, &[], &mut scratch)
                            {
                                ctx.link.push_control(q);
                            }
                        }
                        TunnResult::Err(e) => {
                            Stats::add(&peer.stats.decap_errors, 1);
                            wg::log_decap_error(&e, Some(conn.addr));
                        }
                        TunnResult::Done => {}
                    }
                }
            }
            if authenticated {
                promote(ctx, conn, promoted);
            }
            match ctx.ends.tun.write_batch(&mut co, &out, &ready) {
                Ok(st) => {
                    Stats::add(&peer.stats.tun_out, st.packets);
                    Stats::add(&peer.stats.send_dropped, st.dropped);
                }
                Err(e) => return Err(e).context("writing to the TUN device"),
            }
            if ready.len() < BATCH {
                break;
            }
        }
        // Keep room for a whole frame at the end of the buffer.
        framing::compact(&mut rbuf, &mut start, &mut filled);
    }
}

/// Makes an accepted connection the current one once it has authenticated (idempotent).
fn promote(ctx: &Ctx, conn: &Conn, promoted: &mut bool) {
    if !*promoted {
        *promoted = true;
        ctx.link.pending.fetch_sub(1, Ordering::Relaxed);
        ctx.link.promote(conn);
        ctx.ends.peer.set_endpoint(conn.addr);
    }
}
