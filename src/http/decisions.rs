//! `/v1/decisions/{token}`: the single-use decision links of Slack-ready approvals.
//!
//! `GET` only shows a confirmation page (link previews and mail scanners follow links, so a
//! GET never decides). The page's button `POST`s to the same URL, which uses the link once
//! and decides through the approvals' own path (durable first, one winner), as the endpoint
//! `webhook:<id>`. A link that is unknown, used (its sibling too), expired, or whose approval
//! is settled shows why and changes nothing. The token is the only credential: the pages
//! carry no script, send no referrer and are never cached.

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Extension;

use super::cluster::{to_owner, Hop, Replay};
use crate::approvals::DecideError;
use crate::auth::Principal;
use crate::engine::{ApprovalRoute, Engine};
use crate::notify::links;
use crate::store::{now_unix, ApprovalRecord, LinkRow};

/// Why a link does nothing.
enum Refused {
    Unknown,
    Used,
    Expired,
    Settled(Box<ApprovalRecord>),
    Unavailable,
}

impl Refused {
    fn page(self) -> Response {
        let (status, title, text) = match self {
            Refused::Unknown => (StatusCode::NOT_FOUND, "Unknown link", "This decision link is not valid.".to_string()),
            Refused::Used => (StatusCode::GONE, "Link already used", "This approval's decision link was already used. Nothing was changed.".to_string()),
            Refused::Expired => (StatusCode::GONE, "Link expired", "This decision link has expired. Nothing was changed.".to_string()),
            Refused::Settled(r) => {
                let by = match (r.reason.as_deref(), r.decided_by.as_deref()) {
                    (Some("human"), Some(who)) => format!("by {who}"),
                    (reason, _) => format!("({})", reason.unwrap_or("settled")),
                };
                (StatusCode::CONFLICT, "Already decided", format!("This approval was already {} {by}. Nothing was changed.", r.state))
            }
            Refused::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "Try again", "The decision could not be recorded; nothing was decided. Try again, or decide in the console.".to_string()),
        };
        page(status, title, &format!("<p>{}</p>", escape(&text)))
    }
}

/// The link and its approval, if the link can still decide.
async fn usable(gw: &Engine, token: &str) -> Result<(LinkRow, ApprovalRecord), Refused> {
    let digest = links::digest(token).ok_or(Refused::Unknown)?;
    let store = gw.store();
    let link = match store.link_get(&digest).await {
        Ok(Some(l)) => l,
        Ok(None) => return Err(Refused::Unknown),
        Err(_) => return Err(Refused::Unavailable),
    };
    if link.used_at.is_some() {
        return Err(Refused::Used);
    }
    let record = match store.approval_get(&link.approval_id).await {
        Ok(Some(r)) => r,
        Ok(None) => return Err(Refused::Unknown),
        Err(_) => return Err(Refused::Unavailable),
    };
    if record.state != "pending" {
        return Err(Refused::Settled(Box::new(record)));
    }
    if link.expires_at <= now_unix() {
        return Err(Refused::Expired);
    }
    Ok((link, record))
}

pub async fn show(State(gw): State<Engine>, Path(token): Path<String>) -> Response {
    let (link, r) = match usable(&gw, &token).await {
        Ok(found) => found,
        Err(refused) => return refused.page(),
    };
    let verb = if link.decision == "approve" {
        "Approve"
    } else {
        "Deny"
    };
    let summary = serde_json::to_string_pretty(&r.summary).unwrap_or_default();
    let body = format!(
        "<p>{verb} this <b>{kind}</b> asked by <b>{client}</b> on <b>{model}</b>?</p>\
         <pre>{summary}</pre>\
         <p class=\"meta\">Approval {id} · execution {exe} · expires {expires}</p>\
         <form method=\"post\"><button class=\"{class}\" type=\"submit\">{verb}</button></form>",
        kind = escape(&r.kind),
        client = escape(&r.principal),
        model = escape(&r.model),
        summary = escape(&summary),
        id = escape(&r.id),
        exe = escape(&r.execution_id),
        expires = crate::managed::wire::rfc3339(r.expires_at * 1000),
        class = link.decision,
    );
    page(StatusCode::OK, &format!("{verb} {}?", r.kind), &body)
}

pub async fn decide(
    State(gw): State<Engine>,
    hop: Option<Extension<Hop>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Path(token): Path<String>,
) -> Response {
    let (link, record) = match usable(&gw, &token).await {
        Ok(found) => found,
        Err(refused) => return refused.page(),
    };
    // The backend request waits on another replica: the link is used there.
    if let (ApprovalRoute::Owner(owner), None) = (gw.approval_route(&record).await, hop) {
        let replay = Replay {
            method: &method,
            uri: &uri,
            headers: &headers,
            body: Default::default(),
        };
        match to_owner(&gw, "approval", owner, &replay).await {
            Ok(resp) => return resp,
            Err(crate::engine::EngineError::ReplicaUnavailable) => {
                return Refused::Unavailable.page()
            }
            // Gone: its approvals are orphaned, which the decision below reports.
            Err(_) => {}
        }
    }
    match gw.store().link_take(&link, now_unix()).await {
        Ok(true) => {}
        Ok(false) => return Refused::Used.page(),
        Err(_) => return Refused::Unavailable.page(),
    }
    let who = Principal::new(format!("webhook:{}", link.endpoint), true);
    let approve = link.decision == "approve";
    match gw
        .approvals()
        .decide(&link.approval_id, approve, None, &who)
        .await
    {
        Ok(r) => {
            tracing::info!(approval = %r.id, endpoint = %link.endpoint, state = %r.state, "approval decided by a decision link");
            let text = format!(
                "{} {} by {}. The agent goes on.",
                if approve { "Approved" } else { "Denied" },
                r.kind,
                who.id
            );
            page(
                StatusCode::OK,
                if approve { "Approved" } else { "Denied" },
                &format!("<p>{}</p>", escape(&text)),
            )
        }
        Err(DecideError::AlreadyDecided(r)) => Refused::Settled(r).page(),
        Err(DecideError::NotFound) => Refused::Unknown.page(),
        Err(DecideError::Store(_)) => Refused::Unavailable.page(),
    }
}

/// A whole page: no script, its own inline style only, no referrer, never cached or framed.
fn page(status: StatusCode, title: &str, body: &str) -> Response {
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <meta name=\"robots\" content=\"noindex\"><title>{t} · Turnstile</title><style>{STYLE}</style></head>\
         <body><main><h1>{t}</h1>{body}</main></body></html>",
        t = escape(title),
    );
    let headers = [
        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ];
    (status, headers, html).into_response()
}

const STYLE: &str = "body{font:16px system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1c1e21}\
main{max-width:40rem;margin:3rem auto;padding:1.5rem 2rem;background:#fff;border-radius:8px;\
box-shadow:0 1px 3px #0002}pre{background:#f0f1f3;padding:.75rem;overflow:auto;white-space:pre-wrap}\
.meta{color:#606770;font-size:.85rem}button{font-size:1rem;padding:.6rem 1.4rem;border:0;\
border-radius:6px;color:#fff;cursor:pointer}.approve{background:#1f7a3a}.deny{background:#b3261e}";

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}
