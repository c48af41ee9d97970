//! The HTTP side of `bufscope run`: routes and handlers (this file), the accept loop
//! ([`serve`]), `--web.config.file` ([`web_config`]: TLS in [`tls`], basic auth and headers in
//! [`auth`]) and the status page ([`status`]).
//!
//! | path | handler |
//! |---|---|
//! | `--web.telemetry-path` (`/metrics`) | Prometheus text 0.0.4, or OpenMetrics 1.0.0 with `_created` samples when `Accept` prefers it |
//! | `/healthz` | 200 while any probe is attached (never behind auth) |
//! | `/api/v1/findings` | findings as JSON (docs/findings.md) |
//! | `/api/v1/status` | the status page's data |
//! | `/` | the status page |

pub mod auth;
pub mod serve;
pub mod status;
pub mod tls;
pub mod web_config;

use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;

use crate::bpf::ProbeStatus;
use crate::collector::Collector;
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
}

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

fn unavailable() -> Response {
    (StatusCode::INTERNAL_SERVER_ERROR, "collector unavailable\n").into_response()
}

/// `/metrics`, in the format the client's `Accept` header prefers ([`Format::negotiate`]).
async fn metrics_handler(State(app): State<App>, headers: HeaderMap) -> Response {
    let accept = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(",");
    let format = Format::negotiate((!accept.is_empty()).then_some(accept.as_str()));
    match with_fresh(&app, move |c| c.render(format)).await {
        Some(text) => (
            [
                (header::CONTENT_TYPE, format.content_type()),
                (header::VARY, "Accept"),
            ],
            text,
        )
            .into_response(),
        None => unavailable(),
    }
}

async fn healthz(State(app): State<App>) -> Response {
    if app.any_attached {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "no probe attached\n").into_response()
    }
}

async fn index() -> Html<&'static str> {
    Html(status::PAGE)
}

/// Runs `f` on the collector in a blocking thread after a poll that started after this request
/// arrived: a scrape always reflects everything that happened before it. Concurrent requests
/// share one poll (they queue on the lock and find it already done).
async fn with_fresh<T: Send + 'static>(
    app: &App,
    f: impl FnOnce(&mut Collector) -> T + Send + 'static,
) -> Option<T> {
    let collector = app.collector.clone();
    let arrived = Instant::now();
    tokio::task::spawn_blocking(move || {
        let mut c = crate::collector::lock(&collector);
        if c.last_poll_started().is_none_or(|t| t < arrived) {
            c.poll();
        }
        Some(f(&mut c))
    })
    .await
    .ok()
    .flatten()
}

async fn findings_handler(State(app): State<App>) -> Response {
    match with_fresh(&app, |c| c.report()).await {
        Some(r) => axum::Json(r).into_response(),
        None => unavailable(),
    }
}

async fn status_handler(State(app): State<App>) -> Response {
    let probes = app.probes.clone();
    match with_fresh(&app, move |c| status::document(c, &probes)).await {
        Some(v) => axum::Json(v).into_response(),
        None => unavailable(),
    }
}
