//! OpenID providers found by discovery (`[[auth.oidc]]`): the signing keys of an issuer are
//! fetched from its `jwks_uri` (named by `{issuer}/.well-known/openid-configuration`), kept,
//! refreshed every `refresh_seconds`, fetched again at once when a token names a key they do
//! not have (at most once per [`MIN_REFETCH`], so forged `kid`s cannot make the gateway hammer
//! the provider), and used while the provider is down for at most `max_key_age_seconds`
//! after the last good fetch; then nothing of that issuer verifies (fail closed).
//!
//! What is fetched, and how: HTTPS only, the platform's roots plus `ca_file`, no redirects,
//! no proxy variables, [`FETCH_TIMEOUT`] per request, bodies of at most [`MAX_BODY`]. The
//! discovery document must name the configured issuer exactly (OpenID Connect Discovery
//! §4.3). Keys of another family or algorithm than the issuer's `algorithms` are skipped.
//!
//! A [`Remote`] is made by the config and holds the keys; a reload carries them over to the
//! new config's entry of the same issuer ([`Remote::adopt`]). The refresher ([`refresh`]) is
//! one task per issuer, started by the engine, that ends when its entry is gone.

use std::sync::{Arc, Weak};
use std::time::Duration;

use jsonwebtoken::Algorithm;
use parking_lot::RwLock;
use serde::Deserialize;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use tokio_util::task::TaskTracker;

use super::jwt::{usable_jwks, JwkKey, JwtIssuer, Keys};

/// The shortest time between two fetches asked by unknown `kid`s (the scheduled refreshes
/// are not counted: a key rotated just after one is still picked up at its first use).
pub const MIN_REFETCH: Duration = Duration::from_secs(10);
/// One request's bound.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest discovery document or JWKS read.
pub const MAX_BODY: usize = 1 << 20;
/// The first retry after a failed refresh; doubled each time, up to the refresh interval.
const FIRST_RETRY: Duration = Duration::from_secs(5);

/// Keys fetched at one time (Unix seconds), with the endpoints discovery named.
pub struct Snapshot {
    pub keys: Vec<JwkKey>,
    pub fetched_at: u64,
    pub endpoints: Endpoints,
}

/// The provider's endpoints that sign-in uses, as its discovery document names them.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Endpoints {
    pub token_endpoint: Option<String>,
    pub device_authorization_endpoint: Option<String>,
    pub authorization_endpoint: Option<String>,
    pub end_session_endpoint: Option<String>,
}

/// The gateway as the provider's OAuth client (`client_id`, …): users sign in through it,
/// and get the gateway's own short-lived tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignIn {
    pub client_id: String,
    /// The variable holding the client secret; None for a public client.
    pub client_secret_env: Option<String>,
    pub scopes: Vec<String>,
    /// The lifetime of a gateway access token.
    pub token_ttl: Duration,
    /// How long a sign-in lasts before the user signs in again.
    pub session_ttl: Duration,
}

impl SignIn {
    /// The client secret from the environment (`turnstile check` says when it is unset).
    pub fn secret(&self) -> Option<String> {
        std::env::var(self.client_secret_env.as_deref()?).ok()
    }
}

/// One provider's keys and how to fetch them.
pub struct Remote {
    pub issuer: String,
    pub algorithms: Vec<Algorithm>,
    /// PEM certificates added to the platform's roots.
    pub ca_pem: Option<Vec<u8>>,
    pub refresh: Duration,
    pub max_key_age: Duration,
    /// Sign-in through this provider, when the gateway is its client.
    pub sign_in: Option<SignIn>,
    keys: RwLock<Option<Arc<Snapshot>>>,
    /// Held while fetching (one fetch at a time); with the time of the last fetch that an
    /// unknown `kid` asked for (Unix seconds), which the rate limit counts.
    fetching: Mutex<Option<u64>>,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("issuer", &self.issuer)
            .finish()
    }
}

/// Why keys could not be fetched (logged; never shown to a client).
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{0}")]
    Http(String),
    #[error("{what} answered {status}")]
    Status { what: &'static str, status: u16 },
    #[error("discovery document: {0}")]
    Discovery(String),
    #[error("JWKS: {0}")]
    Jwks(String),
}

#[derive(Deserialize)]
struct Discovery {
    issuer: String,
    jwks_uri: String,
    #[serde(flatten)]
    endpoints: Endpoints,
}

impl Remote {
    pub fn new(
        issuer: String,
        algorithms: Vec<Algorithm>,
        ca_pem: Option<Vec<u8>>,
        refresh: Duration,
        max_key_age: Duration,
        sign_in: Option<SignIn>,
    ) -> Remote {
        Remote {
            issuer,
            algorithms,
            ca_pem,
            refresh,
            max_key_age,
            sign_in,
            keys: RwLock::new(None),
            fetching: Mutex::new(None),
        }
    }

