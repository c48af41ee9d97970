//! Basic auth (bcrypt hashes from `--web.config.file`) and the configured response headers,
//! as an axum middleware. `/healthz` is never behind auth (probes of orchestrators).
//!
//! bcrypt is slow on purpose (tens of milliseconds of CPU per check), so password checks are
//! kept from starving the daemon and from locking clients out, whatever clients send:
//!
//! - they run on tokio's blocking threads, never on the async workers that serve `/healthz`
//!   and drain events;
//! - their CPU time is bounded by [`Budgets`]: [`BCRYPT_CPU_SHARE`] of one core on average for
//!   all clients together, and a quarter of that ([`CLIENT_CPU_SHARE`]) for each client — a
//!   source address ([`Client`]) and user name — so one client's wrong passwords cost that
//!   client; a check over either is refused at once with 429;
//! - a client whose check failed recently ([`SUSPECT_FOR`]) may not take the last
//!   [`RESERVE`] of the common budget, which is kept for clients that have not failed: a
//!   Prometheus that never authenticated (after a restart) gets its check while another
//!   address sends wrong passwords;
//! - a credential that passed once is remembered (compared in constant time, no bcrypt), so a
//!   scraper that authenticated keeps working whatever the budget.
//!
//! The per-client state is bounded ([`MAX_CLIENTS`] clients, [`CLIENT_USERS`] user names each);
//! when full, a client whose state is as new (no debt, no failure) makes room first, then the
//! least recently seen client that failed, and only then one that did not.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

pub use super::clients::Client;
use super::web_config::WebConfig;

/// The average share of one core bcrypt checks may use, all clients together.
pub const BCRYPT_CPU_SHARE: f64 = 0.1;
/// The CPU time bcrypt may spend in a burst (after a quiet spell), all clients together.
pub const BCRYPT_BURST: Duration = Duration::from_millis(500);
/// The average share of one core one client's checks may use.
pub const CLIENT_CPU_SHARE: f64 = BCRYPT_CPU_SHARE / 4.0;
/// The CPU time one client's checks may spend in a burst.
pub const CLIENT_BURST: Duration = Duration::from_millis(200);
/// The part of [`BCRYPT_BURST`] a client whose check failed in the last [`SUSPECT_FOR`] may
/// not take.
pub const RESERVE: Duration = Duration::from_millis(250);
/// How long a failed check marks its client.
pub const SUSPECT_FOR: Duration = Duration::from_secs(60);
/// Most clients with password-check state.
pub const MAX_CLIENTS: usize = 4096;
/// Most user names with a budget of their own per client; further names share one.
pub const CLIENT_USERS: usize = 4;

/// A token bucket of CPU seconds.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    /// Seconds available (negative after checks that took longer than reserved).
    available: f64,
    refilled: Instant,
}

impl Bucket {
    fn full(burst: Duration, now: Instant) -> Self {
        Self {
            available: burst.as_secs_f64(),
            refilled: now,
        }
    }

    fn refill(&mut self, now: Instant, rate: f64, burst: Duration) {
        let dt = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.refilled = now;
        self.available = (self.available + dt * rate).min(burst.as_secs_f64());
    }

    fn is_full(&self, now: Instant, rate: f64, burst: Duration) -> bool {
        let dt = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.available + dt * rate >= burst.as_secs_f64()
    }
}

/// One client's state.
#[derive(Debug)]
struct ClientState {
    /// (user name, its bucket); the last of [`CLIENT_USERS`] is shared by further names.
    users: Vec<(String, Bucket)>,
    /// When a check of this client last failed.
    failed: Option<Instant>,
    seen: Instant,
}

impl ClientState {
    fn suspect(&self, now: Instant) -> bool {
        self.failed
            .is_some_and(|t| now.saturating_duration_since(t) < SUSPECT_FOR)
    }

    /// As a new client would be: nothing lost by forgetting it.
    fn as_new(&self, now: Instant) -> bool {
        !self.suspect(now)
            && self
                .users
                .iter()
                .all(|(_, b)| b.is_full(now, CLIENT_CPU_SHARE, CLIENT_BURST))
    }

    /// The bucket of `user` (a new one while there is room).
    fn bucket(&mut self, user: &str, now: Instant) -> &mut Bucket {
        let i = match self.users.iter().position(|(u, _)| u == user) {
            Some(i) => i,
            None if self.users.len() < CLIENT_USERS => {
                self.users
                    .push((user.to_string(), Bucket::full(CLIENT_BURST, now)));
                self.users.len() - 1
            }
            None => CLIENT_USERS - 1,
        };
        &mut self.users[i].1
    }
}

