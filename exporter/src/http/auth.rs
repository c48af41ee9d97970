//! Basic auth (bcrypt hashes from `--web.config.file`) and the configured response headers,
//! as an axum middleware. `/healthz` is never behind auth (probes of orchestrators).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::web_config::WebConfig;

/// Basic-auth state shared by requests.
#[derive(Clone)]
pub struct Auth {
    users: Arc<BTreeMap<String, String>>,
    /// Successful (user → password) checks, so bcrypt runs once per credential.
    ok: Arc<Mutex<HashMap<String, String>>>,
    headers: Arc<Vec<(HeaderName, HeaderValue)>>,
}

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
        }
    }

    fn check(&self, req: &Request) -> bool {
        if self.users.is_empty() {
            return true;
        }
        let Some(v) = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
        else {
            return false;
        };
        let Some(b64) = v.strip_prefix("Basic ") else {
            return false;
        };
        let Ok(decoded) = BASE64.decode(b64.trim()) else {
            return false;
        };
        let Ok(text) = String::from_utf8(decoded) else {
            return false;
        };
        let Some((user, pass)) = text.split_once(':') else {
            return false;
        };
        let Some(hash) = self.users.get(user) else {
            // Spend bcrypt time anyway so unknown users are not distinguishable by timing.
            let _ = bcrypt::verify(
                pass,
                "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DSmV5I.GNyXbXCbVmEXyK",
            );
            return false;
        };
        if let Ok(cache) = self.ok.lock()
            && cache
                .get(user)
                .is_some_and(|p| constant_eq(p.as_bytes(), pass.as_bytes()))
        {
            return true;
        }
        let good = bcrypt::verify(pass, hash).unwrap_or(false);
        if good && let Ok(mut cache) = self.ok.lock() {
            cache.insert(user.to_string(), pass.to_string());
        }
        good
    }
}

fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// axum middleware: basic auth (401 + `WWW-Authenticate`) and configured headers.
pub async fn middleware(State(auth): State<Auth>, req: Request, next: Next) -> Response {
    let mut resp = if req.uri().path() == "/healthz" || auth.check(&req) {
        next.run(req).await
    } else {
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Basic realm=\"bufscope\"")],
            "Unauthorized\n",
        )
            .into_response()
    };
    for (k, v) in auth.headers.iter() {
        resp.headers_mut().insert(k.clone(), v.clone());
    }
    resp
}
