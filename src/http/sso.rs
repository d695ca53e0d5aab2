//! Sign-in routes (`/v1/auth/…`): the identity providers a user may sign in with, the device
//! login run through the gateway, the token endpoint that finishes it and refreshes it
//! (RFC 6749 §5, RFC 8628 §3.4: JSON or form bodies, OAuth error answers, `no-store`),
//! revocation (RFC 7009), and the caller's sign-in sessions.
//!
//! The first four need no credential: they are how a credential is had. Their calls to a
//! provider are bounded by [`crate::sso::Sso`]; every other answer is a store read at most.

use axum::extract::{FromRequest, Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Form, Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{AppState, Caller};
use crate::error::{ApiError, ErrorCode};
use crate::sso::{OAuthError, Sso};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/auth/providers", get(providers))
        .route("/v1/auth/device", post(device))
        .route("/v1/auth/token", post(token))
        .route("/v1/auth/revoke", post(revoke))
        .route("/v1/auth/sessions", get(sessions))
        .route("/v1/auth/sessions/{id}", delete(end_session))
}

/// The fields the public sign-in routes read, from a JSON or a form body.
#[derive(Debug, Default, Deserialize)]
struct Fields {
    grant_type: Option<String>,
    device_code: Option<String>,
    refresh_token: Option<String>,
    token: Option<String>,
    issuer: Option<String>,
}

async fn fields(req: Request) -> Result<Fields, OAuthError> {
    let json = (req.headers().get(header::CONTENT_TYPE))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let bad = |e: String| OAuthError::invalid_request(format!("unreadable body: {e}"));
    match json {
        true => Json::<Fields>::from_request(req, &())
            .await
            .map(|Json(f)| f)
            .map_err(|e| bad(e.body_text())),
        false => Form::<Fields>::from_request(req, &())
            .await
            .map(|Form(f)| f)
            .map_err(|e| bad(e.body_text())),
    }
}

/// An OAuth answer: never cached (RFC 6749 §5.1).
fn oauth(result: Result<Value, OAuthError>) -> Response {
    let (status, body) = match result {
        Ok(v) => (StatusCode::OK, v),
        Err(e) => (
            StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST),
            e.body(),
        ),
    };
    let mut resp = (status, Json(body)).into_response();
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
    resp
}

fn sso(app: &AppState) -> Result<&Sso, OAuthError> {
    app.sso
        .as_deref()
        .ok_or_else(|| OAuthError::invalid_request("this gateway offers no sign-in"))
}

/// `GET /v1/auth/providers`: the providers a user may sign in with, and how.
async fn providers(State(app): State<AppState>) -> Json<Value> {
    let cfg = app.engine.config();
    let data: Vec<Value> = (cfg.jwt.iter())
        .filter(|_| app.sso.is_some())
        .filter_map(|i| {
            let (remote, s) = i.sign_in()?;
            let endpoints = remote
                .current(crate::auth::jwt_now())
                .map(|k| k.endpoints.clone());
            let has =
                |f: fn(&crate::auth::oidc::Endpoints) -> bool| endpoints.as_ref().is_some_and(f);
            Some(json!({
                "issuer": i.issuer,
                "client_id": s.client_id,
                "device_flow": has(|e| e.device_authorization_endpoint.is_some()),
                "token_ttl_seconds": s.token_ttl.as_secs(),
            }))
        })
        .collect();
    Json(json!({"object": "list", "data": data}))
}

/// `POST /v1/auth/device`: starts a device login (`issuer`: which provider, when several).
async fn device(State(app): State<AppState>, req: Request) -> Response {
    oauth(
        async {
            let f = fields(req).await?;
            sso(&app)?
                .device_start(&app.engine.config(), f.issuer.as_deref())
                .await
        }
        .await,
    )
}

