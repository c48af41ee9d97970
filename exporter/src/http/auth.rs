//! Basic auth (bcrypt hashes from `--web.config.file`) and the configured response headers,
//! as an axum middleware. `/healthz` is never behind auth (probes of orchestrators).
//!
//! bcrypt is slow on purpose (tens of milliseconds of CPU per check), so password checks are
//! kept from starving the daemon whatever clients send: they run on tokio's blocking threads,
//! never on the async workers that serve `/healthz` and drain events, and their CPU time is
//! bounded by a [`Budget`] ([`BCRYPT_CPU_SHARE`] of one core on average): a check that would
//! exceed it is refused at once with 429. A credential that passed once is remembered
//! (compared in constant time, no bcrypt), so a scraper that authenticated keeps working
//! while others send wrong passwords.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::web_config::WebConfig;

/// The average share of one core bcrypt checks may use.
pub const BCRYPT_CPU_SHARE: f64 = 0.1;
/// The CPU time bcrypt may spend in a burst (after a quiet spell).
pub const BCRYPT_BURST: Duration = Duration::from_millis(500);

/// CPU time for bcrypt: refilled at [`BCRYPT_CPU_SHARE`] per second of wall time up to
/// [`BCRYPT_BURST`]; a check reserves the time the last one took and settles with what it
/// really took. No reservation possible: refused at once.
#[derive(Debug)]
pub struct Budget {
    /// Seconds of CPU available (negative after checks that took longer than reserved).
    available: f64,
    /// When `available` was last refilled.
    refilled: Instant,
    /// What a check costs, from the last one (seconds).
    estimate: f64,
}

impl Budget {
    /// A full budget at `now`.
    pub fn new(now: Instant) -> Self {
        Self {
            available: BCRYPT_BURST.as_secs_f64(),
            refilled: now,
            estimate: 0.05,
        }
    }

    /// Reserves the time of one check at `now` (None: over budget, refuse).
    pub fn reserve(&mut self, now: Instant) -> Option<f64> {
        let dt = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.refilled = now;
        self.available = (self.available + dt * BCRYPT_CPU_SHARE).min(BCRYPT_BURST.as_secs_f64());
        // A check costlier than the whole burst is admitted with a full budget (and paid
        // back after), never refused for good.
        if self.available < self.estimate.min(BCRYPT_BURST.as_secs_f64()) {
            return None;
        }
        self.available -= self.estimate;
        Some(self.estimate)
    }

    /// Settles a check that reserved `reserved` and took `took`.
    pub fn settle(&mut self, reserved: f64, took: Duration) {
        let took = took.as_secs_f64();
        self.available += reserved - took;
        self.estimate = took;
    }
}

/// What the middleware decides for a request.
enum Verdict {
    Pass,
    Denied,
    /// Over the bcrypt budget: refused without a check.
    Busy,
}

/// Basic-auth state shared by requests.
#[derive(Clone)]
pub struct Auth {
    users: Arc<BTreeMap<String, String>>,
    /// Successful (user → password) checks, so bcrypt runs once per credential.
    ok: Arc<Mutex<HashMap<String, String>>>,
    headers: Arc<Vec<(HeaderName, HeaderValue)>>,
    budget: Arc<Mutex<Budget>>,
}

/// A bcrypt hash for unknown users when none is configured (cannot happen: then everything
/// passes).
const DUMMY_HASH: &str = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DSmV5I.GNyXbXCbVmEXyK";

