//! `GET /v1beta/models` (the caller's models in config order, `pageSize` 1 to 1000, default
//! 50; `nextPageToken` names the last model of the page, absent on the last page; a token for
//! a model the caller cannot see gives an empty page) and `GET /v1beta/models/{model}`.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use futures::future::BoxFuture;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::surface::{Answer, Host, Incoming, Route, Serve};

pub(super) fn routes() -> Vec<Route> {
    vec![
        Route {
            path: "/v1beta/models",
            serve: Serve::Get(models),
        },
        Route {
            path: "/v1beta/models/{call}",
            serve: Serve::Get(model_of),
        },
    ]
}

/// A model in Google's `Model` shape.
fn model(id: &str) -> Value {
    json!({
        "name": format!("models/{id}"),
        "baseModelId": id,
        "version": "turnstile",
        "displayName": id,
        "description": "A model served by this Turnstile gateway.",
        "supportedGenerationMethods": ["generateContent", "streamGenerateContent", "countTokens"],
    })
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Page {
    page_size: Option<i64>,
    page_token: Option<String>,
}

fn models<'a>(req: Incoming<'a>, host: &'a dyn Host) -> BoxFuture<'a, Result<Answer, ApiError>> {
    Box::pin(std::future::ready(page(&req, host)))
}

fn page(req: &Incoming<'_>, host: &dyn Host) -> Result<Answer, ApiError> {
    let query = req.uri.query().unwrap_or_default();
    let page: Page = serde_urlencoded::from_str(query)
        .map_err(|_| ApiError::invalid("`pageSize` must be an integer").with_param("pageSize"))?;
    let size = match page.page_size {
        None | Some(0) => 50,
        Some(n) if (1..=1000).contains(&n) => n as usize,
        Some(_) => {
            return Err(
                ApiError::invalid("`pageSize` must be between 1 and 1000").with_param("pageSize")
            )
        }
    };
    let ids = host.models();
    let start = match page.page_token.as_deref().filter(|t| !t.is_empty()) {
        None => 0,
        Some(token) => {
            let after = (URL_SAFE_NO_PAD.decode(token).ok())
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| {
                    ApiError::invalid("`pageToken` is not a token this gateway issued")
                        .with_param("pageToken")
                })?;
            match ids.iter().position(|m| *m == after) {
                Some(i) => i + 1,
                None => ids.len(),
            }
        }
    };
    let slice = &ids[start..(start + size).min(ids.len())];
    let mut body = json!({"models": slice.iter().map(|id| model(id)).collect::<Vec<_>>()});
    if start + size < ids.len() {
        if let Some(last) = slice.last() {
            body["nextPageToken"] = json!(URL_SAFE_NO_PAD.encode(last));
        }
    }
    Ok(Answer::Json(body))
}

/// `GET /v1beta/models/{model}`.
fn model_of<'a>(req: Incoming<'a>, host: &'a dyn Host) -> BoxFuture<'a, Result<Answer, ApiError>> {
    let id = req.param("call").unwrap_or_default();
    let id = id.strip_prefix("models/").unwrap_or(id);
    let found = match host.models().iter().any(|m| m == id) {
        true => Ok(Answer::Json(model(id))),
        false => Err(ApiError::model_not_found(id)),
    };
    Box::pin(std::future::ready(found))
}
