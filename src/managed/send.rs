//! `POST /v1/sessions/{id}/events`: the events a client sends, checked as a batch before
//! anything happens (a refused batch changes nothing), then logged and acted on in order:
//! `user.message` (a fresh turn, or the next one when a turn runs), `user.interrupt`,
//! `user.custom_tool_result` (the held turn resumes once every use it waits on has its
//! result; a second result for a use is 409, a use it does not wait on 404, a use whose
//! turn has ended 410), `user.tool_confirmation`.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{json, Value};

use super::confirm::{self, Confirmation};
use super::log::{event, message, text_of, Live, Phase};
use super::wire::only;
use super::{refused, runner, Managed};
use crate::approvals::MAX_REASON_CHARS;
use crate::auth::Principal;
use crate::error::{ApiError, ErrorCode};
use crate::turn::{Message, Role};

/// One event of a batch, checked.
enum Sent {
    Message(Message),
    Interrupt,
    Result { use_id: String, result: Message },
    Confirm(Confirmation),
}

pub async fn send(m: &Managed, who: &Principal, id: &str, body: &Value) -> Result<Value, ApiError> {
    only(body, &["events"])?;
    let Some(events) = body["events"].as_array().filter(|e| !e.is_empty()) else {
        return Err(refused("events", "must be a non-empty array"));
    };
    let max = m.engine().config().managed_agents.max_events_per_send;
    if events.len() > max {
        return Err(refused(
            "events",
            format!("at most {max} events per request"),
        ));
    }
    let live = m.session(who, id).await?;
    if !live.object()?["archived_at"].is_null() {
        return Err(ApiError::invalid(
            "The session is archived: it takes no more events.",
        ));
    }
    let _gate = live.gate.lock().await;
    let sent = check(m, &live, events)?;
    *live.who.lock() = who.clone();
    let mut echoes = Vec::new();
    let mut all = Vec::new();
    let mut start = false;
    for (s, raw) in sent.into_iter().zip(events) {
        let echo = echo(raw);
        all.push(echo.clone());
        match s {
            Sent::Message(msg) => {
                echoes.push(echo);
                let mut state = live.state.lock();
                state.queued.push_back(msg);
                start |= state.phase == Phase::Idle;
            }
            Sent::Interrupt => {
                echoes.push(echo);
                live.append(m, std::mem::take(&mut echoes)).await?;
                interrupt(m, &live).await;
            }
            Sent::Result { use_id, result } => {
                echoes.push(echo);
                let complete = {
                    let mut state = live.state.lock();
                    state.results.insert(use_id, result);
                    state
                        .waiting
                        .iter()
                        .all(|w| state.results.contains_key(&w.event_id))
                };
                if complete {
                    resume(m, &live, std::mem::take(&mut echoes)).await?;
                }
            }
            Sent::Confirm(c) => {
                if !echoes.is_empty() {
                    live.append(m, std::mem::take(&mut echoes)).await?;
                }
                confirm::confirm(m, &live, who, c, echo).await?;
            }
        }
    }
    if !echoes.is_empty() {
        live.append(m, echoes).await?;
    }
    if start {
        runner::fresh(m, &live).await;
    }
    Ok(json!({"data": all}))
}

/// The held turn resumes; its results are logged once the engine has claimed it. A claim
/// refused (the turn expired or was lost) settles the session's waiting uses.
async fn resume(m: &Managed, live: &Arc<Live>, echoes: Vec<Value>) -> Result<(), ApiError> {
    let answered: Vec<String> = live
        .state
        .lock()
        .waiting
        .iter()
        .map(|w| w.event_id.clone())
        .collect();
    match runner::resume(m, live, echoes).await {
        Ok(()) => {
            live.state.lock().answered.extend(answered);
            Ok(())
        }
        Err(e) => {
            if e.status() == 410 {
                runner::interrupted(m, live).await;
            } else {
                // Nothing was claimed: the results may be sent again.
                live.state.lock().results.clear();
            }
            Err(e)
        }
    }
}

/// `user.interrupt`: a running leg is interrupted, a held turn withdrawn; either way the
/// session goes idle.
pub(super) async fn interrupt(m: &Managed, live: &Arc<Live>) {
    let (phase, running, tokens) = {
        let mut s = live.state.lock();
        s.queued.clear();
        let tokens: Vec<String> = s.waiting.iter().map(|w| w.token.clone()).collect();
        (s.phase, s.interrupt.take(), tokens)
    };
    match phase {
        Phase::Idle => {}
        Phase::Running => {
            if let Some(stop) = running {
                stop.cancel();
            }
        }
        Phase::Waiting => {
            m.engine().withdraw(&live.principal, &tokens).await;
            runner::interrupted(m, live).await;
        }
    }
}

