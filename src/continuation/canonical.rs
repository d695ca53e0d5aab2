//! Canonical JSON and the four digests a pending record keeps.
//!
//! Canonical form: object keys sorted by their UTF-8 bytes, no insignificant whitespace,
//! strings and numbers as serde_json writes them (numbers are not normalised: `1` and `1.0`
//! differ). On top of that, the rules in ARCHITECTURE.md ("Canonical JSON") apply per digest:
//! messages are projected to the fields that carry meaning, assistant `content` null / absent /
//! `""` are equal, text-part arrays are joined into one string, tool-call `arguments` compare as
//! canonical JSON when they parse (else byte-exact), tool sets are order-insensitive and an
//! absent `tool_choice` equals `"auto"`.

use serde_json::{json, Map, Value};

use crate::auth::sha256;
use crate::openai::{Message, ToolCall};

/// Writes `v` in canonical form.
pub fn canonical(v: &Value) -> String {
    let mut out = String::new();
    write(v, &mut out);
    out
}

fn write(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String((*k).clone()).to_string());
                out.push(':');
                write(&map[k.as_str()], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Arguments as canonical JSON when they parse, else the raw text.
pub fn canonical_arguments(raw: &str) -> Value {
    match serde_json::from_str::<Value>(raw) {
        Ok(v) => Value::String(canonical(&v)),
        Err(_) => Value::String(raw.to_string()),
    }
}

fn call_value(c: &ToolCall) -> Value {
    json!({"id": c.id, "name": c.function.name,
           "arguments": canonical_arguments(&c.function.arguments_text())})
}

/// The meaning-carrying projection of one message.
pub fn message_value(m: &Message) -> Value {
    let mut o = Map::new();
    o.insert("role".into(), json!(m.role));
    o.insert("content".into(), json!(m.text()));
    if let Some(n) = &m.name {
        o.insert("name".into(), json!(n));
    }
    if let Some(id) = &m.tool_call_id {
        o.insert("tool_call_id".into(), json!(id));
    }
    let calls: Vec<Value> = m.tool_calls.iter().flatten().map(call_value).collect();
    if !calls.is_empty() {
        o.insert("tool_calls".into(), Value::Array(calls));
    }
    Value::Object(o)
}

pub fn digest(v: &Value) -> [u8; 32] {
    sha256(canonical(v).as_bytes())
}

/// Digest of the conversation prefix (every message before the assistant `tool_calls`).
pub fn prefix_digest(messages: &[Message]) -> [u8; 32] {
    digest(&Value::Array(messages.iter().map(message_value).collect()))
}

/// Digest of the tool set, independent of the order the tools are listed in.
pub fn tools_digest(tools: Option<&[Value]>) -> [u8; 32] {
    let mut items: Vec<String> = tools.unwrap_or_default().iter().map(canonical).collect();
    items.sort();
    sha256(format!("[{}]", items.join(",")).as_bytes())
}

pub fn tool_choice_digest(choice: Option<&Value>) -> [u8; 32] {
    match choice {
        None | Some(Value::Null) => digest(&json!("auto")),
        Some(v) => digest(v),
    }
}

/// Digest of the assistant message that carried the tool calls: its text content and, per
/// call in order, id, function name and arguments.
pub fn echo_digest(content: &str, calls: &[(String, String, String)]) -> [u8; 32] {
    let calls: Vec<Value> = calls
        .iter()
        .map(|(id, name, args)| json!({"id": id, "name": name, "arguments": canonical_arguments(args)}))
        .collect();
    digest(&json!({"content": content, "tool_calls": calls}))
}

/// The echo digest of an assistant message as a client sent it back.
pub fn echo_digest_of(m: &Message) -> [u8; 32] {
    let calls: Vec<(String, String, String)> = m
        .tool_calls
        .iter()
        .flatten()
        .map(|c| {
            (
                c.id.clone(),
                c.function.name.clone(),
                c.function.arguments_text(),
            )
        })
        .collect();
    echo_digest(&m.text(), &calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(v: Value) -> Message {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn keys_sorted_no_whitespace() {
        let v: Value =
            serde_json::from_str(r#"{ "b": [1, {"z":1, "a":"x y"}], "a": null }"#).unwrap();
        assert_eq!(canonical(&v), r#"{"a":null,"b":[1,{"a":"x y","z":1}]}"#);
        let w: Value = serde_json::from_str(r#"{"a":null,"b":[1,{"z":1,"a":"x y"}]}"#).unwrap();
        assert_eq!(digest(&v), digest(&w));
    }

    #[test]
    fn numbers_and_unicode_are_not_normalised() {
        assert_ne!(
            digest(&json!({"a": 1})),
            digest(&serde_json::from_str(r#"{"a":1.0}"#).unwrap())
        );
        assert_ne!(digest(&json!("é")), digest(&json!("e\u{301}")));
        assert_eq!(canonical(&json!("a\"\n")), r#""a\"\n""#);
    }

    #[test]
    fn echo_content_null_absent_empty_are_equal() {
        let call = json!([{"id":"srct-a","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]);
        let a = msg(json!({"role":"assistant","content":null,"tool_calls":call}));
        let b = msg(json!({"role":"assistant","tool_calls":call}));
        let c = msg(json!({"role":"assistant","content":"","tool_calls":call}));
        let d = msg(json!({"role":"assistant","content":"x","tool_calls":call}));
        assert_eq!(echo_digest_of(&a), echo_digest_of(&b));
        assert_eq!(echo_digest_of(&a), echo_digest_of(&c));
        assert_ne!(echo_digest_of(&a), echo_digest_of(&d));
        assert_eq!(
            echo_digest_of(&a),
            echo_digest("", &[("srct-a".into(), "f".into(), "{\"x\":1}".into())])
        );
    }

    #[test]
    fn reserialised_arguments_are_equal_edited_are_not() {
        let e = |args: &str| echo_digest("", &[("srct-a".into(), "f".into(), args.into())]);
        assert_eq!(e(r#"{"b":2,"a":1}"#), e(r#"{ "a": 1, "b": 2 }"#));
        assert_ne!(e(r#"{"amount":1}"#), e(r#"{"amount":1000}"#));
        // Unparseable arguments compare byte-exact.
        assert_eq!(e("not json"), e("not json"));
        assert_ne!(e("not json"), e("not  json"));
        // An object sent instead of a string equals its string form.
        let obj = msg(
            json!({"role":"assistant","tool_calls":[{"id":"srct-a","function":{"name":"f","arguments":{"a":1,"b":2}}}]}),
        );
        assert_eq!(echo_digest_of(&obj), e(r#"{"b":2,"a":1}"#));
    }

    #[test]
    fn prefix_ignores_shape_noise_but_not_bytes() {
        let a = vec![
            msg(json!({"role":"system","content":"s"})),
            msg(json!({"role":"user","content":"hi"})),
        ];
        let b = vec![
            msg(json!({"role":"system","content":[{"type":"text","text":"s"}],"cache_control":{}})),
            msg(json!({"content":"hi","role":"user"})),
        ];
        let c = vec![
            msg(json!({"role":"system","content":"s"})),
            msg(json!({"role":"user","content":"hI"})),
        ];
        assert_eq!(prefix_digest(&a), prefix_digest(&b));
        assert_ne!(prefix_digest(&a), prefix_digest(&c));
    }

    #[test]
    fn tool_set_is_order_insensitive_but_content_sensitive() {
        let t1 = json!({"type":"function","function":{"name":"a","parameters":{}}});
        let t2 = json!({"type":"function","function":{"name":"b","parameters":{}}});
        let t3 =
            json!({"type":"function","function":{"name":"b","description":"x","parameters":{}}});
        assert_eq!(
            tools_digest(Some(&[t1.clone(), t2.clone()])),
            tools_digest(Some(&[t2.clone(), t1.clone()]))
        );
        assert_ne!(
            tools_digest(Some(&[t1.clone(), t2])),
            tools_digest(Some(&[t1.clone(), t3]))
        );
        assert_ne!(
            tools_digest(Some(std::slice::from_ref(&t1))),
            tools_digest(None)
        );
        assert_eq!(tools_digest(None), tools_digest(Some(&[])));
    }

    #[test]
    fn tool_choice_absent_is_auto() {
        assert_eq!(
            tool_choice_digest(None),
            tool_choice_digest(Some(&json!("auto")))
        );
        assert_ne!(
            tool_choice_digest(None),
            tool_choice_digest(Some(&json!("none")))
        );
    }
}
