//! Client surfaces: one module per client API. A surface owns its wire types, its tolerant
//! parsing into a neutral [`crate::turn::TurnInput`], its canonical projection for the
//! continuation digests, its continuation detection, its response and stream framing and its
//! error body shape. Nothing else knows a client wire format.

pub mod chat;
pub mod responses;
pub mod sse;

use crate::continuation::token::RunError;
use crate::error::{ApiError, ErrorCode};

/// The 400 of a refused run, on `param`; `field` names the id field in the message.
pub fn refusal(e: RunError, param: &'static str, field: &str) -> ApiError {
    match e {
        RunError::Malformed => ApiError::invalid(format!(
            "{field} values with the `srct-` prefix must be Turnstile continuation ids (`srct-` followed by 32 lowercase hex digits)"
        )),
        RunError::Mixed => ApiError::new(
            ErrorCode::ContinuationMismatch,
            "the tool calls mix Turnstile continuation ids (`srct-`) with other ids",
        ),
    }
    .with_param(param)
}