    /// The keys, if fetched within `max_key_age` of `now` (Unix seconds).
    pub fn current(&self, now: u64) -> Option<Arc<Snapshot>> {
        let s = self.keys.read().clone()?;
        (now.saturating_sub(s.fetched_at) <= self.max_key_age.as_secs()).then_some(s)
    }

    /// Takes over the keys of the previous config's entry of the same issuer (a reload).
    pub fn adopt(&self, old: &Remote) {
        if old.issuer == self.issuer && self.keys.read().is_none() {
            *self.keys.write() = old.keys.read().clone();
        }
    }

    /// The kept keys; when there are none yet (a start still fetching, a provider that was
    /// down), after waiting for the fetch under way or running one (rate-limited as
    /// [`Remote::refetch`]).
    pub async fn current_or_fetch(&self, now: u64) -> Option<Arc<Snapshot>> {
        if let Some(s) = self.current(now) {
            return Some(s);
        }
        {
            // The refresher holds this while it fetches: wait for it.
            let _one = self.fetching.lock().await;
            if let Some(s) = self.current(now) {
                return Some(s);
            }
        }
        self.refetch(now).await;
        self.current(now)
    }

    /// Fetches the keys now unless an unknown `kid` asked for a fetch less than
    /// [`MIN_REFETCH`] ago. Concurrent callers wait for one fetch. Returns whether one ran.
    pub async fn refetch(&self, now: u64) -> bool {
        let mut last = self.fetching.lock().await;
        if last.is_some_and(|at| now.saturating_sub(at) < MIN_REFETCH.as_secs()) {
            return false;
        }
        *last = Some(now);
        if let Err(e) = self.fetch(now).await {
            tracing::warn!(issuer = %self.issuer, error = %e, "could not fetch the provider's keys");
        }
        true
    }

    /// One fetch of discovery and JWKS; the keys replace the kept ones.
    async fn fetch(&self, now: u64) -> Result<usize, FetchError> {
        let client = self.client()?;
        let url = format!(
            "{}/.well-known/openid-configuration",
            self.issuer.trim_end_matches('/')
        );
        let doc: Discovery = serde_json::from_slice(&get(&client, &url, "discovery").await?)
            .map_err(|e| FetchError::Discovery(e.to_string()))?;
        if doc.issuer != self.issuer {
            return Err(FetchError::Discovery(format!(
                "names issuer `{}`, not the configured one",
                doc.issuer
            )));
        }
        if !doc.jwks_uri.starts_with("https://") {
            return Err(FetchError::Discovery("jwks_uri is not https".into()));
        }
        let jwks = get(&client, &doc.jwks_uri, "jwks_uri").await?;
        let keys = usable_jwks(&jwks, &self.algorithms).map_err(FetchError::Jwks)?;
        let n = keys.len();
        *self.keys.write() = Some(Arc::new(Snapshot {
            keys,
            fetched_at: now,
            endpoints: doc.endpoints,
        }));
        tracing::info!(issuer = %self.issuer, keys = n, "fetched the provider's signing keys");
        Ok(n)
    }

    /// An HTTPS client for this provider (its `ca_file` added; no redirects, no proxy).
    pub fn client(&self) -> Result<reqwest::Client, FetchError> {
        let mut b = reqwest::Client::builder()
            .https_only(true)
            .timeout(FETCH_TIMEOUT)
            .connect_timeout(FETCH_TIMEOUT)
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none());
        if let Some(pem) = &self.ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| FetchError::Http(format!("ca_file: {e}")))?;
            for cert in certs {
                b = b.add_root_certificate(cert);
            }
        }
        b.build().map_err(|e| FetchError::Http(e.to_string()))
    }
}

/// A GET of at most [`MAX_BODY`] bytes.
async fn get(
    client: &reqwest::Client,
    url: &str,
    what: &'static str,
) -> Result<Vec<u8>, FetchError> {
    let resp = client
        .get(url)
        .header("accept", "application/json")
        .send()
        .await
        .map_err(|e| FetchError::Http(format!("{what}: {}", e.without_url())))?;
    if !resp.status().is_success() {
        return Err(FetchError::Status {
            what,
            status: resp.status().as_u16(),
        });
    }
    read_body(resp, what).await
}