/// Checks every event against the session's state; nothing changes here.
fn check(m: &Managed, live: &Live, events: &[Value]) -> Result<Vec<Sent>, ApiError> {
    let state = live.state.lock();
    let mut results = HashSet::new();
    let mut out = Vec::with_capacity(events.len());
    let mut fresh = false;
    for (i, e) in events.iter().enumerate() {
        let at = |f: &str| format!("events[{i}].{f}");
        let sent = match e["type"].as_str() {
            Some("user.message") => {
                only(e, &["type", "content"])
                    .map_err(|_| refused(at("type"), "has a field user.message does not take"))?;
                if state.phase == Phase::Waiting {
                    return Err(ApiError::invalid(
                        "The session waits on custom tool results (requires_action): send them, or user.interrupt, first.",
                    ));
                }
                fresh |= state.phase == Phase::Idle;
                Sent::Message(message(Role::User, &content(e, &at("content"), false)?))
            }
            Some("user.interrupt") => Sent::Interrupt,
            Some("user.custom_tool_result") => {
                let Some(use_id) = e["custom_tool_use_id"].as_str() else {
                    return Err(refused(at("custom_tool_use_id"), "is required"));
                };
                if state.answered.contains(use_id)
                    || state.results.contains_key(use_id)
                    || !results.insert(use_id)
                {
                    return Err(ApiError::new(
                        ErrorCode::ContinuationAlreadyResolved,
                        "This custom tool use already has its result.",
                    ));
                }
                if state.settled.contains(use_id) {
                    return Err(ApiError::new(
                        ErrorCode::ContinuationLost,
                        "The turn that waited on this custom tool use has ended (interrupted, failed or lost).",
                    ));
                }
                if !state.waiting.iter().any(|w| w.event_id == use_id) {
                    return Err(ApiError::new(
                        ErrorCode::ContinuationNotFound,
                        "The session does not wait on a custom tool use with this id.",
                    ));
                }
                let mut result = message(Role::Tool, &content(e, &at("content"), true)?);
                result.is_error = e["is_error"] == true;
                Sent::Result {
                    use_id: use_id.to_string(),
                    result,
                }
            }
            Some("user.tool_confirmation") => {
                Sent::Confirm(confirmation(&state, e, &at, &mut results)?)
            }
            Some(other) => {
                return Err(refused(
                    at("type"),
                    format!("`{other}` is not supported by this gateway"),
                ))
            }
            None => return Err(refused(at("type"), "is required")),
        };
        out.push(sent);
    }
    drop(state);
    if fresh {
        let max = m
            .engine()
            .config()
            .managed_agents
            .max_running_sessions_per_client;
        if m.running(&live.principal) >= max {
            return Err(ApiError::new(
                ErrorCode::CapacityExhausted,
                format!("You have {max} sessions running, the most this gateway runs for one client at once."),
            ));
        }
    }
    Ok(out)
}

/// A `user.tool_confirmation` of a tool use the session waits on (409 answered, 410 no
/// longer waiting, 404 unknown).
fn confirmation<'a>(
    state: &super::log::State,
    e: &'a Value,
    at: &dyn Fn(&str) -> String,
    seen: &mut HashSet<&'a str>,
) -> Result<Confirmation, ApiError> {
    only(
        e,
        &[
            "type",
            "tool_use_id",
            "result",
            "deny_message",
            "session_thread_id",
        ],
    )
    .map_err(|_| {
        refused(
            at("type"),
            "has a field user.tool_confirmation does not take",
        )
    })?;
    let Some(use_id) = e["tool_use_id"].as_str() else {
        return Err(refused(at("tool_use_id"), "is required"));
    };
    let allow = match e["result"].as_str() {
        Some("allow") => true,
        Some("deny") => false,
        _ => return Err(refused(at("result"), "must be `allow` or `deny`")),
    };
    let deny_message = match &e["deny_message"] {
        Value::Null => None,
        Value::String(s) if s.chars().count() > MAX_REASON_CHARS => {
            return Err(refused(
                at("deny_message"),
                format!("must be at most {MAX_REASON_CHARS} characters"),
            ))
        }
        Value::String(s) if !allow => Some(s.clone()),
        Value::String(_) => return Err(refused(at("deny_message"), "is only allowed with `deny`")),
        _ => return Err(refused(at("deny_message"), "must be a string")),
    };
    if state.answered.contains(use_id) || !seen.insert(use_id) {
        return Err(ApiError::new(
            ErrorCode::ContinuationAlreadyResolved,
            "This tool use is already confirmed.",
        ));
    }
    if state.settled.contains(use_id) {
        return Err(ApiError::new(
            ErrorCode::ContinuationLost,
            "This tool use no longer waits on a confirmation (decided elsewhere, expired, or its turn ended).",
        ));
    }
    if !state.confirming.iter().any(|c| c.event_id == use_id) {
        return Err(ApiError::new(
            ErrorCode::ContinuationNotFound,
            "The session does not wait on a confirmation of a tool use with this id.",
        ));
    }
    Ok(Confirmation {
        use_id: use_id.to_string(),
        allow,
        deny_message,
    })
}

/// A content list's text (text blocks only; a tool result may also be empty).
fn content(e: &Value, field: &str, optional: bool) -> Result<String, ApiError> {
    let c = &e["content"];
    if c.is_null() && optional {
        return Ok(String::new());
    }
    let Some(blocks) = c.as_array() else {
        return Err(refused(field, "must be an array of content blocks"));
    };
    if let Some(j) = blocks
        .iter()
        .position(|b| b["type"] != "text" || !b["text"].is_string())
    {
        return Err(refused(
            format!("{field}[{j}]"),
            "only text blocks are supported by this gateway",
        ));
    }
    Ok(text_of(c))
}

/// The event as logged: the client's fields, the gateway's id and time.
fn echo(raw: &Value) -> Value {
    let mut e = event(raw["type"].as_str().unwrap_or_default(), json!({}));
    if let (Some(e), Some(raw)) = (e.as_object_mut(), raw.as_object()) {
        for (k, v) in raw {
            if k != "id" && k != "processed_at" {
                e.insert(k.clone(), v.clone());
            }
        }
    }
    e
}
