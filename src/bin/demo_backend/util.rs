//! Small helpers: clock, random ids, JSON object merging, turn shapes and text directives.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

pub(crate) fn rand_hex<const N: usize>() -> String {
    hex::encode(rand::random::<[u8; N]>())
}

/// A random UUIDv7-looking id.
pub(crate) fn uuid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x70;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    [&h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..]].join("-")
}

/// `base` with the members of `extra` appended (both are JSON objects).
pub(crate) fn merge(mut base: Value, extra: Value) -> Value {
    if let (Some(base), Value::Object(extra)) = (base.as_object_mut(), extra) {
        base.extend(extra);
    }
    base
}

/// The `turn` of a `turn/completed` notification.
pub(crate) fn ended_turn(id: &str, status: &str, error: Value) -> Value {
    let turn = json!({"id": id, "status": status, "error": error, "items": []});
    merge(turn, json!({"itemsView": "summary", "durationMs": 1}))
}

/// Value of a `key=VALUE` token anywhere in `text` (VALUE runs to the next whitespace).
pub(crate) fn directive<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("{key}=");
    let mut from = 0;
    while let Some(pos) = text[from..].find(&pat) {
        let start = from + pos;
        let prev = text[..start].chars().next_back();
        if prev.is_none_or(|c| !(c.is_alphanumeric() || c == '_')) {
            let rest = &text[start + pat.len()..];
            return Some(&rest[..rest.find(char::is_whitespace).unwrap_or(rest.len())]);
        }
        from = start + pat.len();
    }
    None
}

/// Splits `text` into at most three non-empty, roughly equal chunks.
pub(crate) fn chunks(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let n = chars.len().min(3);
    let bound = |i: usize| i * chars.len() / n;
    (0..n)
        .map(|i| chars[bound(i)..bound(i + 1)].iter().collect())
        .collect()
}