/// CPU time for bcrypt: a common bucket refilled at [`BCRYPT_CPU_SHARE`] per second of wall
/// time up to [`BCRYPT_BURST`], and one per client and user name at [`CLIENT_CPU_SHARE`] up to
/// [`CLIENT_BURST`]. A check reserves in both the time the last check took and settles with
/// the CPU time it really took. No reservation possible: refused at once.
#[derive(Debug)]
pub struct Budgets {
    global: Bucket,
    /// What a check costs, from the last one (seconds of CPU).
    estimate: f64,
    clients: HashMap<Client, ClientState>,
}

/// A reservation, settled with [`Budgets::settle`].
#[derive(Debug)]
pub struct Ticket {
    client: Client,
    user: String,
    reserved: f64,
}

impl Budgets {
    /// Full budgets at `now`.
    pub fn new(now: Instant) -> Self {
        Self {
            global: Bucket::full(BCRYPT_BURST, now),
            estimate: 0.05,
            clients: HashMap::new(),
        }
    }

    /// Reserves the time of one check of `user` by `client` at `now` (None: over budget,
    /// refuse).
    pub fn reserve(&mut self, client: Client, user: &str, now: Instant) -> Option<Ticket> {
        self.global.refill(now, BCRYPT_CPU_SHARE, BCRYPT_BURST);
        if !self.clients.contains_key(&client) && self.clients.len() >= MAX_CLIENTS {
            self.make_room(now);
        }
        let st = self.clients.entry(client).or_insert_with(|| ClientState {
            users: Vec::new(),
            failed: None,
            seen: now,
        });
        st.seen = now;
        let floor = if st.suspect(now) {
            RESERVE.as_secs_f64()
        } else {
            0.0
        };
        let b = st.bucket(user, now);
        b.refill(now, CLIENT_CPU_SHARE, CLIENT_BURST);
        // A check costlier than a whole burst is admitted with a full bucket (and paid back
        // after), never refused for good.
        let need_global = self.estimate.min(BCRYPT_BURST.as_secs_f64() - floor);
        let need_client = self.estimate.min(CLIENT_BURST.as_secs_f64());
        if self.global.available - floor < need_global || b.available < need_client {
            return None;
        }
        b.available -= self.estimate;
        self.global.available -= self.estimate;
        Some(Ticket {
            client,
            user: user.to_string(),
            reserved: self.estimate,
        })
    }

    /// Settles a check that took `took` of CPU; `failed`: its password was wrong (the client
    /// is marked for [`SUSPECT_FOR`]), else a passed check clears the mark.
    pub fn settle(&mut self, t: Ticket, took: Duration, failed: bool, now: Instant) {
        let took = took.as_secs_f64();
        self.global.available += t.reserved - took;
        self.estimate = took;
        if let Some(st) = self.clients.get_mut(&t.client) {
            st.bucket(&t.user, now).available += t.reserved - took;
            st.failed = failed.then_some(now);
        }
    }

    /// Forgets one client: one whose state is as new, else the least recently seen that
    /// failed, else the least recently seen.
    fn make_room(&mut self, now: Instant) {
        let victim = self
            .clients
            .iter()
            .find(|(_, s)| s.as_new(now))
            .or_else(|| {
                self.clients
                    .iter()
                    .filter(|(_, s)| s.suspect(now))
                    .min_by_key(|(_, s)| s.seen)
            })
            .or_else(|| self.clients.iter().min_by_key(|(_, s)| s.seen))
            .map(|(c, _)| *c);
        if let Some(c) = victim {
            self.clients.remove(&c);
        }
    }

    /// Clients with state.
    pub fn clients(&self) -> usize {
        self.clients.len()
    }
}

/// CPU time this thread has used.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out-pointer.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
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
    budgets: Arc<Mutex<Budgets>>,
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
            budgets: Arc::new(Mutex::new(Budgets::new(Instant::now()))),
        }
    }

    /// Checks the credentials of a request (None: it sent none) from `peer`.
    async fn check(&self, credentials: Option<(String, String)>, peer: IpAddr) -> Verdict {
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
        let client = Client::of(peer);
        let ticket = match self.budgets.lock() {
            Ok(mut b) => b.reserve(client, &user, Instant::now()),
            Err(_) => None,
        };
        let Some(ticket) = ticket else {
            return Verdict::Busy;
        };
        let checked = {
            let pass = pass.clone();
            let known = hash.is_some();
            tokio::task::spawn_blocking(move || {
                let start = thread_cpu();
                let good = bcrypt::verify(&pass, &against).unwrap_or(false) && known;
                (good, thread_cpu().saturating_sub(start))
            })
            .await
        };
        let Ok((good, took)) = checked else {
            return Verdict::Denied;
        };
        if let Ok(mut b) = self.budgets.lock() {
            b.settle(ticket, took, !good, Instant::now());
        }
        if good && let Ok(mut cache) = self.ok.lock() {
            cache.insert(user, pass);
        }
        if good { Verdict::Pass } else { Verdict::Denied }
    }
}

