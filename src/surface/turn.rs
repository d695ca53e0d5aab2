//! What every surface does between its wire and the neutral turn: find where the answered
//! calls are (one [`Detected`], with the shared run checks), then digest the conversation and
//! build the continuation, the fingerprint and the [`TurnInput`] ([`Parts::build`]). A surface
//! supplies its messages, its projections and its own digests of tools and tool choice.

use tokio::time::Instant;

use crate::continuation::canonical::digest_of_digests;
use crate::continuation::token::{classify, Run, RunError, TOKEN_PREFIX};
use crate::error::{ApiError, ErrorCode, Param};
use crate::turn::{
    Continuation, DigestFn, EchoFn, Effort, Fingerprint, Message, Passthrough, ResponseIdFn, Role,
    Sampling, SurfaceId, ToolChoice, ToolDef, TurnInput,
};

/// Digests of a continuation's ids: the assistant message's calls, and each result with its
/// message index.
pub type Answered = (Vec<[u8; 32]>, Vec<([u8; 32], usize)>);

/// Where the answered calls of a request are, found before any lookup.
#[derive(Debug, PartialEq, Eq)]
pub enum Detected {
    Fresh,
    /// Trailing results that answer the client's own call ids: ordinary history for a
    /// stateless upstream, refused by a stateful backend.
    ClientOwned,
    /// The full conversation again: the assistant message at `assistant` carries the calls
    /// the trailing results answer.
    Answers {
        assistant: usize,
        tokens: Vec<[u8; 32]>,
        results: Vec<([u8; 32], usize)>,
    },
    /// By reference: only the results, for the calls of the execution the request names.
    Bound {
        tokens: Vec<[u8; 32]>,
        results: Vec<([u8; 32], usize)>,
    },
    /// By reference: new input that continues the completed execution the request names.
    Follows,
}

/// Classifies a trailing tool run (the calls of the assistant message, then the ids its
/// results answer, the first result at message `first_result`): `None` when the ids are the
/// client's own, the digests when all are tokens, else a 400 on the conversation (`field`
/// names the result id field).
pub fn trailing_run<'a>(
    calls: impl IntoIterator<Item = &'a str>,
    results: impl IntoIterator<Item = &'a str>,
    first_result: usize,
    field: &str,
) -> Result<Option<Answered>, ApiError> {
    match classify(calls, results) {
        Ok(Run::ClientOwned) => Ok(None),
        Ok(Run::Tokens(tokens, results)) => Ok(Some((
            tokens,
            results.into_iter().zip(first_result..).collect(),
        ))),
        Err(e) => Err(refusal(e, field)),
    }
}

/// The tool results right before `messages[end]` and the calls they answer: `Fresh` when
/// there are none; else the assistant message right before them must carry calls (else 400
/// `orphan`), and the run is classified as [`trailing_run`] does.
pub fn detect_run(
    messages: &[Message],
    end: usize,
    field: &str,
    orphan: &str,
) -> Result<Detected, ApiError> {
    let trailing = messages[..end]
        .iter()
        .rev()
        .take_while(|m| m.role == Role::Tool)
        .count();
    if trailing == 0 {
        return Ok(Detected::Fresh);
    }
    let first = end - trailing;
    let calls = first
        .checked_sub(1)
        .map(|i| &messages[i])
        .filter(|m| m.role == Role::Assistant && !m.tool_calls.is_empty())
        .map(|m| &m.tool_calls)
        .ok_or_else(|| ApiError::invalid(orphan).with_param(Param::Conversation))?;
    let run = trailing_run(
        calls.iter().map(|c| c.id.as_str()),
        messages[first..end]
            .iter()
            .map(|m| m.tool_call_id.as_deref().unwrap_or_default()),
        first,
        field,
    )?;
    Ok(match run {
        None => Detected::ClientOwned,
        Some((tokens, results)) => Detected::Answers {
            assistant: first - 1,
            tokens,
            results,
        },
    })
}

