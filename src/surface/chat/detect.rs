//! Detection of a continuation request: messages that end with a run of `role:"tool"`
//! messages after an assistant message with `tool_calls`. Shapes are checked here, before any
//! lookup: every id involved must be a well-formed `srct-` token, or none may have the prefix
//! (the client's own tool loop, [`Detected::ClientOwned`]).

use crate::error::ApiError;
use crate::surface::turn::{detect_run, Detected};
use crate::turn::Message;

pub fn detect(messages: &[Message]) -> Result<Detected, ApiError> {
    detect_run(
        messages,
        messages.len(),
        "tool_call_id",
        "trailing tool messages must follow an assistant message with `tool_calls`",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const T1: &str = "srct-0123456789abcdef0123456789abcdef";
    const T2: &str = "srct-ffffffffffffffffffffffffffffffff";

    fn msgs(v: serde_json::Value) -> Vec<Message> {
        let wire: Vec<super::super::wire::Message> = serde_json::from_value(v).unwrap();
        wire.iter().map(super::super::neutral_message).collect()
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
        let Detected::Answers {
            assistant,
            tokens,
            results,
        } = detect(&m).unwrap()
        else {
            panic!()
        };
        assert_eq!(assistant, 1);
        assert_eq!(tokens.len(), 2);
        assert_eq!(results.iter().map(|r| r.1).collect::<Vec<_>>(), [2, 3]);
        assert_eq!(results[0].0, tokens[1]);
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