/// The source address of a request (as [`super::serve::serve`] records it); unspecified when
/// unknown (a router served some other way: one client for all).
fn peer(req: &Request) -> IpAddr {
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip())
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
        auth.check(credentials(&req), peer(&req)).await
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

    fn client(last: u8) -> Client {
        Client::of(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)))
    }

    /// Asks for a check of `user` by `c` at `now` taking `cost`, failing or not; true when
    /// it ran.
    fn ask(
        b: &mut Budgets,
        c: Client,
        user: &str,
        now: Instant,
        cost: Duration,
        fail: bool,
    ) -> bool {
        match b.reserve(c, user, now) {
            Some(t) => {
                b.settle(t, cost, fail, now);
                true
            }
            None => false,
        }
    }

    #[test]
    fn the_bcrypt_budget_bounds_cpu_time_whatever_is_asked() {
        let t0 = Instant::now();
        let mut b = Budgets::new(t0);
        let cost = Duration::from_millis(80);
        // 1,000 checks asked for within one second by 50 clients: only the burst is spent.
        let mut spent = Duration::ZERO;
        for i in 0..1000u32 {
            let now = t0 + Duration::from_millis(u64::from(i));
            if ask(&mut b, client((i % 50) as u8), "prom", now, cost, true) {
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
            if ask(
                &mut b,
                client((i % 50) as u8),
                "prom",
                now,
                cost,
                i % 7 == 0,
            ) {
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
    fn one_client_s_wrong_passwords_cost_that_client() {
        let t0 = Instant::now();
        let mut b = Budgets::new(t0);
        let cost = Duration::from_millis(50);
        let attacker = client(2);
        let mut attacker_ran = Duration::ZERO;
        // The attacker asks every millisecond for 60 s; scrapers that never authenticated
        // (each remembered once it passed) arrive at 30 s, 45 s and 59.999 s and must get
        // their check at their first try.
        let scrapers = [
            (30_000, client(1)),
            (45_000, client(3)),
            (59_999, client(4)),
        ];
        for ms in 0..60_000u64 {
            let now = t0 + Duration::from_millis(ms);
            if ask(&mut b, attacker, "prom", now, cost, true) {
                attacker_ran += cost;
            }
            for (at, scraper) in scrapers {
                if ms == at {
                    assert!(
                        ask(&mut b, scraper, "prom", now, cost, false),
                        "the scraper's check at {ms} ms was refused"
                    );
                }
            }
        }
        let cap = Duration::from_secs_f64(60.0 * CLIENT_CPU_SHARE) + CLIENT_BURST + cost;
        assert!(
            attacker_ran <= cap,
            "one client used {attacker_ran:?} (its share {cap:?})"
        );
    }

    #[test]
    fn many_failing_clients_leave_the_reserve_to_clients_that_did_not_fail() {
        let t0 = Instant::now();
        let mut b = Budgets::new(t0);
        let cost = Duration::from_millis(50);
        // 200 attacker addresses, each failing, asking in turn every millisecond.
        for ms in 0..20_000u64 {
            let now = t0 + Duration::from_millis(ms);
            ask(
                &mut b,
                Client::of(IpAddr::V4(Ipv4Addr::new(10, 1, (ms % 200) as u8, 1))),
                "x",
                now,
                cost,
                true,
            );
        }
        let now = t0 + Duration::from_millis(20_000);
        assert!(
            ask(&mut b, client(1), "prom", now, cost, false),
            "a client that never failed finds the reserve"
        );
    }

    #[test]
    fn client_state_is_bounded_and_new_clients_are_not_refused_for_room() {
        let t0 = Instant::now();
        let mut b = Budgets::new(t0);
        let cost = Duration::from_millis(1);
        for i in 0..(MAX_CLIENTS as u32 * 3) {
            let now = t0 + Duration::from_micros(u64::from(i) * 100);
            let ip = Ipv4Addr::from(0x0a00_0000 + i);
            // Many user names per address: bounded too.
            for u in 0..10 {
                ask(
                    &mut b,
                    Client::of(IpAddr::V4(ip)),
                    &format!("u{u}"),
                    now,
                    cost,
                    true,
                );
            }
        }
        assert!(b.clients() <= MAX_CLIENTS, "{}", b.clients());
        assert!(b.clients.values().all(|s| s.users.len() <= CLIENT_USERS));
        let later = t0 + Duration::from_secs(10);
        assert!(ask(&mut b, client(1), "prom", later, cost, false));
    }

    #[test]
    fn a_check_that_took_longer_than_reserved_is_paid_back() {
        let t0 = Instant::now();
        let mut b = Budgets::new(t0);
        let c = client(1);
        // Far longer than the estimate: the budgets go negative and refuse until refilled.
        assert!(ask(&mut b, c, "prom", t0, Duration::from_secs(2), false));
        assert!(b.reserve(c, "prom", t0 + Duration::from_secs(1)).is_none());
        assert!(
            b.reserve(c, "prom", t0 + Duration::from_secs(120))
                .is_some()
        );
    }
}
