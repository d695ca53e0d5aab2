//! The engine's errors, by source, and the one place that turns them into codes and messages
//! (`From<EngineError> for ApiError`). Status classes follow the source: a client's drift is
//! 400, a refused admission 429, a backend failure 502/504, a store failure 503
//! `store_unavailable`, a draining gateway 503 `shutting_down`.

use super::placement::Owner;
use crate::backend::BackendError;
use crate::budget::Exceeded;
use crate::config::ConfigError;
use crate::continuation::Reason;
use crate::error::{ApiError, ErrorCode, Param, UpstreamDetail};
use crate::store::StoreError;

/// Why the gateway did not start (the process then exits 2 with it).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("backend `{name}` failed to start: {error}")]
    Backend { name: String, error: BackendError },
    /// A variable the config names (`key`) is unset or unusable.
    #[error("{key}: the environment variable {var} {problem}")]
    Environment {
        key: &'static str,
        var: String,
        problem: &'static str,
    },
    #[error("cannot listen on {addr}{role}: {error}")]
    Listen {
        addr: std::net::SocketAddr,
        /// Which listener, when not the main one.
        role: &'static str,
        error: std::io::Error,
    },
    #[error(transparent)]
    Notify(crate::notify::NotifyError),
    #[error("cannot take the replica's lease: {0}")]
    Lease(StoreError),
    #[error("cannot watch for signals: {0}")]
    Signals(std::io::Error),
    #[error("cannot start the journal writer: {0}")]
    Thread(std::io::Error),
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    #[error("shutting down")]
    ShuttingDown,
    #[error("model not found")]
    ModelNotFound(String),
    #[error("rate limited ({limit})")]
    RateLimited {
        limit: &'static str,
        retry_after_secs: u64,
    },
    #[error("continuation: {0:?}")]
    Continuation(ContinuationError),
    #[error("backend: {0}")]
    Backend(BackendError),
    /// The backend's turn failed, was interrupted or died mid-leg.
    #[error("the turn failed")]
    TurnFailed,
    /// The backend stopped answering mid-leg.
    #[error("the backend timed out")]
    TurnTimedOut,
    /// The execution passed its absolute deadline mid-leg.
    #[error("the execution passed its deadline")]
    Deadline,
    #[error("more than {0} tool rounds")]
    MaxRounds(u32),
    /// The pending-continuation bounds refused a suspension; no token was exposed.
    #[error("too many suspended tool calls")]
    SuspensionCapacity,
    /// The principal holds its maximum of open streams (`max_streams`).
    #[error("too many open streams ({0})")]
    StreamCapacity(usize),
    /// The store could not record what must be recorded first; nothing was exposed.
    #[error("the store is unavailable")]
    Store,
    /// The owner replica of the held turn did not answer, though its lease is live.
    #[error("owner replica unreachable")]
    ReplicaUnavailable,
    /// A budget cap of the principal is reached: a fresh turn refused, or an execution
    /// stopped at its per-execution cap. `retry_after_secs` until the cap resets (none for a
    /// per-execution cap).
    #[error("budget cap reached ({})", exceeded.cap.as_str())]
    BudgetExceeded {
        exceeded: Exceeded,
        retry_after_secs: Option<u64>,
        /// The group whose pooled budget it is; None for the principal's own.
        group: Option<String>,
    },
}

/// Why a continuation was refused. Each variant consumes nothing, except `Settled` and
/// `Revoked`, which report what already happened to the held turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContinuationError {
    /// Unknown, or another principal's (live or settled): one body for both.
    NotFound,
    /// The caller's own token, settled with this reason.
    Settled(Reason),
    /// Drift: the request does not match the suspension (the text says which part).
    Mismatch(String),
    /// The caller's grant for the model was revoked while suspended.
    Revoked,
    /// `previous_response_id` of a fresh turn names no completed response whose thread is
    /// kept: unknown, another principal's, released or expired (one body for all).
    ResponseNotFound,
    /// Held by another live replica (validated up to the claim here).
    Elsewhere(Owner),
    /// The shared store did not answer a lookup or a claim; nothing was consumed.
    StoreUnavailable,
    /// The execution reached its per-execution spend cap before this round: it was stopped
    /// and its tokens settled `budget_exceeded`.
    BudgetExceeded(Exceeded),
}

