//! The HTTP(S) server loop: hyper with a header-read timeout, a cap on open connections and a
//! bounded graceful drain, so slow or hostile clients (slowloris) cannot exhaust file
//! descriptors or stall scrapes, and shutdown never waits on them for long.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::serve::Listener;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A client must send a complete request head within this long (also bounds idle keep-alive).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Most connections open at once; beyond that new ones are closed at once.
pub const MAX_CONNECTIONS: usize = 2048;
/// How long shutdown waits for in-flight requests.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection's place under [`MAX_CONNECTIONS`]. The TLS listener takes it before the
/// handshake (a handshake costs more than a plain connection and must count), a plain
/// connection when accepted.
pub trait Admission {
    /// The permit the listener already took for this connection, if any.
    fn take_permit(&mut self) -> Option<OwnedSemaphorePermit>;
}

impl Admission for tokio::net::TcpStream {
    fn take_permit(&mut self) -> Option<OwnedSemaphorePermit> {
        None
    }
}

/// The cap on open connections, shared by [`serve`] and a listener that admits connections
/// itself (TLS).
pub fn connection_permits() -> Arc<Semaphore> {
    Arc::new(Semaphore::new(MAX_CONNECTIONS))
}

/// Serves `router` on `listener` until `shutdown` resolves; at most [`MAX_CONNECTIONS`]
/// connections (`permits`) are open at once.
pub async fn serve<L>(
    mut listener: L,
    router: Router,
    permits: Arc<Semaphore>,
    shutdown: impl Future<Output = ()>,
) where
    L: Listener,
    L::Io: Admission,
    L::Addr: std::fmt::Debug,
{
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(true);
    tokio::pin!(shutdown);
    let mut refused: u64 = 0;
    loop {
        let (mut io, addr) = tokio::select! {
            conn = listener.accept() => conn,
            () = &mut shutdown => break,
        };
        let Some(permit) = io
            .take_permit()
            .or_else(|| permits.clone().try_acquire_owned().ok())
        else {
            refused += 1;
            if refused.is_power_of_two() {
                tracing::warn!(
                    peer = ?addr,
                    refused,
                    "{MAX_CONNECTIONS} connections already open: closing new ones"
                );
            }
            drop(io);
            continue;
        };
        let service = TowerToHyperService::new(router.clone());
        let conn = http.serve_connection(TokioIo::new(io), service);
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
