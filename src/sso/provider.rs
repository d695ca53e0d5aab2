//! The gateway as an OpenID provider's OAuth client: the device authorization request
//! (RFC 8628 §3.1), and the token requests that finish a device login or refresh a sign-in
//! (RFC 6749 §5). The endpoints are the ones discovery named ([`Remote`] keeps them with the
//! keys); requests go the way the keys are fetched (HTTPS, `ca_file`, no redirects, no
//! proxy, bounded time and size).

use serde::Deserialize;
use serde_json::Value;

use super::OAuthError;
use crate::auth::oidc::{post_form, Remote, SignIn};

/// What a token request answered with success.
#[derive(Debug, Deserialize)]
pub struct Tokens {
    pub id_token: Option<String>,
    pub refresh_token: Option<String>,
}

/// The provider's endpoint `pick` names in its discovery document, when its keys are
/// fetched (else the provider is not reachable yet: 503 `temporarily_unavailable`).
pub(super) async fn endpoint(
    remote: &Remote,
    pick: impl Fn(&crate::auth::oidc::Endpoints) -> Option<String>,
    what: &str,
) -> Result<String, OAuthError> {
    let snapshot = (remote.current_or_fetch(crate::auth::jwt_now()).await)
        .ok_or_else(|| OAuthError::unavailable("the identity provider has not answered yet"))?;
    let url = pick(&snapshot.endpoints).ok_or_else(|| {
        OAuthError::unsupported(format!("the identity provider offers no {what}"))
    })?;
    if !url.starts_with("https://") {
        return Err(OAuthError::unavailable(format!(
            "the identity provider's {what} is not https"
        )));
    }
    Ok(url)
}

fn client(remote: &Remote) -> Result<reqwest::Client, OAuthError> {
    remote.client().map_err(|e| {
        tracing::warn!(issuer = %remote.issuer, error = %e, "no client for the identity provider");
        OAuthError::unavailable("the identity provider cannot be reached")
    })
}

/// Starts a device login: the provider's answer (`device_code`, `user_code`,
/// `verification_uri`, …) passed on as it is.
pub async fn device_authorization(remote: &Remote, s: &SignIn) -> Result<Value, OAuthError> {
    let url = endpoint(
        remote,
        |e| e.device_authorization_endpoint.clone(),
        "device authorization endpoint",
    )
    .await?;
    let scope = s.scopes.join(" ");
    let secret = s.secret();
    let (status, body) = post_form(
        &client(remote)?,
        &url,
        "device authorization",
        (&s.client_id, secret.as_deref()),
        &[("scope", &scope)],
    )
    .await
    .map_err(|e| unreachable(remote, e))?;
    let v: Value = serde_json::from_slice(&body)
        .map_err(|_| OAuthError::unavailable("the identity provider answered nonsense"))?;
    if status != 200 {
        return Err(OAuthError::from_provider(status, &v));
    }
    let field = |k: &str| v.get(k).and_then(Value::as_str).is_some();
    if !(field("device_code") && field("user_code") && field("verification_uri")) {
        return Err(OAuthError::unavailable(
            "the identity provider's device answer lacks a field",
        ));
    }
    Ok(v)
}

/// A token request of `grant` (the grant type's own fields): the provider's tokens, or its
/// OAuth error (`authorization_pending`, `slow_down`, `invalid_grant` …) passed on.
pub async fn token(
    remote: &Remote,
    s: &SignIn,
    grant: &[(&str, &str)],
) -> Result<Tokens, OAuthError> {
    let url = endpoint(remote, |e| e.token_endpoint.clone(), "token endpoint").await?;
    let secret = s.secret();
    let (status, body) = post_form(
        &client(remote)?,
        &url,
        "token",
        (&s.client_id, secret.as_deref()),
        grant,
    )
    .await
    .map_err(|e| unreachable(remote, e))?;
    if status == 200 {
        return serde_json::from_slice(&body)
            .map_err(|_| OAuthError::unavailable("the identity provider answered nonsense"));
    }
    let v: Value = serde_json::from_slice(&body).unwrap_or_default();
    Err(OAuthError::from_provider(status, &v))
}

fn unreachable(remote: &Remote, e: crate::auth::oidc::FetchError) -> OAuthError {
    tracing::warn!(issuer = %remote.issuer, error = %e, "the identity provider did not answer");
    OAuthError::unavailable("the identity provider did not answer")
}
