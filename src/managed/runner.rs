//! A session's turns through the engine: a fresh turn over the transcript for each round of
//! user messages, the continuation of the held turn once every waiting custom tool use has
//! its result, and the task that turns a leg's events into the session's events (durable,
//! then streamed): `session.status_running`, `span.model_request_start`, `agent.thinking`,
//! `agent.message`, `span.model_request_end` (its usage), `agent.custom_tool_use`, and
//! `session.status_idle` (`end_turn`, or `requires_action` with the uses that wait) or
//! `session.error`.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use super::confirm;
use super::log::{event, idle, message, Live, Phase, Waiting};
use super::Managed;
use crate::engine::{EngineError, Leg, LegEvent, Outcome};
use crate::error::{ApiError, ErrorCode};
use crate::surface::canonical::{
    echo_digest_of, exposed_echo, message_digest, tool_choice_digest, tools_digest,
};
use crate::surface::turn::{trailing_run, Detected, Parts, Projection};
use crate::turn::{
    Call, ExposedCall, Message, Role, Sampling, SurfaceId, ToolChoice, TurnInput, Usage,
};

/// The turn over `messages` (a continuation when `answers` says which assistant message's
/// calls its trailing results answer).
fn input(
    live: &Live,
    messages: Vec<Message>,
    answers: Option<usize>,
) -> Result<TurnInput, ApiError> {
    let detected = match answers {
        None => Detected::Fresh,
        Some(assistant) => {
            let calls = messages[assistant].tool_calls.iter().map(|c| c.id.as_str());
            let results = messages[assistant + 1..]
                .iter()
                .map(|m| m.tool_call_id.as_deref().unwrap_or_default());
            match trailing_run(calls, results, assistant + 1, "custom_tool_use_id")? {
                Some((tokens, results)) => Detected::Answers {
                    assistant,
                    tokens,
                    results,
                },
                None => {
                    return Err(ApiError::new(
                        ErrorCode::Internal,
                        "a held call's token is missing",
                    ))
                }
            }
        }
    };
    let spec = &live.agent;
    let mut turn = Parts {
        surface: SurfaceId::Managed,
        projection: Projection {
            digest: message_digest,
            exposed: exposed_echo,
            returned: echo_digest_of,
            response_id: |execution, _| execution.to_string(),
        },
        model: spec.model.clone(),
        messages,
        detected,
        reference: None,
        tools: Ok(spec.tools.clone()),
        tools_digest: tools_digest(Some(&spec.tools_json)),
        tool_choice_digest: tool_choice_digest(None, spec.effort),
        tool_choice: ToolChoice::Auto,
        effort: spec.effort,
        parallel_tool_calls: true,
        stream: true,
        passthrough: None,
        sampling: Sampling::default(),
        arrived: tokio::time::Instant::now(),
    }
    .build();
    turn.approvals = spec.approvals;
    turn.cwd = Some(live.folder.clone());
    turn.conversation = Some(live.id.clone());
    Ok(turn)
}

/// Starts a fresh turn with the queued user messages. The caller holds the session's gate.
/// (Boxed: a turn's end may start the next one, so the futures nest.)
pub(super) fn fresh<'a>(m: &'a Managed, live: &'a Arc<Live>) -> BoxFuture<'a, ()> {
    Box::pin(async move {
        let messages = {
            let mut s = live.state.lock();
            if s.queued.is_empty() {
                return;
            }
            let queued: Vec<Message> = s.queued.drain(..).collect();
            s.transcript.extend(queued);
            s.phase = Phase::Running;
            s.transcript.clone()
        };
        let started = match (input(live, messages, None), live.budget_left().0) {
            (_, Some(0)) => Err(budget_spent()),
            (Ok(mut turn), left) => {
                turn.usd_cap = left;
                run(m, live, turn, Vec::new()).await
            }
            (Err(e), _) => Err(e),
        };
        if let Err(e) = started {
            failed(m, live, e).await;
        }
    })
}

/// Resumes the held turn with every waiting use's result, logging `echoes` (the results'
/// events) once the engine has taken the claim. The caller holds the gate; on an error
/// nothing has been stored.
pub(super) async fn resume(
    m: &Managed,
    live: &Arc<Live>,
    echoes: Vec<Value>,
) -> Result<(), ApiError> {
    let (messages, assistant) = {
        let s = live.state.lock();
        let mut messages = s.transcript.clone();
        let assistant = messages.len() - 1;
        for w in &s.waiting {
            let mut r = s
                .results
                .get(&w.event_id)
                .cloned()
                .unwrap_or_else(|| message(Role::Tool, ""));
            r.tool_call_id = Some(w.token.clone());
            messages.push(r);
        }
        (messages, assistant)
    };
    let turn = input(live, messages, Some(assistant))?;
    // What is logged once the claim is taken must fit first: a refusal consumes nothing.
    let running = event("session.status_running", json!({}));
    live.room_for(m, &[&echoes[..], &[running]].concat())
        .await?;
    run(m, live, turn, echoes).await
}