/// `POST /v1/auth/token`: `grant_type` `urn:ietf:params:oauth:grant-type:device_code` (with
/// `device_code`, and `issuer` when several) or `refresh_token` (with `refresh_token`).
async fn token(State(app): State<AppState>, req: Request) -> Response {
    oauth(
        async {
            let f = fields(req).await?;
            let sso = sso(&app)?;
            let cfg = app.engine.config();
            let missing = |k: &str| OAuthError::invalid_request(format!("`{k}` is required"));
            let issued = match f.grant_type.as_deref() {
                Some("urn:ietf:params:oauth:grant-type:device_code") => {
                    let code = f
                        .device_code
                        .as_deref()
                        .ok_or_else(|| missing("device_code"))?;
                    sso.device_token(&cfg, f.issuer.as_deref(), code).await?
                }
                Some("refresh_token") => {
                    let r = f
                        .refresh_token
                        .as_deref()
                        .ok_or_else(|| missing("refresh_token"))?;
                    sso.refresh(&cfg, r).await?
                }
                Some(other) => {
                    return Err(OAuthError::unsupported(format!(
                        "grant_type `{other}` is not supported"
                    )))
                }
                None => return Err(missing("grant_type")),
            };
            Ok(issued.body())
        }
        .await,
    )
}

/// `POST /v1/auth/revoke`: ends the sign-in of a refresh token (`token`); 200 whether or not
/// the token was known (RFC 7009 §2.2).
async fn revoke(State(app): State<AppState>, req: Request) -> Response {
    oauth(
        async {
            let f = fields(req).await?;
            let token = f.token.or(f.refresh_token);
            let token = token.ok_or_else(|| OAuthError::invalid_request("`token` is required"))?;
            sso(&app)?.revoke_refresh(&token).await?;
            Ok(json!({}))
        }
        .await,
    )
}

fn session_json(s: &crate::store::SessionRow) -> Value {
    json!({
        "object": "sign_in_session",
        "id": s.id,
        "issuer": s.issuer,
        "subject": s.subject,
        "groups": s.groups,
        "created_at": s.created_at,
        "refreshed_at": s.refreshed_at,
        "expires_at": s.expires_at,
    })
}

fn unavailable(e: crate::store::StoreError) -> ApiError {
    tracing::error!(error = %e, "sign-in sessions unavailable");
    ApiError::new(
        ErrorCode::StoreUnavailable,
        "The session store is unavailable.",
    )
}

fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "No such sign-in session.")
}

/// `GET /v1/auth/sessions`: the caller's live sign-ins (an approver's: everyone's).
async fn sessions(State(app): State<AppState>, caller: Caller) -> Result<Json<Value>, ApiError> {
    let Some(sso) = app.sso.as_deref() else {
        return Ok(Json(json!({"object": "list", "data": []})));
    };
    let cfg = app.engine.config();
    let rows = sso
        .sessions(&cfg, &caller.principal)
        .await
        .map_err(unavailable)?;
    let data: Vec<Value> = rows.iter().map(session_json).collect();
    Ok(Json(json!({"object": "list", "data": data})))
}

/// `DELETE /v1/auth/sessions/{id}`: signs a session out, its tokens refused on every replica
/// within a few seconds. Another principal's session is unknown (404), unless the caller
/// approves.
async fn end_session(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let sso = app.sso.as_deref().ok_or_else(not_found)?;
    let who = &caller.principal;
    let row = sso.session(&id).await.map_err(unavailable)?;
    let cfg = app.engine.config();
    let mine = |s: &crate::store::SessionRow| {
        crate::auth::subject_of(&cfg, &who.id) == Some((s.issuer.as_str(), s.subject.as_str()))
    };
    let row = row
        .filter(|s| s.live(crate::auth::jwt_now()) && (who.approver || mine(s)))
        .ok_or_else(not_found)?;
    sso.revoke(&row.id, crate::auth::jwt_now())
        .await
        .map_err(unavailable)?;
    tracing::info!(session = %row.id, by = %who.id, "sign-in session ended");
    Ok(Json(
        json!({"object": "sign_in_session.deleted", "id": row.id, "deleted": true}),
    ))
}
