//! The console's sign-in through a provider (`/console/sso/…`, see [`crate::sso::console`]):
//! the providers and whether a pasted key is offered, the redirect to the provider, its
//! callback (which sets the session cookie), the session's CSRF token, and sign-out.

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::caller::{cookie, session_cookie};
use super::AppState;
use crate::sso::console::{csrf_of, COOKIE_LOOPBACK, COOKIE_SECURE, CSRF_HEADER, LOGIN_COOKIE};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/console/sso/providers", get(providers))
        .route("/console/sso/start", get(start))
        .route("/console/sso/callback", get(callback))
        .route("/console/sso/session", get(session))
        .route("/console/sso/logout", post(logout))
}

/// The console's origin as the browser reaches it, and whether its cookies are `Secure`:
/// `server.public_url` when set, else the `Host` on loopback (plain HTTP), else HTTPS.
fn origin(app: &AppState, headers: &HeaderMap) -> (String, bool) {
    if let Some(url) = &app.engine.config().server.public_url {
        return (
            url.trim_end_matches('/').to_string(),
            url.starts_with("https://"),
        );
    }
    let host = (headers.get(header::HOST))
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1");
    let name = host.rsplit_once(':').map_or(host, |(h, _)| h);
    let loopback = name == "localhost"
        || name == "[::1]"
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|a| a.is_loopback());
    match loopback {
        true => (format!("http://{host}"), false),
        false => (format!("https://{host}"), true),
    }
}

fn set_cookie(
    name: &str,
    value: &str,
    path: &str,
    same_site: &str,
    max_age: u64,
    secure: bool,
) -> HeaderValue {
    let secure = if secure { "; Secure" } else { "" };
    let text = format!(
        "{name}={value}; Path={path}; HttpOnly; SameSite={same_site}; Max-Age={max_age}{secure}"
    );
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

fn session_cookie_name(secure: bool) -> &'static str {
    if secure {
        COOKIE_SECURE
    } else {
        COOKIE_LOOPBACK
    }
}