impl Auth {
    /// From the web config (no users: everything passes).
    pub fn new(c: &WebConfig) -> Self {
        let headers = c
            .http_server_config
            .as_ref()
            .map(|h| {
                h.headers
                    .iter()
                    .filter_map(|(k, v)| {
                        Some((
                            HeaderName::from_bytes(k.as_bytes()).ok()?,
                            HeaderValue::from_str(v).ok()?,
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default();
        Self {
            users: Arc::new(c.basic_auth_users.clone()),
            ok: Arc::default(),
            headers: Arc::new(headers),
            budget: Arc::new(Mutex::new(Budget::new(Instant::now()))),
        }
    }

    /// Checks the credentials of a request (None: it sent none).
    async fn check(&self, credentials: Option<(String, String)>) -> Verdict {
        if self.users.is_empty() {
            return Verdict::Pass;
        }
        let Some((user, pass)) = credentials else {
            return Verdict::Denied;
        };
        let hash = self.users.get(&user).cloned();
        // Unknown users cost a check against a configured hash (the same cost, whose result
        // is ignored), so they are not told apart from known ones by timing.
        let against = hash
            .clone()
            .or_else(|| self.users.values().next().cloned())
            .unwrap_or_else(|| DUMMY_HASH.to_string());
        if hash.is_some()
            && let Ok(cache) = self.ok.lock()
            && cache
                .get(&user)
                .is_some_and(|p| constant_eq(p.as_bytes(), pass.as_bytes()))
        {
            return Verdict::Pass;
        }
        let reserved = match self.budget.lock() {
            Ok(mut b) => b.reserve(Instant::now()),
            Err(_) => None,
        };
        let Some(reserved) = reserved else {
            return Verdict::Busy;
        };
        let checked = {
            let pass = pass.clone();
            let known = hash.is_some();
            tokio::task::spawn_blocking(move || {
                let start = Instant::now();
                let good = bcrypt::verify(&pass, &against).unwrap_or(false) && known;
                (good, start.elapsed())
            })
            .await
        };
        let Ok((good, took)) = checked else {
            return Verdict::Denied;
        };
        if let Ok(mut b) = self.budget.lock() {
            b.settle(reserved, took);
        }
        if good && let Ok(mut cache) = self.ok.lock() {
            cache.insert(user, pass);
        }
        if good { Verdict::Pass } else { Verdict::Denied }
    }
}

/// The user and password of a `Basic` `Authorization` header.
fn credentials(req: &Request) -> Option<(String, String)> {
    let v = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())?;
    let b64 = v.strip_prefix("Basic ")?;
    let decoded = BASE64.decode(b64.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, pass) = text.split_once(':')?;
    Some((user.to_string(), pass.to_string()))
}

fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// axum middleware: basic auth (401 + `WWW-Authenticate`; 429 + `Retry-After` over the bcrypt
/// budget) and configured headers.
pub async fn middleware(State(auth): State<Auth>, req: Request, next: Next) -> Response {
    let verdict = if req.uri().path() == "/healthz" {
        Verdict::Pass
    } else {
        auth.check(credentials(&req)).await
    };
    let mut resp = match verdict {
        Verdict::Pass => next.run(req).await,
        Verdict::Denied => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Basic realm=\"bufscope\"")],
            "Unauthorized\n",
        )
            .into_response(),
        Verdict::Busy => (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, "1")],
            "too many password checks: retry later\n",
        )
            .into_response(),
    };
    for (k, v) in auth.headers.iter() {
        resp.headers_mut().insert(k.clone(), v.clone());
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bcrypt_budget_bounds_cpu_time_whatever_is_asked() {
        let t0 = Instant::now();
        let mut b = Budget::new(t0);
        let cost = Duration::from_millis(80);
        // 1,000 checks asked for within one second: only the burst is spent.
        let mut spent = Duration::ZERO;
        for i in 0..1000u32 {
            let now = t0 + Duration::from_millis(u64::from(i));
            if let Some(r) = b.reserve(now) {
                b.settle(r, cost);
                spent += cost;
            }
        }
        assert!(
            spent <= BCRYPT_BURST + cost,
            "{spent:?} of bcrypt in the first second"
        );
        // Over 100 s of constant asking: at most the share of a core, plus the burst.
        let mut spent = Duration::ZERO;
        for i in 0..100_000u64 {
            let now = t0 + Duration::from_secs(1) + Duration::from_millis(i);
            if let Some(r) = b.reserve(now) {
                b.settle(r, cost);
                spent += cost;
            }
        }
        let cap = Duration::from_secs_f64(100.0 * BCRYPT_CPU_SHARE) + BCRYPT_BURST + cost;
        assert!(spent <= cap, "{spent:?} of bcrypt over 100 s (cap {cap:?})");
        assert!(
            spent >= Duration::from_secs_f64(100.0 * BCRYPT_CPU_SHARE) - cost * 2,
            "the budget is used, not starved: {spent:?}"
        );
    }

    #[test]
    fn a_check_that_took_longer_than_reserved_is_paid_back() {
        let t0 = Instant::now();
        let mut b = Budget::new(t0);
        let r = b.reserve(t0).unwrap_or_default();
        // Far longer than the estimate: the budget goes negative and refuses until refilled.
        b.settle(r, Duration::from_secs(2));
        assert!(b.reserve(t0 + Duration::from_secs(1)).is_none());
        assert!(b.reserve(t0 + Duration::from_secs(30)).is_some());
    }
}
