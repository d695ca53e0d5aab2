//! What the client is shown of an assistant message and sends back: each call's `input` as a
//! JSON object, and the echo digest over both sides of it.
//!
//! Claude Code and the TypeScript SDK parse `input` and re-serialise it with
//! `JSON.stringify`: numbers come back as IEEE doubles (`60.0` as `60`, integers past 2^53
//! rounded), and a text block of whitespace only is dropped (the Messages API refuses one). The
//! echo therefore compares inputs with every number as a double (integral values below 2^53 as
//! integers) and treats whitespace-only text as none, on the exposed and the returned side
//! alike; the framing never shows a whitespace-only text block.

use serde_json::{json, Number, Value};

use crate::surface::canonical::echo_digest;
use crate::turn::{ExposedCall, Message};

/// Integral doubles below this magnitude are written as integers (JavaScript's safe range).
const SAFE: f64 = 9_007_199_254_740_992.0;

/// `v` with every number as a JavaScript client holds it.
fn as_js(v: Value) -> Value {
    match v {
        Value::Number(n) => {
            let f = n.as_f64().unwrap_or(0.0);
            let integral = f.fract() == 0.0 && f.abs() < SAFE;
            if integral && f < 0.0 {
                Value::from(f as i64)
            } else if integral {
                Value::from(f as u64)
            } else {
                Number::from_f64(f).map_or(Value::Null, Value::Number)
            }
        }
        Value::Array(a) => Value::Array(a.into_iter().map(as_js).collect()),
        Value::Object(o) => Value::Object(o.into_iter().map(|(k, v)| (k, as_js(v))).collect()),
        other => other,
    }
}

/// A call's `input` as the client sees it: its arguments when they are a JSON object, `{}`
/// for none, else the arguments under `input`; numbers as a JavaScript client holds them.
pub fn input_of(arguments: &str) -> Value {
    if arguments.trim().is_empty() {
        return json!({});
    }
    as_js(match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        Ok(other) => json!({"input": other}),
        Err(_) => json!({"input": arguments}),
    })
}

/// The text of an assistant message as a client keeps it: none when it is only whitespace.
pub fn visible(text: &str) -> &str {
    if text.trim().is_empty() {
        ""
    } else {
        text
    }
}

fn echo<'a>(text: &str, calls: impl Iterator<Item = (&'a str, &'a str, &'a str)>) -> [u8; 32] {
    let calls: Vec<(&str, &str, String)> = calls
        .map(|(id, name, args)| (id, name, input_of(args).to_string()))
        .collect();
    echo_digest(
        visible(text),
        calls.iter().map(|(id, name, i)| (*id, *name, i.as_str())),
    )
}

/// The echo digest of an assistant message about to be exposed.
pub fn exposed_echo(content: &str, calls: &[ExposedCall]) -> [u8; 32] {
    echo(
        content,
        calls
            .iter()
            .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str())),
    )
}

/// The echo digest of the assistant message a client sent back.
pub fn client_echo(m: &Message) -> [u8; 32] {
    echo(
        &m.text,
        m.tool_calls
            .iter()
            .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str())),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exposed(text: &str, args: &str) -> [u8; 32] {
        exposed_echo(
            text,
            &[ExposedCall {
                id: "srct-a".into(),
                name: "Bash".into(),
                arguments: args.into(),
            }],
        )
    }

    fn returned(text: &str, input: &str) -> [u8; 32] {
        let m = crate::surface::messages::blocks::messages(
            None,
            &[serde_json::from_str(&format!(
                r#"{{"role":"assistant","content":[{{"type":"text","text":{}}},{{"type":"tool_use","id":"srct-a","name":"Bash","input":{input}}}]}}"#,
                json!(text)
            ))
            .unwrap()],
        );
        client_echo(&m[0])
    }

    #[test]
    fn inputs_are_objects_with_javascript_numbers() {
        assert_eq!(input_of(""), json!({}));
        assert_eq!(input_of(r#"{"a":1}"#), json!({"a": 1}));
        assert_eq!(input_of("[1]"), json!({"input": [1]}));
        assert_eq!(
            input_of(r#"{"t":60.0,"n":-2.0}"#),
            json!({"t": 60, "n": -2})
        );
        assert_eq!(input_of(r#"{"t":0.5}"#), json!({"t": 0.5}));
    }

    #[test]
    fn the_echo_survives_a_javascript_round_trip() {
        // What JSON.stringify makes of the shown input.
        assert_eq!(
            exposed("", r#"{"timeout":60000.0,"big":12345678901234567890}"#),
            returned("", r#"{"big":12345678901234567000,"timeout":60000}"#)
        );
        assert_eq!(exposed("\n\n", "{}"), returned("", "{}"));
        assert_ne!(
            exposed("", r#"{"timeout":1}"#),
            returned("", r#"{"timeout":2}"#)
        );
        assert_ne!(exposed("hm", "{}"), returned("", "{}"));
    }
}