/// A plain page saying why a sign-in failed (no script: it is reached by navigation).
fn failed(status: StatusCode, why: &str) -> Response {
    let text = format!("Sign-in failed: {why}.\n\nReturn to the console: /console/\n");
    let mut resp = (status, text).into_response();
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

fn redirect(to: &str) -> Response {
    let mut resp = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// `GET /console/sso/providers`: how the console may sign in.
async fn providers(State(app): State<AppState>) -> Json<Value> {
    let cfg = app.engine.config();
    let providers: Vec<Value> = (cfg.jwt.iter())
        .filter(|i| app.sso.is_some() && i.sign_in().is_some())
        .map(|i| json!({"issuer": i.issuer}))
        .collect();
    Json(json!({"api_key_sign_in": cfg.console_api_key_sign_in, "providers": providers}))
}

#[derive(Deserialize)]
struct StartQuery {
    issuer: Option<String>,
}

/// `GET /console/sso/start?issuer=…`: to the provider's login, the flow's state in a cookie.
async fn start(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<StartQuery>,
) -> Response {
    let Some(sso) = app.sso.as_deref() else {
        return failed(StatusCode::NOT_FOUND, "this gateway offers no sign-in");
    };
    let (base, secure) = origin(&app, &headers);
    let redirect_uri = format!("{base}/console/sso/callback");
    let cfg = app.engine.config();
    match sso
        .console_start(&cfg, q.issuer.as_deref(), &redirect_uri)
        .await
    {
        Ok((to, state)) => {
            let mut resp = redirect(&to);
            let c = set_cookie(LOGIN_COOKIE, &state, "/console/sso/", "Lax", 600, secure);
            resp.headers_mut().append(header::SET_COOKIE, c);
            resp
        }
        Err(e) => failed(
            StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST),
            &e.description,
        ),
    }
}

#[derive(Deserialize)]
struct Callback {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
}

/// `GET /console/sso/callback`: the provider's answer; on success the session cookie is set
/// and the browser goes back to the console.
async fn callback(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<Callback>,
) -> Response {
    let Some(sso) = app.sso.as_deref() else {
        return failed(StatusCode::NOT_FOUND, "this gateway offers no sign-in");
    };
    if let Some(e) = &q.error {
        let e: String = e
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
            .take(64)
            .collect();
        return failed(
            StatusCode::BAD_REQUEST,
            &format!("the identity provider said {e}"),
        );
    }
    let pending = cookie(&headers, LOGIN_COOKIE).and_then(|c| sso.pending(c));
    let (Some(p), Some(code), Some(state)) = (pending, q.code, q.state) else {
        return failed(
            StatusCode::BAD_REQUEST,
            "this sign-in was not started here, or took too long",
        );
    };
    if !bool::from(subtle::ConstantTimeEq::ct_eq(
        p.state.as_bytes(),
        state.as_bytes(),
    )) {
        return failed(StatusCode::BAD_REQUEST, "the answer is not this sign-in's");
    }
    let (base, secure) = origin(&app, &headers);
    let redirect_uri = format!("{base}/console/sso/callback");
    let cfg = app.engine.config();
    match sso.console_finish(&cfg, &p, &code, &redirect_uri).await {
        Ok(value) => {
            let ttl = (cfg.jwt.iter())
                .find(|i| i.issuer == p.issuer)
                .and_then(|i| Some(i.sign_in()?.1.session_ttl.as_secs()))
                .unwrap_or(0);
            let mut resp = redirect("/console/");
            let h = resp.headers_mut();
            h.append(
                header::SET_COOKIE,
                set_cookie(
                    session_cookie_name(secure),
                    &value,
                    "/",
                    "Strict",
                    ttl,
                    secure,
                ),
            );
            h.append(
                header::SET_COOKIE,
                set_cookie(LOGIN_COOKIE, "", "/console/sso/", "Lax", 0, secure),
            );
            resp
        }
        Err(e) => failed(
            StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST),
            &e.description,
        ),
    }
}

/// `GET /console/sso/session`: the signed-in principal of the cookie, and the CSRF token the
/// page sends with every request. 401 without a live session.
async fn session(State(app): State<AppState>, headers: HeaderMap) -> Response {
    let unauthenticated = || crate::error::ApiError::unauthenticated().into_response();
    let (Some(sso), Some(c)) = (app.sso.as_deref(), session_cookie(&headers)) else {
        return unauthenticated();
    };
    let cfg = app.engine.config();
    let Some(who) = sso.console_principal(&cfg, c).await else {
        return unauthenticated();
    };
    let mut resp = Json(json!({"object": "console_session", "id": who.id, "approver": who.approver, "csrf": csrf_of(c)})).into_response();
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// `POST /console/sso/logout` (with the CSRF header): the session revoked everywhere, the
/// cookie cleared. 401 without a live session.
async fn logout(State(app): State<AppState>, headers: HeaderMap) -> Response {
    let unauthenticated = || crate::error::ApiError::unauthenticated().into_response();
    let (Some(sso), Some(c)) = (app.sso.as_deref(), session_cookie(&headers)) else {
        return unauthenticated();
    };
    let csrf = headers
        .get(CSRF_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !bool::from(subtle::ConstantTimeEq::ct_eq(
        csrf.as_bytes(),
        csrf_of(c).as_bytes(),
    )) {
        return unauthenticated();
    }
    let digest = crate::auth::sha256(c.as_bytes());
    match sso.end_console(&digest).await {
        Ok(()) => {}
        Err(e) => {
            tracing::error!(error = %e, "could not end a console session");
            return crate::error::ApiError::new(
                crate::error::ErrorCode::StoreUnavailable,
                "The session store is unavailable.",
            )
            .into_response();
        }
    }
    let (_, secure) = origin(&app, &headers);
    let mut resp = Json(json!({"signed_out": true})).into_response();
    resp.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(session_cookie_name(secure), "", "/", "Strict", 0, secure),
    );
    resp
}
