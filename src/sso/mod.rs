//! Single sign-on for harnesses: a user signs in with the company's identity provider by the
//! device flow (RFC 8628), run by the gateway as the provider's client; the gateway keeps a
//! session and answers with its own short-lived access token and a refresh token.
//!
//! - A **session** ([`crate::store::SessionRow`]) holds the provider's subject and groups and,
//!   sealed, the provider's refresh token. The gateway's refresh token (`tsr-`, 256 CSPRNG
//!   bits) is stored only as its digest.
//! - A **refresh** asks the provider again (its refresh token), so a user the provider has
//!   disabled gets no new token, and new groups apply; when the groups changed, the session's
//!   generation is raised and its older access tokens stop verifying.
//! - An **access token** ([`tokens`]) lives `token_ttl_seconds`, and verifies on every replica
//!   while its session is live at its generation.
//!
//! `client.rs` is the other side: `turnstile login` and `turnstile token`.

pub mod client;
pub mod console;
mod provider;
pub mod tokens;

use std::collections::HashMap;

use chacha20poly1305::aead::{Aead, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use rand::RngCore;
use serde_json::{json, Value};

use self::tokens::{Claims, Signer, Status, GATEWAY_ISSUER};
use crate::auth::jwt::JwtIssuer;
use crate::auth::oidc::{Remote, SignIn};
use crate::auth::{sha256, Principal};
use crate::config::Config;
use crate::engine::Engine;
use crate::store::{SessionRow, Store, StoreError};

/// Outbound requests to identity providers at once, across all callers of the public
/// sign-in routes (which need no credential).
const MAX_PROVIDER_CALLS: usize = 16;

/// An OAuth error answer (RFC 6749 §5.2, RFC 8628 §3.5): `error`, a description, a status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuthError {
    pub status: u16,
    pub error: String,
    pub description: String,
}

impl OAuthError {
    fn new(status: u16, error: &str, description: impl Into<String>) -> OAuthError {
        OAuthError {
            status,
            error: error.into(),
            description: description.into(),
        }
    }

    pub fn invalid_request(d: impl Into<String>) -> OAuthError {
        Self::new(400, "invalid_request", d)
    }

    pub fn invalid_grant(d: impl Into<String>) -> OAuthError {
        Self::new(400, "invalid_grant", d)
    }

    pub fn unavailable(d: impl Into<String>) -> OAuthError {
        Self::new(503, "temporarily_unavailable", d)
    }

    pub fn unsupported(d: impl Into<String>) -> OAuthError {
        Self::new(400, "unsupported_grant_type", d)
    }

    /// The provider's own error, passed on when it is one a client acts on; anything else
    /// is the provider failing (503).
    fn from_provider(status: u16, v: &Value) -> OAuthError {
        let error = v.get("error").and_then(Value::as_str).unwrap_or_default();
        match error {
            "authorization_pending"
            | "slow_down"
            | "expired_token"
            | "access_denied"
            | "invalid_grant" => {
                Self::new(400, error, format!("the identity provider said {error}"))
            }
            _ => {
                tracing::warn!(status, error, "the identity provider refused a request");
                Self::unavailable("the identity provider refused the request")
            }
        }
    }

    pub fn body(&self) -> Value {
        json!({"error": self.error, "error_description": self.description})
    }
}

fn store_failed(e: StoreError) -> OAuthError {
    tracing::error!(error = %e, "sign-in store unavailable");
    OAuthError::unavailable("the gateway could not record the sign-in")
}

/// What a sign-in or a refresh gives the client.
#[derive(Debug, Clone)]
pub struct Issued {
    pub access_token: String,
    pub expires_in: u64,
    /// On a sign-in only: a refresh keeps the refresh token.
    pub refresh_token: Option<String>,
}

impl Issued {
    /// RFC 6749 §5.1.
    pub fn body(&self) -> Value {
        let mut v = json!({
            "access_token": self.access_token,
            "token_type": "Bearer",
            "expires_in": self.expires_in,
        });
        if let Some(r) = &self.refresh_token {
            v["refresh_token"] = json!(r);
        }
        v
    }
}

