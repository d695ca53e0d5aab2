//! The bodies of notifications: ids, kinds, principals, reasons and the summaries the console
//! already shows; never a prompt, an argument, a result, a token or a key.
//!
//! `standard`: `{"type", "timestamp", "data"}` (the Standard Webhooks payload structure).
//! `slack`: a Block Kit message (`text` for notifications, `blocks` for the channel).

use serde_json::{json, Value};

use crate::approvals::to_json;
use crate::config::WebhookFormat;
use crate::ids::new_id;
use crate::managed::wire::rfc3339;
use crate::store::Change;

/// The event name of a change (None: no event, e.g. an execution that completed is only
/// `execution.ended`).
pub fn events<'a>(change: &Change<'a>) -> &'a [&'static str] {
    match change {
        Change::ApprovalPending(_) => &["approval.pending"],
        Change::ApprovalDecided(_) => &["approval.decided"],
        Change::Held(_) => &["turn.requires_action"],
        Change::Ended(e) if failed(e.reason) => &["execution.failed", "execution.ended"],
        Change::Ended(_) => &["execution.ended"],
        Change::Session { events, .. } => events,
        Change::Budget(_) => &["budget.threshold"],
    }
}

/// The `webhook-id` of a change's row for `endpoint`: fresh, except a budget threshold's,
/// which names the endpoint, principal, cap, window, limit and threshold (every replica
/// that sees it crossed writes the same row, so it is sent once).
pub fn id(change: &Change<'_>, endpoint: &str) -> String {
    let Change::Budget(c) = change else {
        return new_id("msg_");
    };
    let key = format!(
        "{endpoint}\n{}\n{}\n{}\n{}\n{}",
        c.principal, c.cap, c.window, c.limit, c.percent
    );
    let d = crate::digest::sha256(key.as_bytes());
    format!("msg_{}", hex::encode(&d[..16]))
}

/// The endings that are failures (not a completion, a client's cancel or interruption).
fn failed(reason: &str) -> bool {
    !matches!(reason, "completed" | "cancelled" | "interrupted")
}

/// The principal a change belongs to.
pub fn principal<'a>(change: &Change<'a>) -> &'a str {
    match change {
        Change::ApprovalPending(r) | Change::ApprovalDecided(r) => &r.principal,
        Change::Held(h) => h.principal,
        Change::Ended(e) => e.principal,
        Change::Session { principal, .. } => principal,
        Change::Budget(c) => c.principal,
    }
}

/// What a change says, in the standard payload's `data`.
pub fn data(change: &Change<'_>) -> Value {
    match change {
        Change::ApprovalPending(r) | Change::ApprovalDecided(r) => to_json(r),
        Change::Held(h) => json!({
            "object": "held_turn",
            "execution_id": h.execution_id,
            "client": h.principal,
            "model": h.model,
            "surface": h.surface,
            "calls": h.calls,
            "expires_at": h.deadline_ms / 1000,
        }),
        Change::Ended(e) => json!({
            "object": "execution",
            "execution_id": e.execution_id,
            "client": e.principal,
            "model": e.model,
            "reason": e.reason,
        }),
        Change::Session {
            session_id,
            principal,
            ..
        } => json!({"id": session_id, "client": principal}),
        Change::Budget(c) => {
            let usd = !c.cap.starts_with("tokens");
            let amount = |n: u64| match usd {
                true => json!(crate::budget::usd(n)),
                false => json!(n),
            };
            json!({
                "object": "budget_threshold",
                "client": c.principal,
                "cap": c.cap,
                "threshold": c.percent,
                "limit": amount(c.limit),
                "used": amount(c.used),
                "unit": if usd { "usd" } else { "tokens" },
                "resets_at": c.resets_at,
            })
        }
    }
}

/// The single-use decision links of a pending approval's message.
pub struct Buttons {
    pub approve: String,
    pub deny: String,
}

/// A whole body; `id` is also its `webhook-id`.
pub fn render(
    format: WebhookFormat,
    id: &str,
    event: &str,
    data: &Value,
    at_ms: u64,
    buttons: Option<&Buttons>,
) -> String {
    match format {
        WebhookFormat::Standard if event.starts_with("session.") => {
            anthropic(id, event, data, at_ms)
        }
        WebhookFormat::Standard => {
            json!({"type": event, "timestamp": rfc3339(at_ms), "data": data}).to_string()
        }
        WebhookFormat::Slack => slack(event, data, buttons).to_string(),
    }
}

/// A Managed Agents session event as Anthropic's webhooks send it (what the SDK's
/// `client.beta.webhooks.unwrap` parses): a thin event naming the session. The gateway is
/// one organization; the session's principal is its workspace.
fn anthropic(id: &str, event: &str, data: &Value, at_ms: u64) -> String {
    json!({
        "type": "event",
        "id": id,
        "created_at": rfc3339(at_ms),
        "data": {
            "type": event,
            "id": data["id"],
            "organization_id": "turnstile",
            "workspace_id": data["client"],
        },
    })
    .to_string()
}

