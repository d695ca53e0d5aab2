//! The extractor for what every authenticated route checks from the headers alone, before
//! any body byte is read, in this order: a declared `Content-Length` over the route's limit
//! is 413, a missing or bad credential 401.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use super::{authorization, declared_within};
use crate::auth::Principal;
use crate::engine::Engine;
use crate::error::ApiError;

/// The authenticated caller of a route whose body is at most `LIMIT` bytes (no limit by
/// default: a route without a body, or one that checks its own).
pub struct Caller<const LIMIT: usize = { usize::MAX }> {
    pub principal: Principal,
    /// The credential as sent, for the re-checks of a long-lived stream.
    pub credential: Option<String>,
}

impl<const LIMIT: usize> FromRequestParts<Engine> for Caller<LIMIT> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, gw: &Engine) -> Result<Self, ApiError> {
        declared_within(&parts.headers, LIMIT)?;
        let credential = authorization(&parts.headers);
        let principal = gw.authenticate(credential.as_deref())?;
        Ok(Caller {
            principal,
            credential: credential.map(|c| c.into_owned()),
        })
    }
}
