//! The canonical projections every surface digests its conversation with (the manual's
//! "Canonical JSON" page): a message is projected to `content`, `name`, `role`, `tool_call_id` and
//! `tool_calls` (`arguments`, `id`, `name`); assistant `content` null / absent / `""` are equal;
//! text-part arrays are joined into one string; tool-call `arguments` compare as canonical JSON
//! when they parse (else byte-exact); tool sets are order-insensitive and an absent
//! `tool_choice` equals `"auto"`. These rules define what existing tokens mean: never change
//! them without a new surface version.

use serde_json::{json, Value};

use crate::continuation::canonical::{
    canonical, canonical_arguments, digest, write, write_str, Hashing, Sink,
};
use crate::digest::sha256;
use crate::turn::{Effort, ExposedCall, Message};

/// Writes the meaning-carrying projection of one message, keys already in canonical order:
/// `content`, `name`, `role`, `tool_call_id`, `tool_calls` (`arguments`, `id`, `name`).
fn write_message<S: Sink>(m: &Message, out: &mut S) {
    out.put("{\"content\":");
    write_str([m.text.as_str()], out);
    // Only surfaces that carry images set them, so chat digests never include the key.
    if !m.images.is_empty() {
        out.put(",\"images\":[");
        for (i, url) in m.images.iter().enumerate() {
            if i > 0 {
                out.put(",");
            }
            write_str([url.as_str()], out);
        }
        out.put("]");
    }
    // Only the Messages surface marks failed results, so other digests never include it.
    if m.is_error {
        out.put(",\"is_error\":true");
    }
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
    let calls = &m.tool_calls;
    if !calls.is_empty() {
        out.put(",\"tool_calls\":[");
        for (i, c) in calls.iter().enumerate() {
            if i > 0 {
                out.put(",");
            }
            out.put("{\"arguments\":");
            write(&canonical_arguments(&c.arguments), out);
            out.put(",\"id\":");
            write_str([c.id.as_str()], out);
            out.put(",\"name\":");
            write_str([c.name.as_str()], out);
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

/// SHA-256 of one message's canonical projection.
pub fn message_digest(m: &Message) -> [u8; 32] {
    let mut h = Hashing::new();
    write_message(m, &mut h);
    h.finish()
}

/// Digest of the tool set, independent of the order the tools are listed in: each tool
/// definition is canonicalised whole (extra keys included).
pub fn tools_digest(tools: Option<&[Value]>) -> [u8; 32] {
    let tools = tools.unwrap_or_default();
    if tools.is_empty() {
        // The plain request's: computed once.
        static NONE: std::sync::LazyLock<[u8; 32]> = std::sync::LazyLock::new(|| sha256(b"[]"));
        return *NONE;
    }
    let mut items: Vec<String> = tools.iter().map(canonical).collect();
    items.sort();
    sha256(format!("[{}]", items.join(",")).as_bytes())
}

pub fn tool_choice_digest(choice: Option<&Value>, effort: Option<Effort>) -> [u8; 32] {
    if matches!((choice, effort), (None | Some(Value::Null), None)) {
        // The plain request's: computed once.
        static AUTO: std::sync::LazyLock<[u8; 32]> =
            std::sync::LazyLock::new(|| digest(&json!("auto")));
        return *AUTO;
    }
    let choice = match choice {
        None | Some(Value::Null) => json!("auto"),
        Some(v) => v.clone(),
    };
    match effort {
        // Without an effort the digest is the tool choice's alone, as before effort existed.
        None => digest(&choice),
        Some(e) => digest(&json!({"effort": e.as_str(), "tool_choice": choice})),
    }
}

/// Digest of the assistant message that carried the tool calls: its text content and, per
/// call in order, id, function name and arguments.
pub fn echo_digest<'a>(
    content: &str,
    calls: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>,
) -> [u8; 32] {
    let calls: Vec<Value> = calls
        .into_iter()
        .map(|(id, name, args)| json!({"id": id, "name": name, "arguments": canonical_arguments(args)}))
        .collect();
    digest(&json!({"content": content, "tool_calls": calls}))
}

/// The echo digest of an assistant message the gateway is about to expose.
pub fn exposed_echo(content: &str, calls: &[ExposedCall]) -> [u8; 32] {
    echo_digest(
        content,
        calls
            .iter()
            .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str())),
    )
}

/// The echo digest of an assistant message as a client sent it back.
pub fn echo_digest_of(m: &Message) -> [u8; 32] {
    echo_digest(
        &m.text,
        m.tool_calls
            .iter()
            .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str())),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::continuation::canonical::digest_of_digests;

    fn msg(v: Value) -> Message {
        let wire: super::super::chat::wire::Message = serde_json::from_value(v).unwrap();
        super::super::chat::neutral_message(&wire)
    }

    fn prefix_digest(messages: &[Message]) -> [u8; 32] {
        let d: Vec<[u8; 32]> = messages.iter().map(message_digest).collect();
        digest_of_digests(&d)
    }

    #[test]
    fn message_projection_matches_canonical_json() {
        let m = msg(
            json!({"role":"tool","tool_call_id":"i\"d","name":"n","content":[{"type":"text","text":"a\n"},{"type":"text","text":"b"}],
                           "tool_calls":[{"id":"x","function":{"name":"f","arguments":"{\"b\":1,\"a\":[1, 2]}"}}]}),
        );
        let via_value = json!({"content": "a\nb", "name": "n", "role": "tool", "tool_call_id": "i\"d",
                               "tool_calls": [{"arguments": "{\"a\":[1,2],\"b\":1}", "id": "x", "name": "f"}]});
        assert_eq!(message_canonical(&m), canonical(&via_value));
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
            echo_digest("", [("srct-a", "f", "{\"x\":1}")])
        );
    }

    #[test]
    fn reserialised_arguments_are_equal_edited_are_not() {
        let e = |args: &str| echo_digest("", [("srct-a", "f", args)]);
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
            tool_choice_digest(None, None),
            tool_choice_digest(Some(&json!("auto")), None)
        );
        assert_ne!(
            tool_choice_digest(None, None),
            tool_choice_digest(Some(&json!("none")), None)
        );
    }

    #[test]
    fn effort_is_bound_with_the_tool_choice() {
        let auto = Some(json!("auto"));
        let high = tool_choice_digest(auto.as_ref(), Some(Effort::High));
        assert_ne!(high, tool_choice_digest(auto.as_ref(), None));
        assert_ne!(high, tool_choice_digest(auto.as_ref(), Some(Effort::Low)));
        assert_eq!(high, tool_choice_digest(None, Some(Effort::High)));
    }
}
