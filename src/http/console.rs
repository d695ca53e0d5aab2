//! `GET /console`: the approver's and operator's console, a single page whose assets are
//! compiled into the binary (no CDN, no external font, works offline). Every response carries
//! a strict `Content-Security-Policy`: scripts, styles and connections from this origin only,
//! no inline script or style, no frames, no forms posting anywhere. The page itself is public
//! (it is the sign-in form); everything it shows comes from the authenticated API.

use axum::http::{header, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::Gateway;

/// The policy of every console response.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; \
frame-ancestors 'none'";

const INDEX: &str = include_str!("console/index.html");
const SCRIPT: &str = include_str!("console/app.js");
const STYLE: &str = include_str!("console/app.css");
const ICON: &str = include_str!("console/icon.svg");

pub fn routes() -> Router<Gateway> {
    Router::new()
        .route(
            "/console",
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/console/",
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/console/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/console/app.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
        .route(
            "/console/icon.svg",
            get(|| async { asset("image/svg+xml", ICON) }),
        )
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let headers = [
        (header::CONTENT_TYPE, content_type),
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
        // Served from memory: always revalidate, so an upgraded gateway serves its own page.
        (header::CACHE_CONTROL, "no-cache"),
    ];
    let mut resp = (headers, body).into_response();
    resp.headers_mut().insert(
        HeaderName::from_static("cross-origin-opener-policy"),
        HeaderValue::from_static("same-origin"),
    );
    resp
}
