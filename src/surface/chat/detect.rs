//! Detection of a continuation request: messages that end with a run of
//! `role:"tool"` messages after an assistant message with `tool_calls`. Shapes are checked
//! here, before any lookup: every id involved must be a well-formed `srct-` token, or none may
//! have the prefix (the client's own tool loop, [`Detected::ClientOwned`]).

use crate::error::ApiError;
use crate::surface::trailing_run;

use super::wire::Message;

#[derive(Debug)]
pub enum Detected {
    Fresh,
    Continuation(Continuation),
    /// Trailing results that answer the client's own ids: ordinary history for a stateless
    /// upstream, refused by a stateful backend.
    ClientOwned,
}

#[derive(Debug)]
pub struct Continuation {
    /// Index of the assistant message carrying the tool calls.
    pub assistant: usize,
    /// Digests of that message's tool-call ids, in order (duplicates kept: they are drift).
    pub tokens: Vec<[u8; 32]>,
    /// Digest of each trailing tool message's `tool_call_id`, with the message index.
    pub results: Vec<([u8; 32], usize)>,
}

pub fn detect(messages: &[Message]) -> Result<Detected, ApiError> {
    let trailing = messages
        .iter()
        .rev()
        .take_while(|m| m.role == "tool")
        .count();
    if trailing == 0 {
        return Ok(Detected::Fresh);
    }
    let assistant = messages.len() - trailing;
    let calls = assistant
        .checked_sub(1)
        .map(|i| &messages[i])
        .filter(|m| m.role == "assistant")
        .and_then(|m| m.tool_calls.as_ref())
        .filter(|c| !c.is_empty())
        .ok_or_else(|| {
            ApiError::invalid(
                "trailing tool messages must follow an assistant message with `tool_calls`",
            )
            .with_param("messages")
        })?;
    let assistant = assistant - 1;
    let run = trailing_run(
        calls.iter().map(|c| c.id.as_str()),
        messages[assistant + 1..]
            .iter()
            .map(|m| m.tool_call_id.as_deref().unwrap_or_default()),
        assistant + 1,
        ("messages", "tool_call_id"),
    )?;
    Ok(match run {
        None => Detected::ClientOwned,
        Some((tokens, results)) => Detected::Continuation(Continuation {
            assistant,
            tokens,
            results,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const T1: &str = "srct-0123456789abcdef0123456789abcdef";
    const T2: &str = "srct-ffffffffffffffffffffffffffffffff";

    fn msgs(v: serde_json::Value) -> Vec<Message> {
        serde_json::from_value(v).unwrap()
    }

    fn call(id: &str) -> serde_json::Value {
        json!({"id": id, "type": "function", "function": {"name": "f", "arguments": "{}"}})
    }

    #[test]
    fn fresh_when_no_trailing_tools() {
        let m = msgs(
            json!([{"role":"user","content":"a"},{"role":"assistant","tool_calls":[call(T1)]},
                            {"role":"tool","tool_call_id":T1,"content":"r"},{"role":"user","content":"b"}]),
        );
        assert!(matches!(detect(&m).unwrap(), Detected::Fresh));
    }

    #[test]
    fn continuation_with_parallel_results() {
        let m = msgs(
            json!([{"role":"user","content":"a"},{"role":"assistant","tool_calls":[call(T1),call(T2)]},
                            {"role":"tool","tool_call_id":T2,"content":"r2"},{"role":"tool","tool_call_id":T1,"content":"r1"}]),
        );
        let Detected::Continuation(c) = detect(&m).unwrap() else {
            panic!()
        };
        assert_eq!(c.assistant, 1);
        assert_eq!(c.tokens.len(), 2);
        assert_eq!(c.results.iter().map(|r| r.1).collect::<Vec<_>>(), [2, 3]);
        assert_eq!(c.results[0].0, c.tokens[1]);
    }

    #[test]
    fn client_owned_and_mixed_runs() {
        let m = msgs(
            json!([{"role":"user","content":"a"},{"role":"assistant","tool_calls":[call("call_1"),call("toolu_2")]},
                   {"role":"tool","tool_call_id":"toolu_2","content":"r"},{"role":"tool","tool_call_id":"call_1","content":"r"}]),
        );
        assert!(matches!(detect(&m).unwrap(), Detected::ClientOwned));
        let m = msgs(
            json!([{"role":"user","content":"a"},{"role":"assistant","tool_calls":[call(T1),call("call_1")]},
                   {"role":"tool","tool_call_id":T1,"content":"r"},{"role":"tool","tool_call_id":"call_1","content":"r"}]),
        );
        let e = detect(&m).unwrap_err();
        assert_eq!(e.code, crate::error::ErrorCode::ContinuationMismatch);
    }

    #[test]
    fn malformed_ids_are_invalid_request() {
        for bad in ["srct-0123456789ABCDEF0123456789abcdef", "srct-123"] {
            let m = msgs(
                json!([{"role":"user","content":"a"},{"role":"assistant","tool_calls":[call(bad)]},
                                {"role":"tool","tool_call_id":bad,"content":"r"}]),
            );
            let e = detect(&m).unwrap_err();
            assert_eq!(e.code, crate::error::ErrorCode::InvalidRequest, "{bad}");
        }
        let m = msgs(
            json!([{"role":"user","content":"a"},{"role":"tool","tool_call_id":T1,"content":"r"}]),
        );
        assert!(detect(&m).is_err());
    }
}
