//! Newline-delimited JSON-RPC framing as `codex app-server` speaks it: one JSON object per
//! line, `"jsonrpc"` omitted on output and tolerated on input. The reader is tolerant: a line
//! that is not a JSON object, or that matches no message form, is skipped (and logged without
//! its content), never fatal. Unknown fields are ignored. Lines are split by
//! [`crate::backend::agent::lines::Lines`].

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

/// One message from the backend, classified by its members.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// `method` + `id`: the backend asks us something and must get an answer.
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    /// `method` without `id`.
    Notification { method: String, params: Value },
    /// `id` + `result`/`error`: the answer to one of our requests.
    Response {
        id: Value,
        result: Result<Value, RpcError>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

/// A message's members, borrowed from its line: the parts are built only when read.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default, borrow)]
    method: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    params: Option<&'a RawValue>,
    /// Present (`null` included) or absent.
    #[serde(default, borrow, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(default, deserialize_with = "present")]
    error: Option<Value>,
}

/// A member that is there, whatever its value (`Option` alone reads `null` as absent).
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// Notifications whose params the gateway reads (`Proc::on_notification`). The others (item
/// starts and updates, plans, rate limits: most of what a turn sends) keep their params
/// unbuilt, and `item/completed` builds them only for an agent message and a command or file
/// change (whose end a Managed Agents session shows), never for the user's own (possibly
/// large) message.
fn reads_params(method: &str, params: &RawValue) -> bool {
    #[derive(Deserialize)]
    struct Completed<'a> {
        #[serde(borrow)]
        item: Kind<'a>,
    }
    #[derive(Deserialize)]
    struct Kind<'a> {
        #[serde(rename = "type", borrow)]
        kind: Cow<'a, str>,
    }
    match method {
        "item/agentMessage/delta"
        | "item/reasoning/summaryTextDelta"
        | "item/reasoning/summaryPartAdded"
        | "thread/tokenUsage/updated"
        | "turn/completed"
        | "error" => true,
        "item/completed" => serde_json::from_str::<Completed<'_>>(params.get()).is_ok_and(|c| {
            matches!(
                c.item.kind.as_ref(),
                "agentMessage" | "commandExecution" | "fileChange"
            )
        }),
        _ => false,
    }
}

/// A member built as a tree: None when it does not parse, `Some(None)` when absent.
fn tree(raw: Option<&RawValue>) -> Option<Option<Value>> {
    raw.map(|r| serde_json::from_str(r.get())).transpose().ok()
}

/// Parses one line. `None` for blank lines, non-JSON and unclassifiable objects.
pub fn parse_line(line: &str) -> Option<Incoming> {
    let line = line.trim();
    if !line.starts_with('{') {
        return None;
    }
    let e: Envelope<'_> = serde_json::from_str(line).ok()?;
    let id = e.id.filter(|v| v.is_string() || v.is_i64() || v.is_u64());
    let method = e.method.map(Cow::into_owned);
    match (id, method) {
        (Some(id), Some(method)) => Some(Incoming::Request {
            id,
            method,
            params: tree(e.params)?.unwrap_or(Value::Null),
        }),
        (None, Some(method)) => {
            let params = match e.params {
                Some(p) if reads_params(&method, p) => tree(Some(p))?.unwrap_or(Value::Null),
                _ => Value::Null,
            };
            Some(Incoming::Notification { method, params })
        }
        (Some(id), None) => {
            if let Some(result) = tree(e.result)? {
                Some(Incoming::Response {
                    id,
                    result: Ok(result),
                })
            } else {
                let e = e.error?;
                Some(Incoming::Response {
                    id,
                    result: Err(RpcError {
                        code: e.get("code").and_then(Value::as_i64).unwrap_or(0),
                        message: e
                            .get("message")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_string(),
                    }),
                })
            }
        }
        (None, None) => None,
    }
}

pub fn request(id: i64, method: &str, params: Value) -> String {
    line(json!({"id": id, "method": method, "params": params}))
}

pub fn notification(method: &str) -> String {
    line(json!({"method": method}))
}

pub fn response(id: &Value, result: Value) -> String {
    line(json!({"id": id, "result": result}))
}

pub fn error_response(id: &Value, code: i64, message: &str) -> String {
    line(json!({"id": id, "error": {"code": code, "message": message}}))
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
    fn classifies_the_three_forms() {
        assert_eq!(
            parse_line(r#"{"id":0,"method":"item/tool/call","params":{"a":1},"emittedAtMs":5}"#),
            Some(Incoming::Request {
                id: json!(0),
                method: "item/tool/call".into(),
                params: json!({"a":1})
            })
        );
        assert_eq!(
            parse_line(r#"{"jsonrpc":"2.0","method":"turn/completed","params":{}}"#),
            Some(Incoming::Notification {
                method: "turn/completed".into(),
                params: json!({})
            })
        );
        assert_eq!(
            parse_line(r#"{"id":"init-1","result":{"userAgent":"x"}}"#),
            Some(Incoming::Response {
                id: json!("init-1"),
                result: Ok(json!({"userAgent":"x"}))
            })
        );
        assert_eq!(
            parse_line(r#"{"id":3,"error":{"code":-32600,"message":"Not initialized"}}"#),
            Some(Incoming::Response {
                id: json!(3),
                result: Err(RpcError {
                    code: -32600,
                    message: "Not initialized".into()
                })
            })
        );
    }

    #[test]
    fn a_null_result_is_an_answer_and_unread_params_are_not_built() {
        assert_eq!(
            parse_line(r#"{"id":4,"result":null}"#),
            Some(Incoming::Response {
                id: json!(4),
                result: Ok(Value::Null)
            })
        );
        let big = "x".repeat(1000);
        for (line, built) in [
            (format!(r#"{{"method":"item/started","params":{{"threadId":"t","text":"{big}"}}}}"#), false),
            (format!(r#"{{"method":"item/completed","params":{{"threadId":"t","item":{{"type":"userMessage","text":"{big}"}}}}}}"#), false),
            (r#"{"method":"item/completed","params":{"threadId":"t","item":{"type":"agentMessage","id":"i","text":"hi"}}}"#.to_string(), true),
            (r#"{"method":"turn/completed","params":{"threadId":"t","turn":{"status":"completed"}}}"#.to_string(), true),
        ] {
            let Some(Incoming::Notification { params, .. }) = parse_line(&line) else {
                panic!("{line}");
            };
            assert_eq!(params["threadId"] == "t", built, "{line}");
        }
    }

    #[test]
    fn garbage_is_skipped() {
        for l in [
            "",
            "   ",
            "not json {",
            "[1,2]",
            "42",
            r#"{"foo":1}"#,
            r#"{"id":1}"#,
            "\u{0}",
        ] {
            assert_eq!(parse_line(l), None, "{l:?}");
        }
    }

    #[test]
    fn written_messages_are_single_lines() {
        let r = request(7, "turn/start", json!({"input":[{"text":"a\nb"}]}));
        assert!(r.ends_with('\n'));
        assert_eq!(r.matches('\n').count(), 1);
        assert_eq!(
            parse_line(&r),
            Some(Incoming::Request {
                id: json!(7),
                method: "turn/start".into(),
                params: json!({"input":[{"text":"a\nb"}]})
            })
        );
        assert_eq!(
            notification("initialized"),
            "{\"method\":\"initialized\"}\n"
        );
        assert!(error_response(&json!(1), -32601, "nope").contains("-32601"));
    }
}