/// Runs `turn` and, when a leg starts, logs `echoes` and starts the task that consumes it.
async fn run(
    m: &Managed,
    live: &Arc<Live>,
    turn: TurnInput,
    echoes: Vec<Value>,
) -> Result<(), ApiError> {
    let who = live.who.lock().clone();
    let messages = turn.messages.clone();
    let leg = match m.engine().execute_hop(&who, turn, false, None).await {
        Ok(Outcome::Leg(leg)) => leg,
        Ok(Outcome::Forward(_)) => {
            return Err(ApiError::new(
                ErrorCode::ReplicaUnavailable,
                "The session's turn is held by another replica.",
            ))
        }
        Err(e) => return Err(e.into()),
    };
    let stop = CancellationToken::new();
    let answered_uses;
    {
        let mut s = live.state.lock();
        s.transcript = messages;
        let answered: Vec<String> = s.waiting.drain(..).map(|w| w.event_id).collect();
        answered_uses = answered;
        s.results.clear();
        s.phase = Phase::Running;
        s.interrupt = Some(stop.clone());
        if s.execution.as_deref() != Some(&leg.execution_id) {
            // A fresh turn: its execution's spend adds to what the session spent before.
            s.base = s.spent();
            s.tool_uses.clear();
            s.execution_spent = leg.spent.clone();
            s.execution = Some(leg.execution_id.to_string());
        }
    }
    let mut events = echoes;
    events.push(event("session.status_running", json!({})));
    let running = live.rewrite(m, |s| {
        s["status"] = json!("running");
        Ok(())
    });
    let logged = match running.await {
        Ok(_) => live.append(m, events).await.map(|_| ()),
        Err(e) => Err(e),
    };
    if let Err(e) = logged {
        // The engine has claimed the continuation, but the store cannot log the turn: it
        // ends here, its leg dropped (which interrupts it), the uses it answered settled (a
        // resend is 410), and the session idle again, not running with nobody reading it.
        drop(leg);
        settle(live);
        live.state.lock().settled.extend(answered_uses);
        let idle = live.rewrite(m, |s| {
            s["status"] = json!("idle");
            Ok(())
        });
        let _ = idle.await;
        return Err(e);
    }
    let (m, live) = (m.clone(), live.clone());
    let engine = m.engine().clone();
    engine.spawn(async move { consume(m, live, leg, stop).await });
    Ok(())
}

/// The leg's events as the session's, until it ends, fails or is interrupted.
async fn consume(m: Managed, live: Arc<Live>, mut leg: Leg, stop: CancellationToken) {
    let start = event("span.model_request_start", json!({}));
    let start_id = start["id"].clone();
    if live.append(&m, vec![start]).await.is_err() {
        return;
    }
    let mut text = String::new();
    let mut thinking = false;
    let (mut approvals, mut watching) = (m.engine().approvals().subscribe(), true);
    loop {
        let next = tokio::select! {
            _ = stop.cancelled() => {
                drop(leg);
                return interrupted(&m, &live).await;
            }
            settled = approvals.recv(), if watching => {
                match settled {
                    Ok(ev) => confirm::on_settled(&m, &live, &ev).await,
                    Err(RecvError::Closed) => watching = false,
                    // Missed settlements: a confirmation of one answers 410.
                    Err(RecvError::Lagged(_)) => {}
                }
                continue;
            }
            next = leg.events.recv() => next,
        };
        match next {
            Some(LegEvent::Delta(d)) => text.push_str(&d),
            Some(LegEvent::Reasoning(_)) if !thinking => {
                thinking = true;
                let _ = live
                    .append(&m, vec![event("agent.thinking", json!({}))])
                    .await;
            }
            Some(LegEvent::Approval(n)) => confirm::on_approval(&m, &live, n).await,
            Some(LegEvent::ToolEnded(t)) => confirm::on_tool_ended(&m, &live, t).await,
            Some(LegEvent::End { calls, usage }) => {
                let held = (start_id, leg.deadline);
                return ended(&m, &live, (text, calls, usage), held).await;
            }
            Some(LegEvent::Error(e)) => return failed(&m, &live, e.into()).await,
            None => return failed(&m, &live, EngineError::TurnFailed.into()).await,
            Some(_) => {}
        }
    }
}

