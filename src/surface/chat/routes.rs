//! OpenAI's `GET /v1/models` and `GET /v1/models/{id}`: the model list every OpenAI client
//! (Chat Completions and Responses alike) reads, and the one a request that no other surface
//! claims gets.

use futures::future::BoxFuture;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::surface::{Answer, Host, Incoming, Route, Serve};

pub(super) fn routes() -> Vec<Route> {
    vec![
        Route {
            path: "/v1/models",
            serve: Serve::Get(models),
        },
        Route {
            path: "/v1/models/{id}",
            serve: Serve::Get(model_of),
        },
    ]
}

/// A model in OpenAI's shape.
fn model(id: &str) -> Value {
    json!({"id": id, "object": "model", "created": 0, "owned_by": "turnstile"})
}

/// `GET /v1/models`: the caller's models, in config order.
fn models<'a>(_: Incoming<'a>, host: &'a dyn Host) -> BoxFuture<'a, Result<Answer, ApiError>> {
    let data: Vec<Value> = host.models().iter().map(|id| model(id)).collect();
    let list = Answer::Json(json!({"object": "list", "data": data}));
    Box::pin(std::future::ready(Ok(list)))
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