/// A form POST to the provider as its client (HTTP Basic with `client`'s id and secret
/// when it has one, RFC 6749 §2.3.1): the status and body, whatever the status.
pub async fn post_form(
    client: &reqwest::Client,
    url: &str,
    what: &'static str,
    credentials: (&str, Option<&str>),
    form: &[(&str, &str)],
) -> Result<(u16, Vec<u8>), FetchError> {
    let mut fields = form.to_vec();
    let mut req = client.post(url).header("accept", "application/json");
    match credentials {
        (id, Some(secret)) => req = req.basic_auth(form_encode(id), Some(form_encode(secret))),
        (id, None) => fields.push(("client_id", id)),
    }
    let resp = req
        .form(&fields)
        .send()
        .await
        .map_err(|e| FetchError::Http(format!("{what}: {}", e.without_url())))?;
    let status = resp.status().as_u16();
    Ok((status, read_body(resp, what).await?))
}

/// RFC 6749 §2.3.1: the client id and secret are form-encoded before Basic encoding
/// (`application/x-www-form-urlencoded`; by hand: four lines, where no direct dependency
/// offers it).
fn form_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'*' | b'-' | b'.' | b'_' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

async fn read_body(mut resp: reqwest::Response, what: &'static str) -> Result<Vec<u8>, FetchError> {
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| FetchError::Http(format!("{what}: {}", e.without_url())))?
    {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(FetchError::Http(format!(
                "{what}: larger than {MAX_BODY} bytes"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Keeps `remote`'s keys fresh: a fetch at once, then every `refresh`; after a failure,
/// again in 5 s, 10 s, … up to `refresh`. Ends at `shutdown` or when the config that made
/// `remote` is gone (a reload dropped or replaced the issuer).
pub async fn refresh(remote: Weak<Remote>, now: impl Fn() -> u64, shutdown: CancellationToken) {
    let mut retry = FIRST_RETRY;
    // Keys a reload carried over are fetched again when they are due, not at once.
    let fresh = remote.upgrade().and_then(|r| {
        let age = now().saturating_sub(r.keys.read().as_ref()?.fetched_at);
        r.refresh.checked_sub(Duration::from_secs(age))
    });
    if let Some(wait) = fresh {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.cancelled() => return,
        }
    }
    loop {
        let Some(r) = remote.upgrade() else { return };
        let wait = {
            let _one = r.fetching.lock().await;
            match r.fetch(now()).await {
                Ok(_) => {
                    retry = FIRST_RETRY;
                    r.refresh
                }
                Err(e) => {
                    tracing::warn!(issuer = %r.issuer, error = %e, "could not refresh the provider's keys; the kept ones stay in use until they are too old");
                    let wait = retry.min(r.refresh);
                    retry = (retry * 2).min(r.refresh);
                    wait
                }
            }
        };
        drop(r);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Starts a refresher for each OpenID provider among `issuers` (a config's), after it takes
/// over the keys kept by the entry of the same issuer among `old` (the config it replaces).
pub fn keep_fresh(
    issuers: &[Arc<JwtIssuer>],
    old: &[Arc<JwtIssuer>],
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
) {
    let remote = |i: &Arc<JwtIssuer>| match &i.keys {
        Keys::Remote(r) => Some(r.clone()),
        _ => None,
    };
    for r in issuers.iter().filter_map(remote) {
        if let Some(prev) = old.iter().filter_map(remote).find(|p| p.issuer == r.issuer) {
            r.adopt(&prev);
        }
        let (weak, shutdown) = (Arc::downgrade(&r), shutdown.clone());
        tracker.spawn(refresh(weak, super::jwt_now, shutdown));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote() -> Remote {
        // Nothing listens on the discard port: every fetch fails at once.
        Remote::new(
            "https://127.0.0.1:9".into(),
            vec![Algorithm::ES256],
            None,
            Duration::from_secs(60),
            Duration::from_secs(120),
            None,
        )
    }

    #[tokio::test]
    async fn unknown_kids_fetch_at_most_once_per_interval() {
        let r = remote();
        assert!(r.refetch(1_000).await);
        assert!(!r.refetch(1_009).await, "within MIN_REFETCH");
        assert!(r.refetch(1_010).await);
        assert!(r.current(1_010).is_none(), "a failed fetch keeps nothing");
    }

    #[test]
    fn kept_keys_age_out_and_a_reload_takes_them_over() {
        let old = remote();
        *old.keys.write() = Some(Arc::new(Snapshot {
            keys: Vec::new(),
            fetched_at: 1_000,
            endpoints: Endpoints::default(),
        }));
        assert!(old.current(1_120).is_some());
        assert!(old.current(1_121).is_none(), "older than max_key_age");
        let new = remote();
        new.adopt(&old);
        assert_eq!(new.current(1_100).map(|s| s.fetched_at), Some(1_000));
    }
}
