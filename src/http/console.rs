//! `GET /console`: the approver's and operator's console, a single page whose assets are
//! compiled into the binary (no CDN, no external font, works offline). Every response carries
//! a strict `Content-Security-Policy`: scripts, styles and connections from this origin only,
//! no inline script or style, no frames, no forms posting anywhere. The page itself is public
//! (it is the sign-in form); everything it shows comes from the authenticated API.

use axum::http::{header, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// The policy of every console response.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; \
frame-ancestors 'none'";

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const INDEX: &str = include_str!("console/index.html");

/// Every asset: its route, content type and bytes.
const ASSETS: &[(&str, &str, &str)] = &[
    ("/console", HTML, INDEX),
    ("/console/", HTML, INDEX),
    ("/console/app.js", JS, include_str!("console/app.js")),
    ("/console/api.js", JS, include_str!("console/api.js")),
    ("/console/dom.js", JS, include_str!("console/dom.js")),
    ("/console/queue.js", JS, include_str!("console/queue.js")),
    ("/console/views.js", JS, include_str!("console/views.js")),
    (
        "/console/notifications.js",
        JS,
        include_str!("console/notifications.js"),
    ),
    (
        "/console/app.css",
        "text/css; charset=utf-8",
        include_str!("console/app.css"),
    ),
    (
        "/console/icon.svg",
        "image/svg+xml",
        include_str!("console/icon.svg"),
    ),
];

pub fn routes() -> Router<super::AppState> {
    ASSETS
        .iter()
        .fold(Router::new(), |router, &(path, content_type, body)| {
            router.route(path, get(move || async move { asset(content_type, body) }))
        })
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
