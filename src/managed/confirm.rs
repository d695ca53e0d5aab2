//! The backend's own tools in a session: each side effect the approval policy sees is an
//! `agent.tool_use` event with its `evaluated_permission`. One that asks is a durable approval
//! of the one queue (the console and `/v1/approvals` show it); the session goes idle with
//! `requires_action` naming it, and `user.tool_confirmation` decides it (once): `allow` lets it
//! run, `deny` declines it with the `deny_message` given to the model where the backend can
//! carry one (Claude Code). Decided elsewhere (the console, `/v1/approvals`), expired or
//! cancelled, it stops waiting as well; when none waits the session runs again.

use std::sync::Arc;

use serde_json::{json, Value};

use super::log::{event, idle, Live};
use super::Managed;
use crate::approvals::{ApprovalEvent, DecideError, EventKind};
use crate::auth::Principal;
use crate::backend::{ApprovalKind, ToolEnded};
use crate::config::Decision;
use crate::engine::ApprovalNotice;
use crate::error::{ApiError, ErrorCode};

/// An `agent.tool_use` that waits on its confirmation.
#[derive(Debug, Clone)]
pub(super) struct Confirming {
    pub event_id: String,
    pub approval_id: String,
}

/// A `user.tool_confirmation`, checked.
pub(super) struct Confirmation {
    pub use_id: String,
    pub allow: bool,
    pub deny_message: Option<String>,
}

/// The tool a side effect is, as the toolset names it, and its input (the redacted summary
/// approvers see, without the backend's own reasoning).
fn tool_of(n: &ApprovalNotice) -> (String, Value) {
    let mut input = n.summary.clone();
    if let Some(o) = input.as_object_mut() {
        o.remove("backend_reason");
    }
    let named = n.summary["tool"].as_str().map(str::to_lowercase);
    let name = match n.kind {
        ApprovalKind::Command => "bash".to_string(),
        ApprovalKind::FileChange => named.unwrap_or_else(|| "edit".into()),
        ApprovalKind::Permissions => named.unwrap_or_else(|| "permissions".into()),
        ApprovalKind::Elicitation => "elicitation".into(),
    };
    (name, input)
}

/// A side effect the policy answered or parked: its `agent.tool_use`, and for one that asks,
/// the session idle until it is confirmed.
pub(super) async fn on_approval(m: &Managed, live: &Arc<Live>, n: ApprovalNotice) {
    let (name, input) = tool_of(&n);
    let (permission, evaluation) = match n.decision {
        Decision::Allow => ("allow", json!({"type": "always_allow"})),
        Decision::Ask => ("ask", json!({"type": "always_ask"})),
        // Refused before any of the session's policies applied: the administrator's deny.
        Decision::Deny => ("deny", Value::Null),
    };
    let mut e = event(
        "agent.tool_use",
        json!({"name": name, "input": input, "evaluated_permission": permission}),
    );
    if !evaluation.is_null() {
        e["evaluation"] = evaluation;
    }
    let mut events = vec![e.clone()];
    if let Some(tool_use) = n.tool_use {
        let mut s = live.state.lock();
        // One turn's uses; a backend that never reports their end cannot grow it without end.
        if s.tool_uses.len() >= MAX_OPEN_USES {
            s.tool_uses.clear();
        }
        let id = e["id"].as_str().unwrap_or_default().to_string();
        s.tool_uses.insert(tool_use, id);
    }
    if let (Decision::Ask, Some(approval_id)) = (n.decision, n.approval_id) {
        let waiting = {
            let mut s = live.state.lock();
            s.confirming.push(Confirming {
                event_id: e["id"].as_str().unwrap_or_default().to_string(),
                approval_id,
            });
            s.confirming
                .iter()
                .map(|c| c.event_id.clone())
                .collect::<Vec<_>>()
        };
        events.push(idle(
            json!({"type": "requires_action", "event_ids": waiting}),
        ));
        set_status(m, live, "idle").await;
        let _ = live.append(m, events).await;
        return;
    }
    let _ = live.append(m, events).await;
}

/// The `agent.tool_use` events a session remembers at once, waiting for their results.
const MAX_OPEN_USES: usize = 256;

