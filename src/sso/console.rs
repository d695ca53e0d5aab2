//! Console sign-in through a provider: the OpenID Connect authorization code flow with PKCE
//! (S256), a `state` and a `nonce`, ending in a sign-in session whose credential is an
//! `HttpOnly`, `SameSite=Strict` cookie (`Secure` unless the console is reached on loopback).
//!
//! - The flow's own state travels in a short-lived cookie signed by the gateway (HMAC), so a
//!   callback may reach any replica.
//! - The session cookie (`tcs-` and 256 CSPRNG bits) is stored only as its digest. It counts
//!   as a credential only beside the header `x-turnstile-csrf` carrying the token derived from
//!   it (which the page reads from `GET /console/sso/session`): a cross-site page can make a
//!   browser send the cookie, never the header.
//! - A console session is refreshed with the provider once per `token_ttl_seconds`, when it is
//!   used: a user the provider disabled is signed out, and new groups apply.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use super::{provider, OAuthError, Sso};
use crate::auth::sha256;
use crate::config::Config;

/// The session cookie's name, with and without `Secure` (`__Host-` needs it).
pub const COOKIE_SECURE: &str = "__Host-turnstile-console";
pub const COOKIE_LOOPBACK: &str = "turnstile-console";
/// The flow's state cookie.
pub const LOGIN_COOKIE: &str = "turnstile-login";
/// The header a cookie credential needs beside it.
pub const CSRF_HEADER: &str = "x-turnstile-csrf";
/// How long a started sign-in may take at the provider.
const LOGIN_SECONDS: u64 = 600;
/// A console session's credential prefix.
pub const PREFIX: &str = "tcs-";

/// What the flow keeps between the redirect to the provider and the callback.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct Pending {
    pub state: String,
    pub verifier: String,
    pub nonce: String,
    pub issuer: String,
    pub expires: u64,
}

fn random_b64(n: usize) -> String {
    let mut bytes = vec![0u8; n];
    rand::rng().fill_bytes(&mut bytes);
    B64.encode(bytes)
}

/// The CSRF token of a cookie credential.
pub fn csrf_of(cookie: &str) -> String {
    let mut material = b"turnstile console csrf\0".to_vec();
    material.extend_from_slice(cookie.as_bytes());
    hex::encode(sha256(&material))
}

impl Sso {
    fn mac(&self, data: &[u8]) -> Vec<u8> {
        // Cannot fail: HMAC takes a key of any length.
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.mac_key).expect("an HMAC key");
        mac.update(data);
        mac.finalize().into_bytes().to_vec()
    }

    /// Starts a console sign-in with provider `issuer`: where to send the browser, and the
    /// signed state cookie's value.
    pub async fn console_start(
        &self,
        cfg: &Config,
        issuer: Option<&str>,
        redirect_uri: &str,
    ) -> Result<(String, String), OAuthError> {
        let (i, remote, s) = super::provider(cfg, issuer)?;
        let url = provider::endpoint(
            remote,
            |e| e.authorization_endpoint.clone(),
            "authorization endpoint",
        )
        .await?;
        let p = Pending {
            state: random_b64(24),
            verifier: random_b64(32),
            nonce: random_b64(24),
            issuer: i.issuer.clone(),
            expires: crate::auth::jwt_now() + LOGIN_SECONDS,
        };
        let challenge = B64.encode(sha256(p.verifier.as_bytes()));
        let mut to = reqwest::Url::parse(&url).map_err(|_| {
            OAuthError::unavailable("the provider's authorization endpoint is not a URL")
        })?;
        to.query_pairs_mut()
            .append_pair("response_type", "code")
            .append_pair("client_id", &s.client_id)
            .append_pair("redirect_uri", redirect_uri)
            .append_pair("scope", &s.scopes.join(" "))
            .append_pair("state", &p.state)
            .append_pair("nonce", &p.nonce)
            .append_pair("code_challenge", &challenge)
            .append_pair("code_challenge_method", "S256");
        let body = B64.encode(serde_json::to_vec(&p).unwrap_or_default());
        let sig = B64.encode(self.mac(body.as_bytes()));
        Ok((to.to_string(), format!("{body}.{sig}")))
    }

    /// The flow's state from its cookie, if the gateway signed it and it is not expired.
    pub fn pending(&self, cookie: &str) -> Option<Pending> {
        let (body, sig) = cookie.split_once('.')?;
        let sig = B64.decode(sig).ok()?;
        let want = self.mac(body.as_bytes());
        if !bool::from(subtle::ConstantTimeEq::ct_eq(&sig[..], &want[..])) {
            return None;
        }
        let p: Pending = serde_json::from_slice(&B64.decode(body).ok()?).ok()?;
        (crate::auth::jwt_now() < p.expires).then_some(p)
    }

    /// Finishes a console sign-in: the code exchanged (with the PKCE verifier), the ID token
    /// verified (its `nonce` the flow's), a session started. The session cookie's value.
    pub async fn console_finish(
        &self,
        cfg: &Config,
        p: &Pending,
        code: &str,
        redirect_uri: &str,
    ) -> Result<String, OAuthError> {
        let (i, remote, s) = super::provider(cfg, Some(&p.issuer))?;
        let tokens = {
            let _call = self.call()?;
            let grant = [
                ("grant_type", "authorization_code"),
                ("code", code),
                ("redirect_uri", redirect_uri),
                ("code_verifier", p.verifier.as_str()),
            ];
            provider::token(remote, s, &grant).await?
        };
        let id_token = tokens
            .id_token
            .ok_or_else(|| OAuthError::unavailable("the identity provider gave no ID token"))?;
        let v = super::verify_id_token(cfg, i, &id_token)?;
        if v.nonce.as_deref() != Some(p.nonce.as_str()) {
            return Err(OAuthError::invalid_grant(
                "the ID token's nonce is not this sign-in's",
            ));
        }
        let cookie = format!("{PREFIX}{}", hex::encode(rand::random::<[u8; 32]>()));
        let row = self
            .start_session(
                i,
                s,
                v,
                tokens.refresh_token.as_deref(),
                &sha256(cookie.as_bytes()),
            )
            .await?;
        tracing::info!(session = %row.id, issuer = %row.issuer, "console signed in");
        Ok(cookie)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_csrf_token_is_bound_to_its_cookie() {
        assert_eq!(csrf_of("tcs-a"), csrf_of("tcs-a"));
        assert_ne!(csrf_of("tcs-a"), csrf_of("tcs-b"));
        assert_eq!(csrf_of("tcs-a").len(), 64);
    }
}
