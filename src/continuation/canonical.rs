//! Canonical JSON and the four digests a pending record keeps.
//!
//! Canonical form: object keys sorted by their UTF-8 bytes, no insignificant whitespace,
//! strings and numbers as serde_json writes them (numbers are not normalised: `1` and `1.0`
//! differ). On top of that, the rules in ARCHITECTURE.md ("Canonical JSON") apply per digest:
//! messages are projected to the fields that carry meaning, assistant `content` null / absent /
//! `""` are equal, text-part arrays are joined into one string, tool-call `arguments` compare as
//! canonical JSON when they parse (else byte-exact), tool sets are order-insensitive and an
//! absent `tool_choice` equals `"auto"`.

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::auth::sha256;
use crate::openai::{Content, Message};

/// Where canonical text goes: a `String`, or straight into a SHA-256 (no intermediate copy of
/// a large conversation).
trait Sink {
    fn put(&mut self, s: &str);
}

impl Sink for String {
    fn put(&mut self, s: &str) {
        self.push_str(s);
    }
}

impl Sink for Sha256 {
    fn put(&mut self, s: &str) {
        self.update(s.as_bytes());
    }
}

/// Writes `v` in canonical form.
pub fn canonical(v: &Value) -> String {
    let mut out = String::new();
    write(v, &mut out);
    out
}

fn write<S: Sink>(v: &Value, out: &mut S) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.put("{");
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.put(",");
                }
                write_str([k.as_str()], out);
                out.put(":");
                write(&map[k.as_str()], out);
            }
            out.put("}");
        }
        Value::Array(items) => {
            out.put("[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.put(",");
                }
                write(item, out);
            }
            out.put("]");
        }
        Value::String(s) => write_str([s.as_str()], out),
        other => out.put(&other.to_string()),
    }
}

/// Writes the concatenation of `parts` as one JSON string, escaped exactly as serde_json
/// does: `"` `\\` and the control characters `\b \f \n \r \t` by name, other control
/// characters as `\u00xx`; everything else (non-ASCII included) verbatim.
fn write_str<'a, S: Sink>(parts: impl IntoIterator<Item = &'a str>, out: &mut S) {
    out.put("\"");
    for part in parts {
        let mut start = 0;
        for (i, b) in part.bytes().enumerate() {
            let esc: &str = match b {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0x08 => "\\b",
                0x0c => "\\f",
                0x00..=0x1f => "",
                _ => continue,
            };
            out.put(&part[start..i]);
            if esc.is_empty() {
                out.put(&format!("\\u{:04x}", b));
            } else {
                out.put(esc);
            }
            start = i + 1;
        }
        out.put(&part[start..]);
    }
    out.put("\"");
}

/// Arguments as canonical JSON when they parse, else the raw text.
pub fn canonical_arguments(raw: &str) -> Value {
    match serde_json::from_str::<Value>(raw) {
        Ok(v) => Value::String(canonical(&v)),
        Err(_) => Value::String(raw.to_string()),
    }
}

/// The text parts of a content value, in order (see `Content::text`).
fn content_parts(c: Option<&Content>) -> Vec<&str> {
    match c {
        None => Vec::new(),
        Some(Content::Text(s)) => vec![s.as_str()],
        Some(Content::Parts(parts)) => parts
            .iter()
            .filter_map(|p| match p {
                Value::String(s) => Some(s.as_str()),
                Value::Object(o) => o.get("text").and_then(Value::as_str),
                _ => None,
            })
            .collect(),
    }
}

/// Writes the meaning-carrying projection of one message, keys already in canonical order:
/// `content`, `name`, `role`, `tool_call_id`, `tool_calls` (`arguments`, `id`, `name`).
fn write_message<S: Sink>(m: &Message, out: &mut S) {
    out.put("{\"content\":");
    write_str(content_parts(m.content.as_ref()), out);
    if let Some(n) = &m.name {
        out.put(",\"name\":");
        write_str([n.as_str()], out);
    }
    out.put(",\"role\":");
    write_str([m.role.as_str()], out);
    if let Some(id) = &m.tool_call_id {
        out.put(",\"tool_call_id\":");
        write_str([id.as_str()], out);
    }
    let calls = m.tool_calls.as_deref().unwrap_or_default();
    if !calls.is_empty() {
        out.put(",\"tool_calls\":[");
        for (i, c) in calls.iter().enumerate() {
            if i > 0 {
                out.put(",");
            }
            out.put("{\"arguments\":");
            write(&canonical_arguments(&c.function.arguments_text()), out);
            out.put(",\"id\":");
            write_str([c.id.as_str()], out);
            out.put(",\"name\":");
            write_str([c.function.name.as_str()], out);
            out.put("}");
        }
        out.put("]");
    }
    out.put("}");
}

/// The canonical text of one message's projection (tests and diagnostics).
pub fn message_canonical(m: &Message) -> String {
    let mut s = String::new();
    write_message(m, &mut s);
    s
}

pub fn digest(v: &Value) -> [u8; 32] {
    let mut h = Sha256::new();
    write(v, &mut h);
    h.finalize().into()
}

/// SHA-256 of one message's canonical projection.
pub fn message_digest(m: &Message) -> [u8; 32] {
    let mut h = Sha256::new();
    write_message(m, &mut h);
    h.finalize().into()
}

/// The prefix digest from per-message digests: SHA-256 over their concatenation. Computing
/// message digests once serves both the check of a continuation's prefix and the prefix of
/// its own next suspension.
pub fn prefix_digest_of(message_digests: &[[u8; 32]]) -> [u8; 32] {
    let mut h = Sha256::new();
    for d in message_digests {
        h.update(d);
    }
    h.finalize().into()
}

/// Digest of the conversation prefix (every message before the assistant `tool_calls`).
pub fn prefix_digest(messages: &[Message]) -> [u8; 32] {
    let digests: Vec<[u8; 32]> = messages.iter().map(message_digest).collect();
    prefix_digest_of(&digests)
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
    fn string_escaping_matches_serde_json() {
        for s in [
            "plain",
            "q\"uote",
            "back\\slash",
            "nl\n cr\r tab\t",
            "\u{0}\u{1}\u{8}\u{c}\u{1f}\u{7f}",
            "é ü 漢字 🦀",
            "</script>",
        ] {
            assert_eq!(
                canonical(&json!(s)),
                serde_json::to_string(s).unwrap(),
                "{s:?}"
            );
        }
        let m = msg(
            json!({"role":"tool","tool_call_id":"i\"d","name":"n","content":[{"type":"text","text":"a\n"},{"type":"text","text":"b"}],
                           "tool_calls":[{"id":"x","function":{"name":"f","arguments":"{\"b\":1,\"a\":[1, 2]}"}}]}),
        );
        let via_value = json!({"content": "a\nb", "name": "n", "role": "tool", "tool_call_id": "i\"d",
                               "tool_calls": [{"arguments": "{\"a\":[1,2],\"b\":1}", "id": "x", "name": "f"}]});
        assert_eq!(message_canonical(&m), canonical(&via_value));
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
