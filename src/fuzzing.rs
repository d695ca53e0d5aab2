//! Fuzz targets: the bodies of the `fuzz/` crate's libFuzzer targets, here so a stable test
//! can replay the committed corpus (`fuzz/corpus/<target>/`) on every build. Each target
//! panics on a broken invariant:
//!
//! - `chat`, `responses`, `messages`: a request body never panics the surface; one that parses parses to
//!   the same model, digests and continuation shape when its objects' keys are reversed and
//!   it is re-printed with other whitespace; a chat body on its way upstream changes only in
//!   `model`, its cache hints and its usage request, every other member as it was; a Messages
//!   body's token estimate grows with its text.
//! - `ndjson`: the backend line splitter hands on the same lines however the bytes are
//!   chunked, never holds more than its bound, and every line parses or is skipped.
//! - `sse`: the upstream SSE splitter yields the same events however the bytes are chunked.
//! - `config`: any text is a config or a [`crate::config::ConfigError`], never a panic.
//!
//! Allocation stays bounded because every reader here is bounded (body limit before parsing,
//! line and event bounds); libFuzzer's `-malloc_limit_mb` checks it.

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::backend::agent::lines::Lines;
use crate::backend::app_server::rpc;
use crate::sse::{SseEvent, SseSplitter};
use crate::turn::TurnInput;

/// The names of the targets, as in `fuzz/fuzz_targets/`.
pub const TARGETS: &[&str] = &["chat", "responses", "messages", "ndjson", "sse", "config"];

/// Runs target `name` on `data`.
pub fn run(name: &str, data: &[u8]) {
    match name {
        "chat" => chat(data),
        "responses" => responses(data),
        "messages" => messages(data),
        "ndjson" => ndjson(data),
        "sse" => sse(data),
        "config" => config(data),
        _ => panic!("unknown fuzz target {name}"),
    }
}

/// The same JSON with every object's keys in reverse order, pretty-printed.
fn reordered(v: &Value) -> Vec<u8> {
    fn rev(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut out = Map::new();
                for (k, v) in m.iter().rev() {
                    out.insert(k.clone(), rev(v));
                }
                Value::Object(out)
            }
            Value::Array(a) => Value::Array(a.iter().map(rev).collect()),
            other => other.clone(),
        }
    }
    serde_json::to_vec_pretty(&rev(v)).unwrap_or_default()
}

/// What a parse decided that the digests bind.
fn decided(t: &TurnInput) -> impl PartialEq + std::fmt::Debug {
    let c = t.continuation.as_ref().map(|c| {
        (
            c.assistant,
            c.tokens.clone(),
            c.results.clone(),
            c.prefix,
            c.echo,
        )
    });
    (
        t.model.clone(),
        (t.fingerprint.tools, t.fingerprint.tool_choice),
        crate::turn::digests(&t.messages, t.digest),
        c,
        t.client_tool_history,
        t.follows.clone(),
    )
}

fn now() -> tokio::time::Instant {
    tokio::time::Instant::now()
}

pub fn chat(data: &[u8]) {
    // Read as an upstream's answer on its way back, it stays JSON whatever the relay adds
    // (a message's missing `refusal` and `annotations`) or cuts (usage, a null fingerprint).
    let strip = data.len().is_multiple_of(2);
    let text = std::str::from_utf8(data).ok();
    if let Some(p) =
        text.and_then(|t| crate::backend::upstream::native::plain(t, Some("m2"), strip))
    {
        if serde_json::from_slice::<Value>(data).is_ok() {
            serde_json::from_str::<Value>(&p.json).expect("a relayed answer is JSON");
        }
    }
    let Ok((input, _)) = crate::surface::chat::parse(Bytes::copy_from_slice(data), now()) else {
        return;
    };
    assert!(
        std::str::from_utf8(data).is_ok(),
        "accepted a body that is not UTF-8"
    );
    // serde's tree refuses escapes of lone surrogates, which JSON's grammar allows and the
    // surface skips in members it ignores; such a body is relayed as sent.
    let Ok(tree) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let again = crate::surface::chat::parse(Bytes::from(reordered(&tree)), now())
        .unwrap_or_else(|e| panic!("reordered body refused: {e:?}"));
    assert_eq!(decided(&input), decided(&again.0), "digests moved");
    // On its way up a body changes only in `model`, its cache hints (scoped to the
    // principal) and, streamed without asking for usage, `stream_options.include_usage`.
    use crate::backend::upstream::native::{scoped_cache_key, upstream_body, CACHE_HINTS};
    let up = upstream_body(&Bytes::copy_from_slice(data), Some("m2"), "p")
        .unwrap_or_else(|e| panic!("splice failed on an accepted body: {e}"));
    let mut expected = tree;
    expected["model"] = Value::from("m2");
    for hint in CACHE_HINTS {
        if let Some(v) = expected.get(hint).filter(|v| !v.is_null()).cloned() {
            expected[hint] = scoped_cache_key("p", &v);
        }
    }
    let got: Value = serde_json::from_slice(&up.body).expect("spliced body is JSON");
    let asked = expected["stream_options"]["include_usage"] == true;
    if expected["stream"] == true && !asked {
        if !expected["stream_options"].is_object() {
            expected["stream_options"] = serde_json::json!({});
        }
        expected["stream_options"]["include_usage"] = true.into();
    }
    assert_eq!(got, expected);
    assert_eq!(up.strip_usage, expected["stream"] == true && !asked);
}