/// A leg's end: its message, its usage, and the uses it waits on or the turn's end.
async fn ended(
    m: &Managed,
    live: &Arc<Live>,
    (text, calls, usage): (String, Vec<ExposedCall>, Usage),
    (start_id, deadline): (Value, tokio::time::Instant),
) {
    let mut events = Vec::new();
    if !text.is_empty() {
        events.push(event(
            "agent.message",
            json!({"content": [{"type": "text", "text": text}]}),
        ));
    }
    events.push(event(
        "span.model_request_end",
        json!({
            "model_request_start_id": start_id,
            "is_error": false,
            "model_usage": model_usage(&usage),
        }),
    ));
    let mut waiting = Vec::new();
    let mut answer = message(Role::Assistant, &text);
    for c in &calls {
        let input: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
        let e = event(
            "agent.custom_tool_use",
            json!({"name": c.name, "input": input}),
        );
        waiting.push(Waiting {
            event_id: e["id"].as_str().unwrap_or_default().to_string(),
            token: c.id.clone(),
        });
        answer.tool_calls.push(Call {
            id: c.id.clone(),
            name: c.name.clone(),
            arguments: c.arguments.clone(),
        });
        events.push(e);
    }
    // A held turn over the session's budget is not kept waiting: it ends here.
    let (left, spent) = live.budget_left();
    let over = left == Some(0) && !waiting.is_empty();
    if over {
        let tokens: Vec<String> = waiting.drain(..).map(|w| w.token).collect();
        m.engine().withdraw(&live.principal, &tokens).await;
        let settled = events
            .iter()
            .filter(|e| e["type"] == "agent.custom_tool_use");
        let ids: Vec<String> = settled
            .filter_map(|e| e["id"].as_str().map(String::from))
            .collect();
        live.state.lock().settled.extend(ids);
    }
    let ids: Vec<&str> = waiting.iter().map(|w| w.event_id.as_str()).collect();
    let stop = match (over, ids.is_empty()) {
        (true, _) => json!({"type": "budget_reached"}),
        (false, true) => json!({"type": "end_turn"}),
        (false, false) => json!({"type": "requires_action", "event_ids": ids}),
    };
    events.push(idle(stop));
    let more = {
        let mut s = live.state.lock();
        s.transcript.push(answer);
        // Messages sent while it ran start the next turn (the session stays running).
        let more = waiting.is_empty() && !s.queued.is_empty();
        s.phase = match (waiting.is_empty(), more) {
            (false, _) => Phase::Waiting,
            (true, true) => Phase::Running,
            (true, false) => Phase::Idle,
        };
        s.waiting = waiting;
        s.results.clear();
        s.interrupt = None;
        let unconfirmed: Vec<String> = s.confirming.drain(..).map(|c| c.event_id).collect();
        s.settled.extend(unconfirmed);
        more
    };
    if let Some(first) = live.state.lock().waiting.first() {
        expire_at(m, live, first.event_id.clone(), deadline);
    }
    // The object first: a client that saw the idle event reads the session idle.
    let status = if more { "running" } else { "idle" };
    let _ = live
        .rewrite(m, |s| {
            s["status"] = json!(status);
            add_usage(&mut s["usage"], &usage, spent);
            Ok(())
        })
        .await;
    let _ = live.append(m, events).await;
    if more {
        let _gate = live.gate.lock().await;
        fresh(m, live).await;
    }
}

/// The turn failed (or could not start): the session says why and is idle.
async fn failed(m: &Managed, live: &Arc<Live>, e: ApiError) {
    let (kind, stop) = match e.code {
        ErrorCode::BudgetExceeded | ErrorCode::ExecutionBudgetExceeded => {
            ("billing_error", "budget_reached")
        }
        ErrorCode::RateLimited | ErrorCode::CapacityExhausted => {
            ("model_rate_limited_error", "retries_exhausted")
        }
        ErrorCode::UpstreamError | ErrorCode::UpstreamTimeout | ErrorCode::UpstreamRejected => {
            ("model_request_failed_error", "retries_exhausted")
        }
        _ => ("unknown_error", "retries_exhausted"),
    };
    let error =
        json!({"type": kind, "message": e.to_string(), "retry_status": {"type": "terminal"}});
    let events = vec![
        event("session.error", json!({"error": error})),
        idle(json!({"type": stop})),
    ];
    ended_early(m, live, events).await;
}