/// Sign-in sessions and the gateway's access tokens: the store's signing key, the session
/// states each replica trusts for a few seconds, and the bound on calls to providers.
pub struct Sso {
    engine: Engine,
    signer: Signer,
    /// Seals the providers' refresh tokens in the store (derived from the signing key).
    seal: ChaCha20Poly1305,
    /// Signs the console sign-in's state cookie (derived from the signing key).
    mac_key: [u8; 32],
    /// Console sessions by their cookie's digest, as last read (trusted a few seconds).
    consoles: parking_lot::Mutex<HashMap<[u8; 32], (SessionRow, tokio::time::Instant)>>,
    calls: tokio::sync::Semaphore,
}

impl Sso {
    /// Reads the signing key from the store, writing a fresh one if none is there yet.
    pub async fn load(engine: Engine) -> Result<Sso, StoreError> {
        let mut fresh = [0u8; 32];
        rand::rng().fill_bytes(&mut fresh);
        let secret = (engine.store())
            .sso_key(&fresh, crate::auth::jwt_now())
            .await?;
        let mut material = b"turnstile provider refresh tokens\0".to_vec();
        material.extend_from_slice(&secret);
        let mut mac = b"turnstile console sign-in state\0".to_vec();
        mac.extend_from_slice(&secret);
        Ok(Sso {
            engine,
            signer: Signer::new(&secret).ok_or(StoreError::Missing("sso_keys"))?,
            seal: ChaCha20Poly1305::new(Key::from_slice(&sha256(&material))),
            mac_key: sha256(&mac),
            consoles: Default::default(),
            calls: tokio::sync::Semaphore::new(MAX_PROVIDER_CALLS),
        })
    }

    /// The principal of one of the gateway's own credentials ([`is_own`]): a console
    /// session's cookie value, or an access token.
    pub async fn credential(&self, cfg: &Config, token: &str) -> Option<Principal> {
        match token.starts_with(console::PREFIX) {
            true => self.console_principal(cfg, token).await,
            false => self.principal(cfg, token).await,
        }
    }

    /// [`Sso::credential`] from the session states kept within the last seconds alone.
    pub fn credential_now(&self, cfg: &Config, token: &str) -> Option<Principal> {
        match token.starts_with(console::PREFIX) {
            true => self.console_principal_now(cfg, token),
            false => self.principal_now(cfg, token),
        }
    }

    /// The principal of a gateway access token, under `cfg`: None when the token does not
    /// verify, its provider is no longer configured for sign-in, or its session is revoked,
    /// ended or at another generation. The session's state is read from the store when the
    /// kept one is older than [`tokens::STATUS_TTL`].
    pub async fn principal(&self, cfg: &Config, token: &str) -> Option<Principal> {
        let c = self.signer.verify(token)?;
        let status = match self.signer.cached(&c.sid) {
            Some(s) => s,
            None => {
                let s = match self.store().sso_session(&c.sid).await {
                    Ok(row) => row.as_ref().map_or(Status::GONE, Status::of),
                    // Fail closed: a token is only as good as its session.
                    Err(e) => {
                        tracing::error!(error = %e, "could not read a sign-in session");
                        return None;
                    }
                };
                self.signer.remember(&c.sid, s);
                s
            }
        };
        admitted(cfg, c, status)
    }

    /// [`Sso::principal`] from the session states kept within [`tokens::STATUS_TTL`] alone
    /// (never waits; a token whose state is not kept is refused).
    pub fn principal_now(&self, cfg: &Config, token: &str) -> Option<Principal> {
        let c = self.signer.verify(token)?;
        let status = self.signer.cached(&c.sid)?;
        admitted(cfg, c, status)
    }

    /// Starts a device login with provider `issuer` (the only one, when None).
    pub async fn device_start(
        &self,
        cfg: &Config,
        issuer: Option<&str>,
    ) -> Result<Value, OAuthError> {
        let (i, remote, s) = provider(cfg, issuer)?;
        let _call = self.call()?;
        let mut v = provider::device_authorization(remote, s).await?;
        v["issuer"] = json!(i.issuer);
        Ok(v)
    }

    /// Polls a device login; once the user approved it, the sign-in.
    pub async fn device_token(
        &self,
        cfg: &Config,
        issuer: Option<&str>,
        device_code: &str,
    ) -> Result<Issued, OAuthError> {
        let (i, remote, s) = provider(cfg, issuer)?;
        let tokens = {
            let _call = self.call()?;
            let grant = [
                ("grant_type", "urn:ietf:params:oauth:grant-type:device_code"),
                ("device_code", device_code),
            ];
            provider::token(remote, s, &grant).await?
        };
        let id_token = tokens
            .id_token
            .ok_or_else(|| OAuthError::unavailable("the identity provider gave no ID token"))?;
        let v = verify_id_token(cfg, i, &id_token)?;
        let (refresh, digest) = refresh_token();
        let refresh_idp = tokens.refresh_token.as_deref();
        let row = self.start_session(i, s, v, refresh_idp, &digest).await?;
        tracing::info!(session = %row.id, issuer = %row.issuer, "signed in by the device flow");
        let mut issued = self.issue(&row, s, row.created_at);
        issued.refresh_token = Some(refresh);
        Ok(issued)
    }