pub fn responses(data: &[u8]) {
    let Ok((input, _)) = crate::surface::responses::parse(data, now()) else {
        return;
    };
    let Ok(tree) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let again = crate::surface::responses::parse(&reordered(&tree), now())
        .unwrap_or_else(|e| panic!("reordered body refused: {e:?}"));
    assert_eq!(decided(&input), decided(&again.0), "digests moved");
}

pub fn messages(data: &[u8]) {
    let Ok((input, _)) = crate::surface::messages::parse(data, now()) else {
        return;
    };
    let estimate = crate::surface::messages::estimate_tokens(&input);
    assert!(estimate >= 3 * input.messages.len() as u64);
    let Ok(tree) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let again = crate::surface::messages::parse(&reordered(&tree), now())
        .unwrap_or_else(|e| panic!("reordered body refused: {e:?}"));
    assert_eq!(decided(&input), decided(&again.0), "digests moved");
}

/// Splits `data` into chunks whose sizes come from its own bytes.
fn chunks(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    let mut i = 0;
    while !rest.is_empty() {
        let n = (usize::from(data[i % data.len()]) % 7 + 1).min(rest.len());
        out.push(&rest[..n]);
        rest = &rest[n..];
        i += 1;
    }
    out
}

pub fn ndjson(data: &[u8]) {
    const MAX: usize = 64;
    let split = |parts: &[&[u8]]| {
        let mut lines = Lines::new(MAX);
        let mut out: Vec<Vec<u8>> = Vec::new();
        for p in parts {
            lines.push(p, |l| {
                assert!(l.len() <= MAX);
                out.push(l.to_vec());
            });
            assert!(lines.pending() <= MAX);
        }
        (out, lines.dropped)
    };
    let whole = split(&[data]);
    assert_eq!(whole, split(&chunks(data)), "chunking changed the lines");
    for line in &whole.0 {
        if let Ok(text) = std::str::from_utf8(line) {
            let _ = rpc::parse_line(text);
        }
    }
}

pub fn sse(data: &[u8]) {
    let events = |parts: &[&[u8]]| {
        let mut s = SseSplitter::default();
        let mut out: Vec<SseEvent> = Vec::new();
        for p in parts {
            if s.push(&Bytes::copy_from_slice(p)).is_err() {
                return None;
            }
            while let Some(e) = s.next_event() {
                out.push(e);
            }
        }
        s.finish();
        while let Some(e) = s.next_event() {
            out.push(e);
        }
        Some(out)
    };
    let whole = events(&[data]);
    let split = events(&chunks(data));
    // Chunking may not change the events. Lines are decoded whole, so this holds for any
    // bytes; it is checked on valid UTF-8, the only text an upstream may send.
    if std::str::from_utf8(data).is_ok() {
        assert_eq!(whole, split, "chunking changed the events");
    }
}

pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = crate::config::from_toml_str(text, std::path::Path::new("/nonexistent-fuzz-base"));
}

#[cfg(test)]
mod tests {
    /// Replays the committed corpus of every target (the stable-toolchain half of fuzzing).
    #[test]
    fn the_corpus_replays_clean() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
        for target in super::TARGETS {
            let dir = root.join(target);
            let mut n = 0;
            for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir:?}: {e}")) {
                let path = entry.expect("entry").path();
                let data = std::fs::read(&path).expect("read");
                let result = std::panic::catch_unwind(|| super::run(target, &data));
                assert!(
                    result.is_ok(),
                    "{target}: {} broke an invariant",
                    path.display()
                );
                n += 1;
            }
            assert!(n > 0, "{target}: empty corpus");
        }
    }
}