/// The results of a client's last user turn and the calls they answer, for a wire whose
/// user turn carries them (Messages, Gemini): the last `beside` messages are what the turn
/// holds beside its results (text, system messages). Turnstile's calls followed by a user turn
/// without results is 400 `continuation_mismatch` with `unanswered` (a continuation missing
/// them, never a fresh turn); else as [`detect_run`].
pub fn detect_last_turn(
    messages: &[Message],
    beside: usize,
    unanswered: &str,
    field: &str,
    orphan: &str,
) -> Result<Detected, ApiError> {
    let end = messages.len() - beside;
    let trailing = messages[..end].last().is_some_and(|m| m.role == Role::Tool);
    let missing = !trailing
        && beside > 0
        && (end.checked_sub(1).map(|i| &messages[i]))
            .filter(|m| m.role == Role::Assistant)
            .is_some_and(|m| m.tool_calls.iter().any(|c| c.id.starts_with(TOKEN_PREFIX)));
    if missing {
        return Err(ApiError::new(ErrorCode::ContinuationMismatch, unanswered)
            .with_param(Param::Conversation));
    }
    detect_run(messages, end, field, orphan)
}

/// The 400 of a refused run; `field` names the id field in the message.
fn refusal(e: RunError, field: &str) -> ApiError {
    match e {
        RunError::Malformed => ApiError::invalid(format!(
            "{field} values with the `srct-` prefix must be Turnstile continuation ids (`srct-` followed by 32 lowercase hex digits)"
        )),
        RunError::Mixed => ApiError::new(
            ErrorCode::ContinuationMismatch,
            "the tool calls mix Turnstile continuation ids (`srct-`) with other ids",
        ),
    }
    .with_param(Param::Conversation)
}

/// A surface's projections: how it digests one message, an assistant message it exposes, and
/// an assistant message a client sends back.
#[derive(Clone, Copy)]
pub struct Projection {
    pub digest: DigestFn,
    pub exposed: EchoFn,
    pub returned: DigestFn,
    pub response_id: ResponseIdFn,
}

/// One request, read by its surface, before the shared steps.
pub struct Parts {
    pub surface: SurfaceId,
    pub projection: Projection,
    pub model: String,
    pub messages: Vec<Message>,
    pub detected: Detected,
    /// The execution the request names by reference (`previous_response_id`).
    pub reference: Option<String>,
    pub tools: Result<Vec<ToolDef>, String>,
    /// The surface's digests of its tool set and of its tool choice (with the effort).
    pub tools_digest: [u8; 32],
    pub tool_choice_digest: [u8; 32],
    pub tool_choice: ToolChoice,
    pub effort: Option<Effort>,
    pub parallel_tool_calls: bool,
    pub stream: bool,
    pub passthrough: Option<Passthrough>,
    pub sampling: Sampling,
    pub arrived: Instant,
}

impl Parts {
    /// The neutral turn: each message digested once (a continuation's prefix check uses those
    /// before the assistant message, the next suspension's prefix all of them), the
    /// continuation and the fingerprint.
    pub fn build(self) -> TurnInput {
        let p = self.projection;
        // A fresh turn's messages are digested only if something needs them (an agent's
        // turn, a suspension); a continuation's now, for its claim.
        let digested = !matches!(self.detected, Detected::Fresh | Detected::ClientOwned);
        let (digests, prefix) = match digested {
            true => crate::turn::digests(&self.messages, p.digest),
            false => (Vec::new(), [0; 32]),
        };
        let client_tool_history = self.detected == Detected::ClientOwned;
        let mut follows = None;
        let continuation = match self.detected {
            Detected::Fresh | Detected::ClientOwned => None,
            Detected::Follows => {
                follows = self.reference;
                None
            }
            Detected::Answers {
                assistant,
                tokens,
                results,
            } => Some(Continuation {
                prefix: digest_of_digests(&digests[..assistant]),
                echo: (p.returned)(&self.messages[assistant]),
                assistant,
                tokens,
                results,
                bound: None,
            }),
            Detected::Bound { tokens, results } => Some(Continuation {
                assistant: 0,
                tokens,
                results,
                prefix: [0; 32],
                echo: [0; 32],
                bound: self.reference,
            }),
        };
        let fingerprint = Fingerprint {
            tools: self.tools_digest,
            tool_choice: self.tool_choice_digest,
            prefix,
        };
        TurnInput {
            surface: self.surface,
            echo: p.exposed,
            digest: p.digest,
            response_id: p.response_id,
            model: self.model,
            messages: self.messages,
            message_digests: digests,
            digested,
            tools: self.tools,
            usd_cap: None,
            approvals: None,
            cwd: None,
            conversation: None,
            tool_choice: self.tool_choice,
            effort: self.effort,
            parallel_tool_calls: self.parallel_tool_calls,
            stream: self.stream,
            fingerprint,
            continuation: continuation.map(Box::new),
            follows,
            client_tool_history,
            passthrough: self.passthrough,
            sampling: Box::new(self.sampling),
            ephemeral: false,
            arrived: self.arrived,
        }
    }
}