impl From<ContinuationError> for EngineError {
    fn from(e: ContinuationError) -> Self {
        EngineError::Continuation(e)
    }
}

impl From<BackendError> for EngineError {
    fn from(e: BackendError) -> Self {
        EngineError::Backend(e)
    }
}

fn continuation(e: ContinuationError) -> ApiError {
    let e = match e {
        // The engine answers it as `Outcome::Forward`; rendered only if a caller forgot to.
        ContinuationError::Elsewhere(_) => {
            return ApiError::new(ErrorCode::Internal, "internal error")
        }
        ContinuationError::StoreUnavailable => return EngineError::Store.into(),
        ContinuationError::BudgetExceeded(exceeded) => {
            return EngineError::BudgetExceeded {
                exceeded,
                retry_after_secs: None,
                group: None,
            }
            .into()
        }
        ContinuationError::ResponseNotFound => {
            return ApiError::new(
                ErrorCode::ContinuationNotFound,
                "No completed response with this id is held (unknown, expired or released); send the whole conversation in `input` instead.",
            )
            .with_param("previous_response_id")
        }
        // Identical for unknown and foreign tokens: nothing in it depends on the lookup.
        ContinuationError::NotFound => ApiError::new(
            ErrorCode::ContinuationNotFound,
            "No pending tool call matches the tool_call_id values of this request.",
        ),
        ContinuationError::Mismatch(why) => ApiError::new(
            ErrorCode::ContinuationMismatch,
            format!("This continuation does not match the suspended turn: {why}."),
        ),
        ContinuationError::Revoked | ContinuationError::Settled(Reason::Revoked) => ApiError::new(
            ErrorCode::UnauthorizedTarget,
            "Your access to this model was revoked; the suspended turn was cancelled.",
        ),
        ContinuationError::Settled(Reason::Resolved) => ApiError::new(
            ErrorCode::ContinuationAlreadyResolved,
            "These tool calls were already answered.",
        ),
        ContinuationError::Settled(Reason::Expired) => ApiError::new(
            ErrorCode::ContinuationExpired,
            "The suspended turn passed its deadline and was cancelled.",
        ),
        ContinuationError::Settled(Reason::BudgetExceeded) => ApiError::new(
            ErrorCode::ExecutionBudgetExceeded,
            "The execution was stopped at its per-execution spend cap; start a new turn.",
        ),
        ContinuationError::Settled(Reason::Lost | Reason::Cancelled) => ApiError::new(
            ErrorCode::ContinuationLost,
            "The suspended turn is gone (backend or gateway restart); start a new turn.",
        ),
    };
    e.with_param(Param::Conversation)
}