/// A Block Kit message: a headline, the facts as fields, the summary as a code block, and
/// for a pending approval its Approve and Deny links. `metadata` names the event and the
/// object, so a Slack app can find the message of an approval when it is decided.
fn slack(event: &str, data: &Value, buttons: Option<&Buttons>) -> Value {
    let s = |k: &str| data.get(k).and_then(Value::as_str).unwrap_or("");
    let headline = match event {
        "approval.pending" => format!("Approval needed: {} by {}", s("kind"), s("client")),
        "approval.decided" => format!(
            "Approval {}: {} ({})",
            s("state"),
            s("kind"),
            data.get("decided_by")
                .and_then(Value::as_str)
                .or(data.get("reason").and_then(Value::as_str))
                .unwrap_or("")
        ),
        "turn.requires_action" => format!("A turn of {} waits for its tools", s("client")),
        "execution.failed" => format!("An execution of {} failed: {}", s("client"), s("reason")),
        "execution.ended" => format!("An execution of {} ended: {}", s("client"), s("reason")),
        "budget.threshold" => format!(
            "{} has used {}% of its {} budget",
            s("client"),
            data["threshold"],
            s("cap")
        ),
        session if session.starts_with("session.") => {
            format!(
                "Session {} of {}: {}",
                s("id"),
                s("client"),
                &session["session.".len()..]
            )
        }
        other => format!("Turnstile: {other}"),
    };
    let mut fields = Vec::new();
    for k in ["id", "execution_id", "model", "client", "state", "reason"] {
        if let Some(v) = data.get(k).and_then(Value::as_str) {
            fields.push(json!({"type": "mrkdwn", "text": format!("*{k}*\n{}", escape(v))}));
        }
    }
    if let Some(at) = data.get("expires_at").and_then(Value::as_u64) {
        let text = format!(
            "*expires*\n<!date^{at}^{{date_short_pretty}} {{time}}|{}>",
            rfc3339(at * 1000)
        );
        fields.push(json!({"type": "mrkdwn", "text": text}));
    }
    let mut blocks = vec![
        json!({"type": "header", "text": {"type": "plain_text", "text": cut(&headline, 150)}}),
        json!({"type": "section", "fields": fields}),
    ];
    if let Some(summary) = data.get("summary").filter(|v| !v.is_null()) {
        let text = format!("```{}```", cut(&escape(&summary.to_string()), 2900));
        blocks.push(json!({"type": "section", "text": {"type": "mrkdwn", "text": text}}));
    }
    if let Some(b) = buttons {
        let button = |text: &str, style: &str, url: &str| {
            json!({"type": "button", "action_id": text.to_lowercase(), "style": style,
                   "text": {"type": "plain_text", "text": text}, "url": url})
        };
        blocks.push(json!({"type": "actions", "elements": [
            button("Approve", "primary", &b.approve),
            button("Deny", "danger", &b.deny),
        ]}));
    }
    let metadata = json!({
        "event_type": event.replace('.', "_"),
        "event_payload": {"id": data.get("id"), "execution_id": data.get("execution_id")},
    });
    json!({"text": headline, "blocks": blocks, "metadata": metadata})
}

/// Slack's three control characters.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// At most `n` characters.
fn cut(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Ended;

    #[test]
    fn an_ending_is_a_failure_unless_it_completed_or_the_client_stopped_it() {
        let end = |reason| {
            Change::Ended(Ended {
                execution_id: "exe-1",
                principal: "alice",
                model: "m",
                reason,
            })
        };
        assert_eq!(events(&end("completed")), ["execution.ended"]);
        assert_eq!(
            events(&end("lost")),
            ["execution.failed", "execution.ended"]
        );
        let body = render(
            WebhookFormat::Standard,
            "msg_1",
            "execution.failed",
            &data(&end("lost")),
            0,
            None,
        );
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["type"], "execution.failed");
        assert_eq!(v["timestamp"], "1970-01-01T00:00:00.000Z");
        assert_eq!(v["data"]["reason"], "lost");
        let slack: Value = serde_json::from_str(&render(
            WebhookFormat::Slack,
            "msg_1",
            "execution.failed",
            &data(&end("lost")),
            0,
            None,
        ))
        .unwrap();
        assert_eq!(slack["blocks"][0]["type"], "header");
        assert!(slack["text"].as_str().unwrap().contains("failed: lost"));
    }

    #[test]
    fn slack_text_is_escaped_and_cut() {
        assert_eq!(escape("<a&b>"), "&lt;a&amp;b&gt;");
        assert_eq!(cut("ééé", 2), "éé…");
    }
}