    /// Records a new sign-in of the subject `v` names, its credential's digest `digest`.
    async fn start_session(
        &self,
        i: &JwtIssuer,
        s: &SignIn,
        v: crate::auth::jwt::Verified,
        idp_refresh: Option<&str>,
        digest: &[u8; 32],
    ) -> Result<SessionRow, OAuthError> {
        let now = crate::auth::jwt_now();
        let row = SessionRow {
            id: crate::ids::new_id("ses-"),
            issuer: i.issuer.clone(),
            subject: v.subject,
            groups: v.groups.to_vec(),
            idp_refresh: idp_refresh.map(|t| self.sealed(t)),
            generation: 0,
            created_at: now,
            refreshed_at: now,
            expires_at: now + s.session_ttl.as_secs(),
            revoked_at: None,
        };
        self.store()
            .sso_session_create(&row, digest)
            .await
            .map_err(store_failed)?;
        Ok(row)
    }

    /// A new access token for the session of `refresh`, after asking the provider again.
    pub async fn refresh(&self, cfg: &Config, refresh: &str) -> Result<Issued, OAuthError> {
        let gone =
            || OAuthError::invalid_grant("the sign-in is revoked or ended; run `turnstile login`");
        let now = crate::auth::jwt_now();
        let row = (self
            .store()
            .sso_session_by_refresh(&sha256(refresh.as_bytes()))
            .await)
            .map_err(store_failed)?
            .filter(|r| r.live(now))
            .ok_or_else(gone)?;
        let Ok((_, _, s)) = provider(cfg, Some(&row.issuer)) else {
            return Err(gone());
        };
        let row = self.renewed(cfg, &row, now).await?.ok_or_else(gone)?;
        Ok(self.issue(&row, s, now))
    }

    /// Session `row` after asking its provider again (its sealed refresh token): None when
    /// the provider or the gateway ended it meanwhile, or the provider is no longer
    /// configured for sign-in.
    async fn renewed(
        &self,
        cfg: &Config,
        row: &SessionRow,
        now: u64,
    ) -> Result<Option<SessionRow>, OAuthError> {
        let Ok((i, remote, s)) = provider(cfg, Some(&row.issuer)) else {
            return Ok(None);
        };
        let (groups, idp_refresh) = match row.idp_refresh.as_deref().and_then(|b| self.opened(b)) {
            Some(idp) => {
                let tokens = {
                    let _call = self.call()?;
                    let grant = [
                        ("grant_type", "refresh_token"),
                        ("refresh_token", idp.as_str()),
                    ];
                    match provider::token(remote, s, &grant).await {
                        Ok(t) => t,
                        Err(e) if e.error == "invalid_grant" => {
                            // The provider ended it (a disabled user, a revoked grant).
                            let _ = self.revoke(&row.id, now).await;
                            tracing::info!(session = %row.id, "the identity provider ended a sign-in");
                            return Ok(None);
                        }
                        Err(e) => return Err(e),
                    }
                };
                let groups = match &tokens.id_token {
                    Some(t) => {
                        let v = verify_id_token(cfg, i, t)?;
                        if v.subject != row.subject {
                            return Err(OAuthError::invalid_grant(
                                "the identity provider named another subject",
                            ));
                        }
                        v.groups.to_vec()
                    }
                    // No new ID token: the groups stay as they were.
                    None => row.groups.clone(),
                };
                (groups, tokens.refresh_token.map(|t| self.sealed(&t)))
            }
            // The provider gave no refresh token: the session lasts as it is.
            None => (row.groups.clone(), None),
        };
        let row = (self.store())
            .sso_session_refreshed(&row.id, &groups, idp_refresh.as_deref(), now)
            .await
            .map_err(store_failed)?;
        if let Some(r) = &row {
            self.signer.remember(&r.id, Status::of(r));
        }
        self.consoles.lock().clear();
        Ok(row)
    }

