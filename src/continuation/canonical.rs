//! Canonical JSON: object keys sorted by their UTF-8 bytes, no insignificant whitespace,
//! strings and numbers as serde_json writes them (numbers are not normalised: `1` and `1.0`
//! differ). Text is streamed into a [`Sink`] (a `String`, or straight into a SHA-256, so a large
//! conversation is never copied to be digested). Each surface builds its canonical projections
//! (which fields of a message carry meaning) on these writers; the rules are in
//! docs/src/canonical-json.md.

use crate::digest::Sha256;
use serde_json::Value;

/// Where canonical text goes.
pub trait Sink {
    fn put(&mut self, s: &str);
}

impl Sink for String {
    fn put(&mut self, s: &str) {
        self.push_str(s);
    }
}

/// A SHA-256 fed through a buffer: canonical text comes in many small pieces (a quote, a
/// comma), each of which would otherwise be a call into the hasher's own block buffering.
pub struct Hashing {
    hash: Sha256,
    buf: Vec<u8>,
}

const HASHING_BUFFER: usize = 1024;

impl Hashing {
    pub fn new() -> Hashing {
        Hashing {
            hash: Sha256::new(),
            buf: Vec::with_capacity(HASHING_BUFFER),
        }
    }

    pub fn finish(mut self) -> [u8; 32] {
        self.hash.update(&self.buf);
        self.hash.finish()
    }
}

impl Default for Hashing {
    fn default() -> Self {
        Hashing::new()
    }
}

impl Sink for Hashing {
    fn put(&mut self, s: &str) {
        if self.buf.len() + s.len() > HASHING_BUFFER {
            self.hash.update(&self.buf);
            self.buf.clear();
            if s.len() >= HASHING_BUFFER {
                self.hash.update(s.as_bytes());
                return;
            }
        }
        self.buf.extend_from_slice(s.as_bytes());
    }
}

/// Writes `v` in canonical form.
pub fn canonical(v: &Value) -> String {
    let mut out = String::new();
    write(v, &mut out);
    out
}

pub fn write<S: Sink>(v: &Value, out: &mut S) {
    match v {
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            members.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.put("{");
            for (i, (k, v)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.put(",");
                }
                write_str([k.as_str()], out);
                out.put(":");
                write(v, out);
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
pub fn write_str<'a, S: Sink>(parts: impl IntoIterator<Item = &'a str>, out: &mut S) {
    out.put("\"");
    for part in parts {
        let mut start = 0;
        let bytes = part.as_bytes();
        // Long text is mostly plain: skip it eight bytes at a time to the first word that
        // holds a byte to escape, then go byte by byte from there.
        let mut i = 0;
        while i + 8 <= bytes.len() {
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[i..i + 8]);
            if needs_escape(u64::from_le_bytes(word)) {
                break;
            }
            i += 8;
        }
        for (i, b) in bytes.iter().copied().enumerate().skip(i) {
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

/// Whether any byte of `w` is `"`, `\\` or a control character (below 0x20): the classic
/// word-at-a-time tests for a zero byte (of `w ^ "…"`, `w ^ \…`) and for a byte below 0x20.
fn needs_escape(w: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    let below_space = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
    (zero(w ^ (ONES * b'"' as u64)) | zero(w ^ (ONES * b'\\' as u64)) | below_space) != 0
}

/// Arguments as canonical JSON when they parse, else the raw text.
pub fn canonical_arguments(raw: &str) -> Value {
    match serde_json::from_str::<Value>(raw) {
        Ok(v) => Value::String(canonical(&v)),
        Err(_) => Value::String(raw.to_string()),
    }
}

pub fn digest(v: &Value) -> [u8; 32] {
    let mut h = Hashing::new();
    write(v, &mut h);
    h.finish()
}

/// A digest over per-item digests: SHA-256 of their concatenation. Computing item digests once
/// serves both the check of a continuation's prefix and the prefix of its own next suspension.
pub fn digest_of_digests(digests: &[[u8; 32]]) -> [u8; 32] {
    let mut h = Sha256::new();
    for d in digests {
        h.update(d);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strings_are_escaped_as_serde_json_does_at_every_position() {
        let mut cases: Vec<String> = Vec::new();
        for special in [
            "\"", "\\", "\n", "\u{1}", "\u{1f}", "\t", "é", "\u{7f}", " ", "~",
        ] {
            for at in 0..20 {
                let mut s = "abcdefghijklmnopqrstuvwxyz".to_string();
                s.insert_str(at, special);
                cases.push(s);
            }
        }
        cases.push(String::new());
        cases.push("x".repeat(100_000) + "\"");
        for s in cases {
            let mut out = String::new();
            write_str([s.as_str()], &mut out);
            assert_eq!(out, serde_json::to_string(&s).unwrap(), "{s:?}");
        }
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
    fn a_re_serialised_number_keeps_its_digest() {
        // Past u64, an integer is a float; parsing is exact (`float_roundtrip`), so writing
        // it out and reading it back lands on the same value and the same text.
        for text in [
            "3000000000000000000000000000267459868495271249",
            "0.1",
            "1e-7",
            "2.5e300",
        ] {
            let once: Value = serde_json::from_str(text).unwrap();
            let again: Value =
                serde_json::from_str(&serde_json::to_string(&once).unwrap()).unwrap();
            assert_eq!(canonical(&once), canonical(&again), "{text}");
        }
    }
}