/// A use of the backend's own tool ended: its `agent.tool_result`, if its `agent.tool_use` was
/// logged (the backend's other tool activity, and the client's held calls, are not).
pub(super) async fn on_tool_ended(m: &Managed, live: &Arc<Live>, t: ToolEnded) {
    let Some(use_id) = live.state.lock().tool_uses.remove(&t.tool_use) else {
        return;
    };
    let content = match t.output.is_empty() {
        true => json!([]),
        false => json!([{"type": "text", "text": t.output}]),
    };
    let e = event(
        "agent.tool_result",
        json!({"tool_use_id": use_id, "content": content, "is_error": t.is_error}),
    );
    let _ = live.append(m, vec![e]).await;
}

/// An approval settled by anyone: if the session waited on it, it no longer does.
pub(super) async fn on_settled(m: &Managed, live: &Arc<Live>, ev: &ApprovalEvent) {
    if ev.kind == EventKind::Created {
        return;
    }
    let last = {
        let mut s = live.state.lock();
        let Some(i) = s
            .confirming
            .iter()
            .position(|c| c.approval_id == ev.record.id)
        else {
            return;
        };
        let c = s.confirming.remove(i);
        match ev.kind {
            EventKind::Decided => s.answered.insert(c.event_id),
            _ => s.settled.insert(c.event_id),
        };
        s.confirming.is_empty()
    };
    if last {
        resumed(m, live).await;
    }
}

/// `user.tool_confirmation` (checked: the session waits on `c.use_id`): decides its approval
/// as the sender, then logs `echo`. Settled meanwhile (expired, cancelled, decided elsewhere):
/// 410 and nothing is logged.
pub(super) async fn confirm(
    m: &Managed,
    live: &Arc<Live>,
    who: &Principal,
    c: Confirmation,
    echo: Value,
) -> Result<(), ApiError> {
    // Taken out first: the settlement's broadcast finds nothing left to do.
    let taken = {
        let mut s = live.state.lock();
        let i = s.confirming.iter().position(|w| w.event_id == c.use_id);
        i.map(|i| s.confirming.remove(i))
    };
    let Some(waiting) = taken else {
        return Err(lost());
    };
    // The echo is logged before whatever the decision sets off in the backend.
    let order = live.order().await;
    let approvals = m.engine().approvals();
    let decided = approvals
        .decide_telling(
            &waiting.approval_id,
            c.allow,
            c.deny_message.as_deref(),
            who,
            true,
        )
        .await;
    // Decided or not, it waits no more (a failed decision was answered deny).
    let last = {
        let mut s = live.state.lock();
        match decided {
            Ok(_) => s.answered.insert(waiting.event_id),
            Err(_) => s.settled.insert(waiting.event_id),
        };
        s.confirming.is_empty()
    };
    let failure = match decided {
        Ok(_) => None,
        Err(DecideError::Store(e)) => Some(super::store_failed(e)),
        Err(_) => Some(lost()),
    };
    if failure.is_none() {
        let mut events = vec![echo];
        if last {
            events.push(event("session.status_running", json!({})));
        }
        if last {
            set_status(m, live, "running").await;
        }
        let logged = live.append_ordered(m, events, &order).await;
        return logged.map(|_| ());
    }
    drop(order);
    if last {
        resumed(m, live).await;
    }
    failure.map_or(Ok(()), Err)
}

/// Nothing waits on a confirmation any more: the turn runs again.
async fn resumed(m: &Managed, live: &Arc<Live>) {
    set_status(m, live, "running").await;
    let running = event("session.status_running", json!({}));
    let _ = live.append(m, vec![running]).await;
}

async fn set_status(m: &Managed, live: &Arc<Live>, status: &'static str) {
    let _ = live
        .rewrite(m, |s| {
            s["status"] = json!(status);
            Ok(())
        })
        .await;
}

fn lost() -> ApiError {
    ApiError::new(
        ErrorCode::ContinuationLost,
        "This tool use is no longer waiting on a confirmation (decided elsewhere, expired, or its turn ended).",
    )
}
