//! The HTTP side of `bufscope run`: routes and handlers (this file), the accept loop
//! ([`serve`]), `--web.config.file` ([`web_config`]: TLS in [`tls`], basic auth and headers in
//! [`auth`]) and the status page ([`status`]).
//!
//! | path | handler |
//! |---|---|
//! | `--web.telemetry-path` (`/metrics`) | Prometheus text 0.0.4, or OpenMetrics 1.0.0 when `Accept` prefers it (with `_created` samples under `--web.openmetrics-created`) |
//! | `/healthz` | 200 while any probe is attached and the collector polls and drains; 503 with the reason otherwise (never behind auth) |
//! | `/api/v1/findings` | findings as JSON (docs/findings.md) |
//! | `/api/v1/status` | the status page's data |
//! | `/` | the status page |

pub mod auth;
pub mod clients;
pub mod serve;
pub mod status;
pub mod tls;
pub mod web_config;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{ConnectInfo, FromRequestParts, RawQuery, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;

use crate::bpf::ProbeStatus;
use crate::collector::{Collector, Heartbeat};
use crate::exposition::Format;

/// Shared between the HTTP handlers and the background tasks.
#[derive(Clone)]
pub struct App {
    /// The exporter's state.
    pub collector: Arc<Mutex<Collector>>,
    /// Whether any probe attached (`/healthz`).
    pub any_attached: bool,
    /// Per-probe outcome, for the status page.
    pub probes: Arc<Vec<ProbeStatus>>,
    /// The collector's last poll and drain (`/healthz`, read without the collector's lock).
    pub heartbeat: Arc<Heartbeat>,
    /// `/healthz` fails when the last poll or drain is older than this.
    pub stale_after: Duration,
    /// Requests that need the collector (metrics, findings, status): at most
    /// [`MAX_IN_FLIGHT`] hold a blocking thread and wait for its lock, [`MAX_QUEUED`] more
    /// wait without one, shared fairly between clients ([`clients::Slots`]).
    pub slots: Arc<clients::Slots>,
}

pub use clients::{CLIENT_QUEUED, MAX_IN_FLIGHT, MAX_QUEUED};

/// The source address of a request, as [`serve::serve`] records it (unspecified when the
/// router is served some other way: then every request is one client).
pub struct Peer(pub IpAddr);

impl<S: Send + Sync> FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Self(
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip()),
        ))
    }
}

/// How many poll intervals (or ring-buffer drain periods, whichever is longer) the collector
/// may go without a completed poll or drain before `/healthz` fails: at least
/// [`STALE_AT_LEAST`].
pub const STALE_INTERVALS: u32 = 5;
/// The shortest staleness `/healthz` reports (a long scrape may hold the collector a while).
pub const STALE_AT_LEAST: Duration = Duration::from_secs(10);

const HEALTHZ: &str = "/healthz";
const FINDINGS: &str = "/api/v1/findings";
const STATUS: &str = "/api/v1/status";
const INDEX: &str = "/";

/// The fixed routes: `--web.telemetry-path` must be none of them.
pub const ROUTES: [&str; 4] = [HEALTHZ, FINDINGS, STATUS, INDEX];

/// Every route, behind the auth/headers middleware. `telemetry_path` must have passed
/// [`crate::cli::check_telemetry_path`] (an invalid or taken path panics here).
pub fn router(app: App, telemetry_path: &str, auth: auth::Auth) -> Router {
    Router::new()
        .route(telemetry_path, get(metrics_handler))
        .route(HEALTHZ, get(healthz))
        .route(FINDINGS, get(findings_handler))
        .route(STATUS, get(status_handler))
        .route(INDEX, get(index))
        .with_state(app)
        .layer(axum::middleware::from_fn_with_state(auth, auth::middleware))
}

/// What a connection over its client's share is served ([`clients::Admitted::HealthOnly`]):
/// `/healthz` as usual (kubelet's probe is answered whoever holds the connections), anything
/// else 503.
pub fn health_only_router(app: App) -> Router {
    Router::new()
        .route(HEALTHZ, get(healthz))
        .fallback(|| async {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, "1"), (header::CONNECTION, "close")],
                "too many connections from this client: retry\n",
            )
        })
        .with_state(app)
}

fn unavailable() -> Response {
    (StatusCode::INTERNAL_SERVER_ERROR, "collector unavailable\n").into_response()
}

