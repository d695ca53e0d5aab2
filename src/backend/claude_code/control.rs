//! Claude Code's stream-json framing, both ways: one JSON object per line. Data frames
//! (`user`, `assistant`, `system`, `result`, `stream_event`, `tool_progress`) and control
//! frames (`control_request`, `control_response`, `control_cancel_request`). A line is read
//! as a borrowed envelope and only the members the gateway acts on are built: most lines
//! are `stream_event`s, whose `event` is small, or `assistant`/`user` echoes, which are
//! skipped unbuilt. A line that is not JSON, or of a type the gateway does not read, is
//! `Frame::Other`, never fatal.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

/// One line from the CLI, classified.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// A Messages API streaming event of a model call: the session's own (`parent` None) or
    /// a subagent's (the `tool_use` id of the call that started it).
    Stream {
        event: Value,
        parent: Option<String>,
    },
    /// The CLI asks the host something (`mcp_message`, `can_use_tool`, `hook_callback`).
    Request {
        id: String,
        request: Value,
    },
    /// The answer to one of the host's requests.
    Response {
        id: String,
        result: Result<Value, String>,
    },
    /// The CLI withdraws one of its requests (its turn was interrupted).
    Cancel {
        id: String,
    },
    /// The turn ended: `subtype` `success` or an `error_*`.
    Result {
        subtype: String,
        is_error: bool,
    },
    /// The session's own tool uses that ended, from the `user` message carrying their
    /// `tool_result` blocks back to the model.
    ToolResults(Vec<crate::backend::ToolEnded>),
    Other,
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(rename = "type", borrow)]
    kind: &'a str,
    #[serde(default, borrow)]
    event: Option<&'a RawValue>,
    #[serde(default)]
    parent_tool_use_id: Option<String>,
    #[serde(default)]
    request_id: Option<String>,
    #[serde(default, borrow)]
    request: Option<&'a RawValue>,
    #[serde(default, borrow)]
    response: Option<&'a RawValue>,
    #[serde(default, borrow)]
    message: Option<&'a RawValue>,
    #[serde(default)]
    subtype: Option<String>,
    #[serde(default)]
    is_error: Option<bool>,
}

#[derive(Deserialize)]
struct Answer {
    subtype: String,
    request_id: String,
    #[serde(default)]
    response: Option<Value>,
    #[serde(default)]
    error: Option<String>,
}

fn tree(raw: Option<&RawValue>) -> Option<Value> {
    serde_json::from_str(raw?.get()).ok()
}

/// Classifies one line.
pub fn parse(line: &[u8]) -> Frame {
    let Ok(e) = serde_json::from_slice::<Envelope<'_>>(line) else {
        return Frame::Other;
    };
    let parsed = match e.kind {
        "stream_event" => tree(e.event).map(|event| Frame::Stream {
            event,
            parent: e.parent_tool_use_id,
        }),
        "control_request" => Some(Frame::Request {
            id: e.request_id.unwrap_or_default(),
            request: tree(e.request).unwrap_or(Value::Null),
        }),
        "control_response" => e
            .response
            .and_then(|r| serde_json::from_str::<Answer>(r.get()).ok())
            .map(|a| Frame::Response {
                id: a.request_id,
                result: match a.subtype.as_str() {
                    "success" => Ok(a.response.unwrap_or(Value::Null)),
                    _ => Err(a.error.unwrap_or_default()),
                },
            }),
        "control_cancel_request" => e.request_id.map(|id| Frame::Cancel { id }),
        "user" if e.parent_tool_use_id.is_none() => tree(e.message).map(|m| tool_results(&m)),
        "result" => Some(Frame::Result {
            subtype: e.subtype.unwrap_or_default(),
            is_error: e.is_error.unwrap_or(false),
        }),
        _ => None,
    };
    parsed.unwrap_or(Frame::Other)
}

/// The `tool_result` blocks of a `user` message: each one's text, and whether it failed.
fn tool_results(message: &Value) -> Frame {
    let blocks = message["content"].as_array().into_iter().flatten();
    let ended = blocks
        .filter(|b| b["type"] == "tool_result")
        .filter_map(|b| {
            let id = b["tool_use_id"].as_str()?;
            let text = match &b["content"] {
                Value::String(s) => s.clone(),
                Value::Array(parts) => parts
                    .iter()
                    .filter_map(|p| p["text"].as_str())
                    .collect::<Vec<_>>()
                    .join("\n"),
                _ => String::new(),
            };
            let failed = b["is_error"].as_bool().unwrap_or(false);
            Some(crate::backend::ToolEnded::new(id, &text, failed))
        })
        .collect::<Vec<_>>();
    match ended.is_empty() {
        true => Frame::Other,
        false => Frame::ToolResults(ended),
    }
}

/// A user message: the turn's input.
pub fn user(text: &str) -> String {
    line(json!({
        "type": "user",
        "message": {"role": "user", "content": [{"type": "text", "text": text}]},
        "parent_tool_use_id": null,
        "session_id": "default",
    }))
}

/// A request of the host's (`initialize`, `interrupt`).
pub fn request(id: &str, request: Value) -> String {
    line(json!({"type": "control_request", "request_id": id, "request": request}))
}

/// The host's answer to one of the CLI's requests.
pub fn success(id: &str, response: Value) -> String {
    line(json!({"type": "control_response",
                "response": {"subtype": "success", "request_id": id, "response": response}}))
}

