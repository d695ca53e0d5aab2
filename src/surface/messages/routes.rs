//! The Messages API's routes beside `POST /v1/messages`: `POST /v1/messages/count_tokens` (an
//! estimate, see [`super::estimate_tokens`]) and Anthropic's form of `GET /v1/models` and
//! `GET /v1/models/{id}`, which an Anthropic client's requests take (they name
//! `anthropic-version`, see [`super::Messages`]'s `claims`).

use futures::future::BoxFuture;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::surface::{Answer, Host, Incoming, Route, Serve};

pub(super) fn routes() -> Vec<Route> {
    let route = |path, serve| Route { path, serve };
    vec![
        route("/v1/messages/count_tokens", Serve::Post(count_tokens)),
        route("/v1/models", Serve::Get(models)),
        route("/v1/models/{id}", Serve::Get(model_of)),
    ]
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": n}` for a model the principal may use.
fn count_tokens<'a>(
    req: Incoming<'a>,
    host: &'a dyn Host,
) -> BoxFuture<'a, Result<Answer, ApiError>> {
    Box::pin(async move {
        let (input, _) = super::parse(&req.body, req.arrived)?;
        if !host.models().contains(&input.model) {
            return Err(ApiError::model_not_found(&input.model));
        }
        let n = super::estimate_tokens(&input);
        Ok(Answer::Json(json!({"input_tokens": n})))
    })
}

/// A model in Anthropic's list shape.
fn model(id: &str) -> Value {
    json!({"type": "model", "id": id, "display_name": id, "created_at": "1970-01-01T00:00:00Z"})
}

/// The paging parameters of Anthropic's model list.
#[derive(serde::Deserialize)]
struct Page {
    limit: Option<usize>,
    after_id: Option<String>,
    before_id: Option<String>,
}

/// `GET /v1/models` (Claude Code's gateway model discovery asks `?limit=1000`): the caller's
/// models in config order, a page of `limit` (default 20, 1 to 1000) after `after_id` or
/// before `before_id`. A cursor the caller cannot see gives an empty page.
fn models<'a>(req: Incoming<'a>, host: &'a dyn Host) -> BoxFuture<'a, Result<Answer, ApiError>> {
    Box::pin(std::future::ready(page(&req, host)))
}

fn page(req: &Incoming<'_>, host: &dyn Host) -> Result<Answer, ApiError> {
    let query = req.uri.query().unwrap_or_default();
    let page: Page = serde_urlencoded::from_str(query).map_err(|_| {
        ApiError::invalid("`limit` must be a number; `after_id` and `before_id` are model ids")
    })?;
    let limit = page.limit.unwrap_or(20);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid("`limit` must be between 1 and 1000").with_param("limit"));
    }
    let ids = host.models();
    let at = |id: &str| ids.iter().position(|m| m == id);
    let (slice, has_more) = match (&page.after_id, &page.before_id) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "give `after_id` or `before_id`, not both",
            ))
        }
        (Some(after), None) => match at(after) {
            Some(i) => {
                let rest = &ids[i + 1..];
                (&rest[..limit.min(rest.len())], rest.len() > limit)
            }
            None => (&ids[..0], false),
        },
        (None, Some(before)) => match at(before) {
            Some(i) => (&ids[i.saturating_sub(limit)..i], i > limit),
            None => (&ids[..0], false),
        },
        (None, None) => (&ids[..limit.min(ids.len())], ids.len() > limit),
    };
    let data: Vec<Value> = slice.iter().map(|id| model(id)).collect();
    Ok(Answer::Json(json!({"data": data, "has_more": has_more,
                          "first_id": slice.first(), "last_id": slice.last()})))
}

/// `GET /v1/models/{id}`.
fn model_of<'a>(req: Incoming<'a>, host: &'a dyn Host) -> BoxFuture<'a, Result<Answer, ApiError>> {
    let id = req.param("id").unwrap_or_default();
    let found = match host.models().iter().any(|m| m == id) {
        true => Ok(Answer::Json(model(id))),
        false => Err(ApiError::model_not_found(id)),
    };
    Box::pin(std::future::ready(found))
}