fn busy() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, "1")],
        format!(
            "too many requests in flight ({MAX_IN_FLIGHT}, and {MAX_QUEUED} queued, at most \
             {CLIENT_QUEUED} of one client): retry\n"
        ),
    )
        .into_response()
}

/// `/metrics`, in the format the client's `Accept` header prefers ([`Format::negotiate`]).
async fn metrics_handler(State(app): State<App>, peer: Peer, headers: HeaderMap) -> Response {
    let accept = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(",");
    let format = Format::negotiate((!accept.is_empty()).then_some(accept.as_str()));
    match with_fresh(&app, peer, move |c| c.render_shared(format)).await {
        Ok(body) => (
            [
                (header::CONTENT_TYPE, format.content_type()),
                (header::VARY, "Accept"),
            ],
            body,
        )
            .into_response(),
        Err(r) => r,
    }
}

/// 200 while a probe is attached and the collector keeps polling and draining (for kubelet's
/// liveness probe: a stuck daemon is restarted); 503 with the reason otherwise.
async fn healthz(State(app): State<App>) -> Response {
    if !app.any_attached {
        return (StatusCode::SERVICE_UNAVAILABLE, "no probe attached\n").into_response();
    }
    if app.heartbeat.none_attached() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "no probe attached: every pinned link was removed or replaced (see the log)\n",
        )
            .into_response();
    }
    match app.heartbeat.stale(app.stale_after) {
        None => (StatusCode::OK, "ok\n").into_response(),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

async fn index() -> Html<&'static str> {
    Html(status::PAGE)
}

/// Runs `f` on the collector in a blocking thread after a poll that started after this request
/// arrived: a scrape always reflects everything that happened before it. Concurrent requests
/// share one poll (they queue on the lock and find it already done) and, for `/metrics`, one
/// body. At most [`MAX_IN_FLIGHT`] run at once, [`MAX_QUEUED`] more wait for their turn, at
/// most [`CLIENT_QUEUED`] of them from one client, and a freed place goes to the waiting
/// client with the fewest in flight ([`clients::Slots`]); more are refused at once (the error
/// response).
async fn with_fresh<T: Send + 'static>(
    app: &App,
    peer: Peer,
    f: impl FnOnce(&mut Collector) -> T + Send + 'static,
) -> Result<T, Response> {
    with_collector(app, peer, move |collector, arrived| {
        let mut c = crate::collector::fresh(collector, arrived);
        f(&mut c)
    })
    .await
}

/// Runs `f` on a blocking thread with the shared collector and the request's arrival, within
/// the client's share of the request slots.
async fn with_collector<T: Send + 'static>(
    app: &App,
    peer: Peer,
    f: impl FnOnce(&std::sync::Mutex<Collector>, Instant) -> T + Send + 'static,
) -> Result<T, Response> {
    let permit = match app.slots.acquire(peer.0) {
        clients::Acquired::Now(slot) => slot,
        clients::Acquired::Wait(rx) => rx.await.map_err(|_| busy())?,
        clients::Acquired::Busy => return Err(busy()),
    };
    let collector = app.collector.clone();
    let arrived = Instant::now();
    tokio::task::spawn_blocking(move || {
        // Held by the blocking thread, not the request: a client that hangs up does not free
        // its place while the thread still waits for the collector.
        let _permit = permit;
        f(&collector, arrived)
    })
    .await
    .map_err(|_| unavailable())
}

/// `/api/v1/findings[?pid=&kind=&severity=&limit=]`: a bad parameter is a 400 that names it
/// before the collector is asked anything.
async fn findings_handler(
    State(app): State<App>,
    peer: Peer,
    RawQuery(query): RawQuery,
) -> Response {
    let sel = match crate::advice::Selection::parse(query.as_deref().unwrap_or("")) {
        Ok(sel) => sel,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    };
    match with_collector(&app, peer, move |c, arrived| {
        crate::collector::report(c, arrived, &sel)
    })
    .await
    {
        Ok(r) => axum::Json(r).into_response(),
        Err(r) => r,
    }
}

async fn status_handler(State(app): State<App>, peer: Peer) -> Response {
    let probes = app.probes.clone();
    match with_fresh(&app, peer, move |c| status::document(c, &probes)).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(r) => r,
    }
}