pub fn error(id: &str, message: &str) -> String {
    line(json!({"type": "control_response",
                "response": {"subtype": "error", "request_id": id, "error": message}}))
}

/// The answer to an `mcp_message` request: its JSON-RPC response.
pub fn mcp(id: &str, rpc_id: &Value, result: Result<Value, (i64, &str)>) -> String {
    let message = match result {
        Ok(result) => json!({"jsonrpc": "2.0", "id": rpc_id, "result": result}),
        Err((code, message)) => {
            json!({"jsonrpc": "2.0", "id": rpc_id, "error": {"code": code, "message": message}})
        }
    };
    success(id, json!({"mcp_response": message}))
}

fn line(v: Value) -> String {
    let mut s = v.to_string();
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_classified_by_type() {
        let f = parse(br#"{"type":"stream_event","event":{"type":"message_stop"},"parent_tool_use_id":null,"session_id":"s"}"#);
        assert_eq!(
            f,
            Frame::Stream {
                event: json!({"type": "message_stop"}),
                parent: None
            }
        );
        let f = parse(br#"{"type":"stream_event","event":{"type":"message_stop"},"parent_tool_use_id":"toolu_1"}"#);
        assert!(matches!(f, Frame::Stream { parent: Some(p), .. } if p == "toolu_1"));
        let f = parse(br#"{"type":"control_request","request_id":"r1","request":{"subtype":"mcp_message","server_name":"t","message":{"method":"tools/list","jsonrpc":"2.0","id":1}}}"#);
        let Frame::Request { id, request } = f else {
            panic!("{f:?}")
        };
        assert_eq!(id, "r1");
        assert_eq!(request["message"]["method"], "tools/list");
        assert_eq!(
            parse(br#"{"type":"control_response","response":{"subtype":"success","request_id":"req_1","response":{"commands":[]}}}"#),
            Frame::Response {
                id: "req_1".into(),
                result: Ok(json!({"commands": []}))
            }
        );
        assert_eq!(
            parse(br#"{"type":"control_response","response":{"subtype":"error","request_id":"req_2","error":"nope"}}"#),
            Frame::Response {
                id: "req_2".into(),
                result: Err("nope".into())
            }
        );
        assert_eq!(
            parse(br#"{"type":"control_cancel_request","request_id":"r9"}"#),
            Frame::Cancel { id: "r9".into() }
        );
        assert_eq!(
            parse(br#"{"usage":{},"is_error":true,"subtype":"error_during_execution","type":"result"}"#),
            Frame::Result {
                subtype: "error_during_execution".into(),
                is_error: true
            }
        );
        for other in [
            &br#"{"type":"assistant","message":{"content":[]}}"#[..],
            br#"{"type":"tool_progress","heartbeat":true}"#,
            b"not json",
            b"",
            b"[1]",
            br#"{"type":"control_response","response":{"subtype":"success"}}"#,
        ] {
            assert_eq!(
                parse(other),
                Frame::Other,
                "{}",
                String::from_utf8_lossy(other)
            );
        }
    }

    #[test]
    fn written_frames_are_single_lines_the_cli_reads() {
        let u = user("a\nb");
        assert!(u.ends_with('\n'));
        assert_eq!(u.matches('\n').count(), 1);
        let v: Value = serde_json::from_str(&u).unwrap();
        assert_eq!(v["message"]["content"][0]["text"], "a\nb");
        let r: Value =
            serde_json::from_str(&request("req_1", json!({"subtype": "interrupt"}))).unwrap();
        assert_eq!(r["request"]["subtype"], "interrupt");
        let m: Value =
            serde_json::from_str(&mcp("r2", &json!(4), Ok(json!({"content": []})))).unwrap();
        assert_eq!(
            m["response"],
            json!({"subtype": "success", "request_id": "r2",
                   "response": {"mcp_response": {"jsonrpc": "2.0", "id": 4, "result": {"content": []}}}})
        );
        let e: Value =
            serde_json::from_str(&mcp("r3", &json!(5), Err((-32601, "no such method")))).unwrap();
        assert_eq!(
            e["response"]["response"]["mcp_response"]["error"]["code"],
            -32601
        );
        let e: Value = serde_json::from_str(&error("r4", "unsupported")).unwrap();
        assert_eq!(e["response"]["subtype"], "error");
    }

    #[test]
    fn a_user_message_s_tool_results_end_the_uses_a_subagent_s_do_not() {
        let line = br#"{"type":"user","message":{"role":"user","content":[
            {"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
            {"type":"tool_result","tool_use_id":"toolu_2","content":"denied","is_error":true},
            {"type":"text","text":"not a result"}]},"parent_tool_use_id":null}"#;
        let line: Vec<u8> = line.iter().copied().filter(|b| *b != b'\n').collect();
        assert_eq!(
            parse(&line),
            Frame::ToolResults(vec![
                crate::backend::ToolEnded::new("toolu_1", "a\nb", false),
                crate::backend::ToolEnded::new("toolu_2", "denied", true),
            ])
        );
        let sub = br#"{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t","content":"x"}]},"parent_tool_use_id":"toolu_9"}"#;
        assert_eq!(parse(sub), Frame::Other);
        let plain = br#"{"type":"user","message":{"content":[{"type":"text","text":"hi"}]},"parent_tool_use_id":null}"#;
        assert_eq!(parse(plain), Frame::Other);
    }
}