    /// The principal of a console session's cookie value: its session live (read from the
    /// store at most every [`tokens::STATUS_TTL`]), renewed with the provider once per
    /// `token_ttl_seconds`.
    pub async fn console_principal(&self, cfg: &Config, cookie: &str) -> Option<Principal> {
        let now = crate::auth::jwt_now();
        let digest = sha256(cookie.as_bytes());
        let row = match self.console_cached(&digest) {
            Some(row) => row,
            None => {
                let row = match self.store().sso_session_by_refresh(&digest).await {
                    Ok(row) => row?,
                    Err(e) => {
                        tracing::error!(error = %e, "could not read a console session");
                        return None;
                    }
                };
                let (_, _, s) = provider(cfg, Some(&row.issuer)).ok()?;
                let row = match row.live(now) && now >= row.refreshed_at + s.token_ttl.as_secs() {
                    true => self.renewed(cfg, &row, now).await.ok()??,
                    false => row,
                };
                let mut map = self.consoles.lock();
                if map.len() >= 10_000 {
                    map.clear();
                }
                map.insert(digest, (row.clone(), tokio::time::Instant::now()));
                row
            }
        };
        console_admitted(cfg, &row, now)
    }

    /// [`Sso::console_principal`] from the sessions read within the last seconds alone.
    pub fn console_principal_now(&self, cfg: &Config, cookie: &str) -> Option<Principal> {
        let row = self.console_cached(&sha256(cookie.as_bytes()))?;
        console_admitted(cfg, &row, crate::auth::jwt_now())
    }

    fn console_cached(&self, digest: &[u8; 32]) -> Option<SessionRow> {
        let map = self.consoles.lock();
        let (row, at) = map.get(digest)?;
        (at.elapsed() < tokens::STATUS_TTL).then(|| row.clone())
    }

    /// Ends the session of a refresh token (RFC 7009: unknown tokens are not an error).
    pub async fn revoke_refresh(&self, refresh: &str) -> Result<(), OAuthError> {
        let now = crate::auth::jwt_now();
        if let Some(row) = (self
            .store()
            .sso_session_by_refresh(&sha256(refresh.as_bytes()))
            .await)
            .map_err(store_failed)?
        {
            self.revoke(&row.id, now).await.map_err(store_failed)?;
        }
        Ok(())
    }

    /// Signs out the console session whose cookie has this digest (nothing when unknown).
    pub async fn end_console(&self, digest: &[u8; 32]) -> Result<(), StoreError> {
        if let Some(row) = self.store().sso_session_by_refresh(digest).await? {
            self.revoke(&row.id, crate::auth::jwt_now()).await?;
        }
        Ok(())
    }

    pub async fn revoke(&self, id: &str, now: u64) -> Result<bool, StoreError> {
        let done = self.store().sso_session_revoke(id, now).await?;
        self.signer.remember(id, Status::GONE);
        self.consoles.lock().retain(|_, (row, _)| row.id != id);
        Ok(done)
    }

    /// The live sessions `who` may see: its own (its provider subject's), or everyone's for
    /// an approver.
    pub async fn sessions(
        &self,
        cfg: &Config,
        who: &Principal,
    ) -> Result<Vec<SessionRow>, StoreError> {
        let now = crate::auth::jwt_now();
        match who.approver {
            true => self.store().sso_sessions(None, now).await,
            false => match crate::auth::subject_of(cfg, &who.id) {
                Some((i, s)) => self.store().sso_sessions(Some((i, s)), now).await,
                None => Ok(Vec::new()),
            },
        }
    }

    pub async fn session(&self, id: &str) -> Result<Option<SessionRow>, StoreError> {
        self.store().sso_session(id).await
    }

    fn store(&self) -> &Store {
        self.engine.store()
    }

    fn issue(&self, row: &SessionRow, s: &SignIn, now: u64) -> Issued {
        let ttl = s.token_ttl.as_secs();
        let claims = Claims {
            iss: GATEWAY_ISSUER.into(),
            aud: GATEWAY_ISSUER.into(),
            sub: row.subject.clone(),
            idp: row.issuer.clone(),
            groups: row.groups.clone(),
            sid: row.id.clone(),
            gen: row.generation,
            iat: now,
            exp: (now + ttl).min(row.expires_at),
        };
        Issued {
            access_token: self.signer.sign(&claims),
            expires_in: claims.exp - now,
            refresh_token: None,
        }
    }

