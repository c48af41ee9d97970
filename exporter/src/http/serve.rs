//! The HTTP(S) server loop: hyper with a header-read timeout, caps on open connections with a
//! share per client ([`super::clients`]) and a bounded graceful drain, so slow or hostile
//! clients (slowloris) cannot exhaust file descriptors or stall scrapes, and shutdown never
//! waits on them for long.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::serve::Listener;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;

pub use super::clients::MAX_CONNECTIONS;
use super::clients::{Admitted, Connections};

/// A client must send a complete request head within this long (also bounds idle keep-alive).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a health-only connection ([`Admitted::HealthOnly`]) may take to send its request.
pub const HEALTH_ONLY_TIMEOUT: Duration = Duration::from_secs(2);
/// How long shutdown waits for in-flight requests.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection's place under the connection caps ([`Connections`]). The TLS listener takes
/// it before the handshake (a handshake costs more than a plain connection and must count), a
/// plain connection when accepted.
pub trait Admission {
    /// The place the listener already took for this connection, if any.
    fn take_admission(&mut self) -> Option<Admitted>;
}

impl Admission for tokio::net::TcpStream {
    fn take_admission(&mut self) -> Option<Admitted> {
        None
    }
}

/// The connection caps, shared by [`serve`] and a listener that admits connections itself
/// (TLS).
pub fn connection_permits() -> Arc<Connections> {
    Connections::new()
}

/// `router` with the peer's address in every request's extensions (`ConnectInfo`), for the
/// per-client shares.
#[derive(Clone)]
struct WithPeer {
    inner: TowerToHyperService<Router>,
    peer: SocketAddr,
}

impl hyper::service::Service<hyper::Request<Incoming>> for WithPeer {
    type Response = <TowerToHyperService<Router> as hyper::service::Service<
        hyper::Request<Incoming>,
    >>::Response;
    type Error =
        <TowerToHyperService<Router> as hyper::service::Service<hyper::Request<Incoming>>>::Error;
    type Future =
        <TowerToHyperService<Router> as hyper::service::Service<hyper::Request<Incoming>>>::Future;

    fn call(&self, mut req: hyper::Request<Incoming>) -> Self::Future {
        req.extensions_mut().insert(ConnectInfo(self.peer));
        self.inner.call(req)
    }
}

/// Serves `router` on `listener` until `shutdown` resolves, with the per-client connection
/// shares of `conns`; a connection over its client's share is served `health_only` (for
/// [`HEALTH_ONLY_TIMEOUT`], one request).
pub async fn serve<L>(
    mut listener: L,
    router: Router,
    health_only: Router,
    conns: Arc<Connections>,
    shutdown: impl Future<Output = ()>,
) where
    L: Listener<Addr = SocketAddr>,
    L::Io: Admission,
{
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(true);
    let mut short = hyper::server::conn::http1::Builder::new();
    short
        .timer(TokioTimer::new())
        .header_read_timeout(HEALTH_ONLY_TIMEOUT)
        .keep_alive(false);
    tokio::pin!(shutdown);
    let mut refused: u64 = 0;
    loop {
        let (mut io, addr) = tokio::select! {
            conn = listener.accept() => conn,
            () = &mut shutdown => break,
        };
        let Some(admitted) = io.take_admission().or_else(|| conns.admit(addr.ip())) else {
            refused += 1;
            if refused.is_power_of_two() {
                tracing::warn!(
                    peer = ?addr,
                    refused,
                    "connection caps reached (at most {MAX_CONNECTIONS}, a share per client): \
                     closing new ones"
                );
            }
            drop(io);
            continue;
        };
        let (permit, service, builder) = match admitted {
            Admitted::Full(p) => (p, router.clone(), &http),
            Admitted::HealthOnly(p) => (p, health_only.clone(), &short),
        };
        let service = WithPeer {
            inner: TowerToHyperService::new(service),
            peer: addr,
        };
        let conn = builder.serve_connection(TokioIo::new(io), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(peer = ?addr, "connection ended: {e}");
            }
            drop(permit);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(DRAIN_TIMEOUT) => {
            tracing::info!("in-flight requests still open after {DRAIN_TIMEOUT:?}; closing them");
        }
    }
}

/// Raises the soft open-file limit to the hard limit (one fd per client connection, plus the
/// `/proc` walks): a low soft limit is the usual cause of "too many open files" under load.
pub fn raise_nofile_limit() {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) == 0 && rl.rlim_cur < rl.rlim_max {
            let want = libc::rlimit {
                rlim_cur: rl.rlim_max,
                rlim_max: rl.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) != 0 {
                tracing::debug!("could not raise RLIMIT_NOFILE to {}", rl.rlim_max);
            }
        }
    }
}