fn backend(e: BackendError) -> ApiError {
    match e {
        BackendError::Capacity => ApiError::new(
            ErrorCode::CapacityExhausted,
            "All backend sessions are busy; retry later.",
        ),
        BackendError::Lost => ApiError::new(
            ErrorCode::ContinuationLost,
            "The held turn is gone (backend restart); start a new turn.",
        ),
        BackendError::Timeout => ApiError::new(
            ErrorCode::UpstreamTimeout,
            "The upstream did not answer in time.",
        ),
        BackendError::Refused(r) => {
            let mut e = ApiError::new(ErrorCode::UpstreamRejected, r.message);
            e.upstream = Some(Box::new(UpstreamDetail {
                status: r.status,
                kind: r.kind,
                code: r.code,
                param: r.param,
            }));
            e
        }
        BackendError::Invalid { message, param } => ApiError::invalid(message).with_param(param),
        BackendError::UnsupportedToolChoice { kind } => ApiError::new(
            ErrorCode::UnsupportedToolChoice,
            format!(
                "A forced tool choice cannot be honoured on this model: it runs on an agent \
                 backend (`{kind}`) that decides for itself whether to call a tool, and its \
                 held turn can only offer your tools. Send tool_choice \"auto\" or \"none\"; \
                 forced choices work on models served by an OpenAI-compatible upstream."
            ),
        )
        .with_param(Param::ToolChoice),
        BackendError::UnsupportedResponseFormat(why) => {
            ApiError::new(ErrorCode::UnsupportedResponseFormat, why)
                .with_param(Param::ResponseFormat)
        }
        BackendError::Unavailable(_) | BackendError::Rejected(_) => ApiError::upstream(),
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::ShuttingDown => {
                ApiError::new(ErrorCode::ShuttingDown, "The gateway is shutting down.")
            }
            EngineError::ModelNotFound(model) => ApiError::model_not_found(&model),
            EngineError::RateLimited {
                limit,
                retry_after_secs,
            } => {
                let mut e = ApiError::new(
                    ErrorCode::RateLimited,
                    format!("Rate limit reached ({limit}); retry after {retry_after_secs} s."),
                );
                e.retry_after = Some(retry_after_secs);
                e
            }
            EngineError::Continuation(c) => continuation(c),
            EngineError::Backend(b) => backend(b),
            EngineError::TurnFailed => ApiError::upstream(),
            EngineError::TurnTimedOut => ApiError::new(
                ErrorCode::UpstreamTimeout,
                "The upstream did not finish in time.",
            ),
            EngineError::Deadline => ApiError::new(
                ErrorCode::UpstreamTimeout,
                "The execution passed its deadline.",
            ),
            EngineError::MaxRounds(n) => ApiError::new(
                ErrorCode::CapacityExhausted,
                format!("The turn exceeded {n} tool rounds and was stopped."),
            ),
            EngineError::SuspensionCapacity => ApiError::new(
                ErrorCode::CapacityExhausted,
                "Too many suspended tool calls (or too much conversation kept for them); retry later.",
            ),
            EngineError::StreamCapacity(max) => {
                let mut e = ApiError::new(
                    ErrorCode::CapacityExhausted,
                    format!("This client already has {max} open streams; close one or retry later."),
                );
                e.retry_after = Some(1);
                e
            }
            EngineError::Store => ApiError::new(
                ErrorCode::StoreUnavailable,
                "The gateway could not record the execution; nothing was exposed. Retry later.",
            ),
            EngineError::BudgetExceeded {
                exceeded,
                retry_after_secs,
                group,
            } => {
                let resets = match exceeded.resets_at {
                    Some(at) => format!(
                        "; it resets at {}T00:00:00Z (an administrator can raise it sooner)",
                        crate::store::date_of(crate::store::day_of(at))
                    ),
                    None => "; the execution was stopped".into(),
                };
                let mut e = ApiError::new(
                    ErrorCode::BudgetExceeded,
                    format!(
                        "Budget exceeded: the {}{} cap of {} is reached{resets}.",
                        group.map_or(String::new(), |g| format!("group `{g}`'s ")),
                        exceeded.cap.as_str(),
                        exceeded.amount()
                    ),
                );
                // A stopped execution's cap never resets: a new turn may start at once.
                e.retry_after = Some(retry_after_secs.unwrap_or(0));
                e.exceeded = Some(exceeded);
                e
            }
            EngineError::ReplicaUnavailable => {
                let mut e = ApiError::new(
                    ErrorCode::ReplicaUnavailable,
                    "The gateway replica that holds this turn did not answer; nothing was consumed. Retry later.",
                );
                e.retry_after = Some(1);
                e
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_pick_their_status_class() {
        let status = |e: EngineError| ApiError::from(e).status();
        assert_eq!(status(EngineError::Store), 503);
        assert_eq!(status(EngineError::ShuttingDown), 503);
        assert_eq!(status(EngineError::SuspensionCapacity), 429);
        assert_eq!(status(EngineError::TurnFailed), 502);
        assert_eq!(status(EngineError::Deadline), 504);
        assert_eq!(
            status(ContinuationError::Settled(Reason::Cancelled).into()),
            410
        );
        assert_eq!(status(ContinuationError::Revoked.into()), 403);
        let a = ApiError::from(EngineError::from(ContinuationError::NotFound));
        assert_eq!(a.code, ErrorCode::ContinuationNotFound);
        assert_eq!(a.param, Some(Param::Conversation));
    }
}