    fn call(&self) -> Result<tokio::sync::SemaphorePermit<'_>, OAuthError> {
        self.calls.try_acquire().map_err(|_| {
            OAuthError::new(429, "slow_down", "too many sign-ins at once; retry shortly")
        })
    }

    fn sealed(&self, plain: &str) -> Vec<u8> {
        let mut nonce = [0u8; 12];
        rand::rng().fill_bytes(&mut nonce);
        let mut out = nonce.to_vec();
        // Cannot fail for a message this small.
        out.extend(
            self.seal
                .encrypt(Nonce::from_slice(&nonce), plain.as_bytes())
                .unwrap_or_default(),
        );
        out
    }

    fn opened(&self, sealed: &[u8]) -> Option<String> {
        let (nonce, body) = sealed.split_at_checked(12)?;
        let plain = self.seal.decrypt(Nonce::from_slice(nonce), body).ok()?;
        String::from_utf8(plain).ok()
    }
}

/// The principal of a console session `row`, while it is live.
fn console_admitted(cfg: &Config, row: &SessionRow, now: u64) -> Option<Principal> {
    let issuer = sign_in_issuer(cfg, &row.issuer)?;
    if !row.live(now) {
        return None;
    }
    let groups = row.groups.clone().into();
    Some(crate::auth::subject_principal(
        cfg,
        &issuer.issuer,
        &row.subject,
        groups,
    ))
}

/// The principal of verified claims `c` whose session is in state `status`.
fn admitted(cfg: &Config, c: Claims, status: Status) -> Option<Principal> {
    let issuer = sign_in_issuer(cfg, &c.idp)?;
    if !status.admits(&c, crate::auth::jwt_now()) {
        return None;
    }
    let groups = c.groups.into();
    Some(crate::auth::subject_principal(
        cfg,
        &issuer.issuer,
        &c.sub,
        groups,
    ))
}

/// Whether a bearer value is one of the gateway's own credentials (a console session's cookie
/// value, or shaped like its access token): cheap, and says nothing about its validity.
pub fn is_own(token: &str) -> bool {
    token.starts_with(console::PREFIX) || tokens::is_gateway_token(token)
}

/// A fresh refresh token and its digest.
fn refresh_token() -> (String, [u8; 32]) {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let token = format!("tsr-{}", hex::encode(bytes));
    let digest = sha256(token.as_bytes());
    (token, digest)
}

/// The configured provider `issuer` that users may sign in through.
fn sign_in_issuer<'c>(cfg: &'c Config, issuer: &str) -> Option<&'c JwtIssuer> {
    cfg.jwt
        .iter()
        .find(|i| i.issuer == issuer && i.sign_in().is_some())
        .map(|i| &**i)
}

/// The provider to sign in with: `issuer`, or the only one configured for sign-in.
fn provider<'c>(
    cfg: &'c Config,
    issuer: Option<&str>,
) -> Result<(&'c JwtIssuer, &'c Remote, &'c SignIn), OAuthError> {
    let mut all = cfg.jwt.iter().filter(|i| i.sign_in().is_some());
    let i = match issuer {
        Some(iss) => all.find(|i| i.issuer == iss),
        None => match (all.next(), all.next()) {
            (Some(one), None) => Some(one),
            (Some(_), Some(_)) => {
                return Err(OAuthError::invalid_request(
                    "several identity providers: name `issuer`",
                ))
            }
            _ => None,
        },
    }
    .ok_or_else(|| OAuthError::invalid_request("no identity provider to sign in with"))?;
    let (remote, s) = i.sign_in().expect("filtered on sign-in");
    Ok((i, remote, s))
}

/// An ID token of provider `i` for the gateway, verified as a bearer token of `i` would be.
fn verify_id_token(
    cfg: &Config,
    i: &JwtIssuer,
    token: &str,
) -> Result<crate::auth::jwt::Verified, OAuthError> {
    let v = crate::auth::jwt::verify(&cfg.jwt, token).map_err(|e| {
        tracing::warn!(issuer = %i.issuer, reason = %e, "an ID token from the identity provider did not verify");
        OAuthError::invalid_grant("the identity provider's ID token did not verify")
    })?;
    if v.issuer.issuer != i.issuer {
        return Err(OAuthError::invalid_grant(
            "the ID token is another provider's",
        ));
    }
    Ok(v)
}