/// The turn ends before its leg did: what waits is settled, `events` are logged and the
/// session is idle, its spend as it stands.
async fn ended_early(m: &Managed, live: &Arc<Live>, events: Vec<Value>) {
    settle(live);
    let spent = live.state.lock().spent();
    let _ = live
        .rewrite(m, |s| {
            s["status"] = json!("idle");
            add_usage(&mut s["usage"], &Usage::default(), spent);
            Ok(())
        })
        .await;
    let _ = live.append(m, events).await;
}

/// A held turn still waiting at its execution's deadline has expired: its uses are settled
/// (410), and the session says why and goes idle (`retries_exhausted`). `first`, the first
/// use it waits on, tells it from a later hold of the same session.
fn expire_at(m: &Managed, live: &Arc<Live>, first: String, deadline: tokio::time::Instant) {
    let (m, weak, stop) = (m.clone(), Arc::downgrade(live), m.engine().stopping());
    let engine = m.engine().clone();
    engine.spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => return,
            // After the engine's own timer, which settles the held turn as expired.
            _ = tokio::time::sleep_until(deadline + std::time::Duration::from_millis(100)) => {}
        }
        let Some(live) = weak.upgrade() else { return };
        let _gate = live.gate.lock().await;
        let tokens: Vec<String> = {
            let s = live.state.lock();
            if s.waiting.first().is_none_or(|w| w.event_id != first) {
                return;
            }
            s.waiting.iter().map(|w| w.token.clone()).collect()
        };
        // The engine's timer settles it too; whichever is first, the other finds it settled.
        m.engine().withdraw(&live.principal, &tokens).await;
        let error = json!({"type": "unknown_error", "retry_status": {"type": "terminal"},
            "message": "The custom tool uses were not answered in time: the held turn expired."});
        let events = vec![
            event("session.error", json!({"error": error})),
            idle(json!({"type": "retries_exhausted"})),
        ];
        ended_early(&m, &live, events).await;
    });
}

/// The session's budget is spent: no turn starts.
fn budget_spent() -> ApiError {
    ApiError::new(
        ErrorCode::ExecutionBudgetExceeded,
        "The session's budget is spent; raise it to go on.",
    )
}

/// The turn was interrupted: the session is idle (`user.interrupt` was logged).
pub(super) async fn interrupted(m: &Managed, live: &Arc<Live>) {
    ended_early(m, live, vec![idle(json!({"type": "end_turn"}))]).await;
}

/// The turn is over without its waiting uses' results: they are settled (410).
pub(super) fn settle(live: &Live) {
    let mut s = live.state.lock();
    let left: Vec<String> = s.waiting.drain(..).map(|w| w.event_id).collect();
    s.settled.extend(left);
    let unconfirmed: Vec<String> = s.confirming.drain(..).map(|c| c.event_id).collect();
    s.settled.extend(unconfirmed);
    s.results.clear();
    s.phase = Phase::Idle;
    s.interrupt = None;
}

/// Withdraws a held turn's calls: the engine settles it as cancelled.
pub(super) fn withdraw(m: &Managed, principal: &str, tokens: &[String]) {
    let (engine, principal, tokens) = (m.engine().clone(), principal.to_string(), tokens.to_vec());
    let task = engine.clone();
    task.spawn(async move {
        engine.withdraw(&principal, &tokens).await;
    });
}

fn model_usage(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens.saturating_sub(u.cached_tokens + u.cache_write_tokens),
        "output_tokens": u.completion_tokens,
        "cache_creation_input_tokens": u.cache_write_tokens,
        "cache_read_input_tokens": u.cached_tokens,
    })
}

/// Adds a leg's usage to the session's totals; a priced session's cost is now `spent`.
fn add_usage(total: &mut Value, u: &Usage, spent: u64) {
    if total.get("list_cost").is_some() {
        total["list_cost"] = super::budget::amount(spent);
    }
    let add = |v: &mut Value, n: u64| *v = json!(v.as_u64().unwrap_or(0).saturating_add(n));
    let m = model_usage(u);
    add(
        &mut total["input_tokens"],
        m["input_tokens"].as_u64().unwrap_or(0),
    );
    add(&mut total["output_tokens"], u.completion_tokens);
    add(&mut total["cache_read_input_tokens"], u.cached_tokens);
    add(
        &mut total["cache_creation"]["ephemeral_5m_input_tokens"],
        u.cache_write_tokens,
    );
}
