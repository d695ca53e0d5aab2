//! Client surfaces: one module per client API. A surface owns its wire types, its tolerant
//! parsing into a neutral [`crate::turn::TurnInput`], its canonical projection for the
//! continuation digests, its continuation detection, its response and stream framing and its
//! error body shape. Nothing else knows a client wire format.

pub mod chat;
pub mod messages;
pub mod responses;
pub mod sse;

use crate::continuation::token::{classify, Run, RunError};
use crate::error::{ApiError, ErrorCode};

/// A request body as `T`: UTF-8 (as JSON must be; serde would skip invalid bytes inside
/// members it ignores, and the body may be relayed as is) and then JSON.
pub fn read_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::invalid(format!("Invalid request body: not UTF-8 ({e})")))?;
    serde_json::from_str(text).map_err(|e| ApiError::invalid(format!("Invalid request body: {e}")))
}

/// A continuation's ids: the digests of the assistant message's calls and of each result with
/// its message index.
pub type RunDigests = (Vec<[u8; 32]>, Vec<([u8; 32], usize)>);

/// Classifies a trailing tool run (the calls of the assistant message, then the ids its
/// results answer, the first result at message `first_result`): `None` when the ids are the
/// client's own, the digests when all are tokens, else a 400 on `param` (`field` names the
/// result id field).
pub fn trailing_run<'a>(
    calls: impl IntoIterator<Item = &'a str>,
    results: impl IntoIterator<Item = &'a str>,
    first_result: usize,
    (param, field): (&'static str, &str),
) -> Result<Option<RunDigests>, ApiError> {
    match classify(calls, results) {
        Ok(Run::ClientOwned) => Ok(None),
        Ok(Run::Tokens(tokens, results)) => Ok(Some((
            tokens,
            results.into_iter().zip(first_result..).collect(),
        ))),
        Err(e) => Err(refusal(e, param, field)),
    }
}

/// The tool results at `messages[first..end]` (neutral messages) and the calls they answer:
/// the assistant message right before them must carry calls (else 400 `orphan` on `param`),
/// then the run is classified as [`trailing_run`] does. `None` for the client's own ids, else
/// the assistant message's index with the digests.
pub fn answered_run(
    messages: &[crate::turn::Message],
    (first, end): (usize, usize),
    (param, field): (&'static str, &str),
    orphan: &str,
) -> Result<Option<(usize, RunDigests)>, ApiError> {
    let calls = first
        .checked_sub(1)
        .map(|i| &messages[i])
        .filter(|m| m.role == crate::turn::Role::Assistant && !m.tool_calls.is_empty())
        .map(|m| &m.tool_calls)
        .ok_or_else(|| ApiError::invalid(orphan).with_param(param))?;
    let run = trailing_run(
        calls.iter().map(|c| c.id.as_str()),
        messages[first..end]
            .iter()
            .map(|m| m.tool_call_id.as_deref().unwrap_or_default()),
        first,
        (param, field),
    )?;
    Ok(run.map(|digests| (first - 1, digests)))
}

/// The 400 of a refused run, on `param`; `field` names the id field in the message.
fn refusal(e: RunError, param: &'static str, field: &str) -> ApiError {
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
