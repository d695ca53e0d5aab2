//! Dynamic tool calls: the `item/tool/call` round trip and how its answer is interpreted.

use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::state::ToolSpec;
use crate::turn::{Step, Stopped, Turn};
use crate::util::rand_hex;

pub(crate) struct ToolOutcome {
    pub(crate) success: Option<bool>,
    pub(crate) text: String,
    pub(crate) error: Value,
    pub(crate) content_items: Value,
}

/// Interprets an answer to `item/tool/call` the way the real binary does.
pub(crate) fn tool_outcome(answer: &Value) -> ToolOutcome {
    let failed = |text: &str, error: Value| ToolOutcome {
        success: None,
        text: text.to_owned(),
        error,
        content_items: json!([{"type": "inputText", "text": text}]),
    };
    if let Some(err) = answer.get("error") {
        return failed("dynamic tool request failed", err.clone());
    }
    let parsed = answer.get("result").and_then(|r| {
        let success = r.get("success")?.as_bool()?;
        let mut text = String::new();
        for item in r.get("contentItems")?.as_array()? {
            match item.get("type")?.as_str()? {
                "inputText" => text.push_str(item.get("text")?.as_str()?),
                "inputImage" => _ = item.get("imageUrl")?.as_str()?,
                "inputAudio" => _ = item.get("audioUrl")?.as_str()?,
                _ => return None,
            }
        }
        Some((success, text, r["contentItems"].clone()))
    });
    match parsed {
        Some((success, text, items)) => ToolOutcome {
            success: Some(success),
            text,
            error: Value::Null,
            content_items: items,
        },
        None => failed("dynamic tool response was invalid", Value::Null),
    }
}

/// Emits `item/started` plus the `item/tool/call` request; returns the call item and receiver.
pub(crate) fn start_call(
    turn: &Turn,
    tool: &ToolSpec,
    args: Value,
) -> Step<(Value, oneshot::Receiver<Value>)> {
    let call_id = format!("call_{}", rand_hex::<12>());
    turn.usage_pending()?;
    let item = json!({"type": "dynamicToolCall", "id": call_id, "namespace": tool.namespace,
        "tool": tool.name, "arguments": args, "status": "inProgress", "contentItems": null,
        "success": null});
    turn.item_started(item.clone())?;
    let params = json!({"threadId": turn.thread, "turnId": turn.id, "callId": call_id,
        "namespace": tool.namespace, "tool": tool.name, "arguments": args});
    let (_, rx) = turn.request("item/tool/call", params, Some(item.clone()))?;
    Ok((item, rx))
}

/// Waits for the answer, emits the completed item and returns the tool output text.
pub(crate) async fn finish_call(
    turn: &Turn,
    (mut item, rx): (Value, oneshot::Receiver<Value>),
) -> Step<String> {
    let answer = rx.await.map_err(|_| Stopped)?;
    let outcome = tool_outcome(&answer);
    let success = outcome.success.unwrap_or(false);
    item["status"] = json!(if success { "completed" } else { "failed" });
    item["success"] = json!(success);
    item["contentItems"] = outcome.content_items;
    item["durationMs"] = json!(1);
    let id = item["id"].clone();
    turn.guarded(|st| {
        if let Some(active) = st.active_mut(&turn.thread) {
            active.open_calls.retain(|c| c["id"] != id);
        }
    })?;
    turn.item_completed(item)?;
    Ok(outcome.text)
}
