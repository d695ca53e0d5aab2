//! Newline-delimited JSON-RPC framing as `codex app-server` speaks it: one JSON object per
//! line, `"jsonrpc"` omitted on output and tolerated on input. The reader is tolerant: a line
//! that is not a JSON object, or that matches no message form, is skipped (and logged without
//! its content), never fatal. Unknown fields are ignored. Lines are split by
//! [`crate::backend::agent::lines::Lines`].

use std::borrow::Cow;

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

/// One message from the backend, classified by its members.
#[derive(Debug, Clone)]
pub enum Incoming<'a> {
    /// `method` + `id`: the backend asks us something and must get an answer.
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    /// `method` without `id`: the members of its params the gateway reads, still text of
    /// the line until a reader of that method reads them; no tree is built.
    Notification {
        method: Cow<'a, str>,
        params: Params<'a>,
    },
    /// `id` + `result`/`error`: the answer to one of our requests, its result as text (its
    /// reader takes what it needs, [`string_at`]).
    Response {
        id: Value,
        result: Result<Box<RawValue>, RpcError>,
    },
}

/// Params compare by their text (tests).
#[cfg(test)]
impl PartialEq for Incoming<'_> {
    fn eq(&self, other: &Self) -> bool {
        use Incoming::*;
        match (self, other) {
            (
                Request { id, method, params },
                Request {
                    id: i,
                    method: m,
                    params: p,
                },
            ) => (id, method, params) == (i, m, p),
            (
                Notification { method, params },
                Notification {
                    method: m,
                    params: p,
                },
            ) => method == m && format!("{params:?}") == format!("{p:?}"),
            (Response { id, result }, Response { id: i, result: r }) => {
                let text = |r: &Result<Box<RawValue>, RpcError>| {
                    r.as_ref()
                        .map(|v| v.get().to_string())
                        .map_err(Clone::clone)
                };
                id == i && text(result) == text(r)
            }
            _ => false,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

/// A message's members, borrowed from its line: the parts are built only when read. Its
/// params are read as `P`: a notification's as [`Params`] in the same pass, else as text.
#[derive(Deserialize)]
#[serde(bound(deserialize = "P: Deserialize<'de>"))]
struct Envelope<'a, P> {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default, borrow)]
    method: Option<Cow<'a, str>>,
    #[serde(default)]
    params: Option<P>,
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

/// The members of a notification's params the gateway reads, found in one borrowing pass
/// and each read only where it is used ([`text`], [`number`], [`flag`], [`members`]): a member
/// of another type than expected reads as absent, as it did from a tree.
#[derive(Deserialize, Default, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct Params<'a> {
    #[serde(borrow)]
    pub thread_id: Option<&'a RawValue>,
    #[serde(borrow)]
    pub item_id: Option<&'a RawValue>,
    #[serde(borrow)]
    pub delta: Option<&'a RawValue>,
    #[serde(borrow)]
    pub summary_index: Option<&'a RawValue>,
    #[serde(borrow)]
    pub will_retry: Option<&'a RawValue>,
    #[serde(borrow)]
    pub token_usage: Option<&'a RawValue>,
    #[serde(borrow)]
    pub turn: Option<&'a RawValue>,
    #[serde(borrow)]
    pub item: Option<&'a RawValue>,
}

/// What the gateway reads of an `item/completed` notification's item.
#[derive(Deserialize, Default)]
pub struct Item<'a> {
    #[serde(rename = "type", borrow)]
    pub kind: Option<&'a RawValue>,
    #[serde(borrow)]
    pub id: Option<&'a RawValue>,
    #[serde(borrow)]
    pub text: Option<&'a RawValue>,
}

/// `thread/tokenUsage/updated`: the last model request's counts.
#[derive(Deserialize, Default)]
pub struct TokenUsage<'a> {
    #[serde(borrow)]
    pub last: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Counts<'a> {
    #[serde(borrow)]
    pub input_tokens: Option<&'a RawValue>,
    #[serde(borrow)]
    pub output_tokens: Option<&'a RawValue>,
    #[serde(borrow)]
    pub total_tokens: Option<&'a RawValue>,
    #[serde(borrow)]
    pub cached_input_tokens: Option<&'a RawValue>,
    #[serde(borrow)]
    pub reasoning_output_tokens: Option<&'a RawValue>,
}

/// `turn/completed`: how the turn ended.
#[derive(Deserialize, Default)]
pub struct Turn<'a> {
    #[serde(borrow)]
    pub status: Option<&'a RawValue>,
    #[serde(borrow)]
    pub error: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
pub struct TurnError<'a> {
    #[serde(borrow)]
    pub message: Option<&'a RawValue>,
}

/// The members of an object `T` names (all absent when it is not an object).
pub fn members<'a, T: Deserialize<'a> + Default>(raw: Option<&'a RawValue>) -> T {
    raw.and_then(|r| serde_json::from_str(r.get()).ok())
        .unwrap_or_default()
}

/// The string at `path` (object keys) in an answer: None where a step is missing or the
/// value is not a string. Each object on the way is scanned for its key, nothing built.
pub fn string_at(raw: &RawValue, path: &[&str]) -> Option<String> {
    let mut at = raw;
    for key in path {
        let mut de = serde_json::Deserializer::from_str(at.get());
        at = Member(key).deserialize(&mut de).ok()??;
    }
    text(Some(at)).map(Cow::into_owned)
}

/// Finds one member of an object (the last of that name), skipping the others unread.
struct Member<'k>(&'k str);

impl<'de> DeserializeSeed<'de> for Member<'_> {
    type Value = Option<&'de RawValue>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Member<'_> {
    type Value = Option<&'de RawValue>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if key == self.0 {
                found = Some(map.next_value::<&'de RawValue>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

/// A string member, borrowed unless it has escapes.
pub fn text(raw: Option<&RawValue>) -> Option<Cow<'_, str>> {
    serde_json::from_str(raw?.get()).ok()
}

pub fn number(raw: Option<&RawValue>) -> Option<u64> {
    serde_json::from_str(raw?.get()).ok()
}

pub fn flag(raw: Option<&RawValue>) -> Option<bool> {
    serde_json::from_str(raw?.get()).ok()
}

/// A member built as a tree: None when it does not parse, `Some(None)` when absent.
fn tree(raw: Option<&RawValue>) -> Option<Option<Value>> {
    raw.map(|r| serde_json::from_str(r.get())).transpose().ok()
}

/// Notifications the app-server sends that the gateway does not read (the protocol's
/// `ServerNotification`s; none of them is ever a request). A line that opens with one of
/// them as its first member is not parsed further: a third of a plain turn's bytes.
const UNREAD: &[&str] = &[
    "thread/started",
    "thread/status/changed",
    "thread/name/updated",
    "turn/started",
    "turn/diff/updated",
    "turn/plan/updated",
    "item/started",
    "item/commandExecution/outputDelta",
    "item/fileChange/outputDelta",
    "item/reasoning/textDelta",
    "account/rateLimits/updated",
    "configWarning",
];

/// The method of a line that opens `{"method":"<one of UNREAD>",`.
fn unread(line: &str) -> Option<&'static str> {
    let rest = line.strip_prefix(r#"{"method":""#)?;
    let (method, after) = rest.split_at_checked(rest.find('"')?)?;
    let known = UNREAD.iter().find(|m| **m == method)?;
    after.starts_with(r#"","#).then_some(*known)
}

/// Parses one line. `None` for blank lines, non-JSON and unclassifiable objects.
pub fn parse_line(line: &str) -> Option<Incoming<'_>> {
    let line = line.trim();
    if !line.starts_with('{') {
        return None;
    }
    if let Some(method) = unread(line) {
        return Some(Incoming::Notification {
            method: Cow::Borrowed(method),
            params: Params::default(),
        });
    }
    let id = |v: Option<Value>| v.filter(|v| v.is_string() || v.is_i64() || v.is_u64());
    // Most lines are notifications: their params' members are found in the one pass.
    if let Ok(e) = serde_json::from_str::<Envelope<'_, Params<'_>>>(line) {
        if let (None, Some(method)) = (id(e.id), e.method) {
            let params = e.params.unwrap_or_default();
            return Some(Incoming::Notification { method, params });
        }
    }
    let e: Envelope<'_, &RawValue> = serde_json::from_str(line).ok()?;
    let id = id(e.id);
    match (id, e.method) {
        (Some(id), Some(method)) => Some(Incoming::Request {
            id,
            method: method.into_owned(),
            params: tree(e.params)?.unwrap_or(Value::Null),
        }),
        // Params that are not an object, or name a member twice, are read as none.
        (None, Some(method)) => Some(Incoming::Notification {
            method,
            params: Params::default(),
        }),
        (Some(id), None) => {
            if let Some(result) = e.result {
                Some(Incoming::Response {
                    id,
                    result: Ok(result.to_owned()),
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

/// `{"id":…,"method":…,"params":…}` and a newline, written around `params` (not moved into
/// a tree of its own first).
pub fn request(id: i64, method: &str, params: Value) -> String {
    #[derive(serde::Serialize)]
    struct Request<'a> {
        id: i64,
        method: &'a str,
        params: &'a Value,
    }
    let mut s = serde_json::to_string(&Request {
        id,
        method,
        params: &params,
    })
    .unwrap_or_default();
    s.push('\n');
    s
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

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_string()).unwrap()
    }

    #[test]
    fn a_string_is_found_by_its_path() {
        let v = raw(r#"{"thread":{"id":"th\u0031","n":1},"turn":[1]}"#);
        assert_eq!(string_at(&v, &["thread", "id"]).as_deref(), Some("th1"));
        assert_eq!(string_at(&v, &["thread", "n"]), None);
        assert_eq!(string_at(&v, &["turn", "id"]), None);
        assert_eq!(string_at(&v, &["nothing"]), None);
    }

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
        let Some(Incoming::Notification { method, params }) =
            parse_line(r#"{"jsonrpc":"2.0","method":"turn/completed","params":{"threadId":"t"}}"#)
        else {
            panic!("not a notification");
        };
        assert_eq!(method, "turn/completed");
        assert_eq!(text(params.thread_id).as_deref(), Some("t"));
        assert_eq!(
            parse_line(r#"{"id":"init-1","result":{"userAgent":"x"}}"#),
            Some(Incoming::Response {
                id: json!("init-1"),
                result: Ok(raw(r#"{"userAgent":"x"}"#))
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
    fn a_null_result_is_an_answer() {
        assert_eq!(
            parse_line(r#"{"id":4,"result":null}"#),
            Some(Incoming::Response {
                id: json!(4),
                result: Ok(raw("null"))
            })
        );
    }

    #[test]
    fn params_are_read_as_the_tree_was_a_member_of_another_type_as_absent() {
        let line = r#"{"method":"thread/tokenUsage/updated","params":{"threadId":"t\u0031",
            "delta":7,"willRetry":false,"summaryIndex":"2","extra":{"deep":[1,2]},
            "tokenUsage":{"last":{"inputTokens":5,"outputTokens":null}}}}"#;
        let Some(Incoming::Notification { params, .. }) = parse_line(line) else {
            panic!("not a notification");
        };
        let p = params;
        assert_eq!(text(p.thread_id).as_deref(), Some("t1"));
        assert_eq!(text(p.delta), None);
        assert_eq!(flag(p.will_retry), Some(false));
        assert_eq!(number(p.summary_index), None);
        let c: Counts<'_> = members(members::<TokenUsage<'_>>(p.token_usage).last);
        assert_eq!(
            (number(c.input_tokens), number(c.output_tokens)),
            (Some(5), None)
        );
        // Params that are not an object, or name a member twice, read as none.
        for line in [
            r#"{"method":"turn/completed","params":[1]}"#,
            r#"{"method":"turn/completed","params":{"threadId":"a","threadId":"b"}}"#,
        ] {
            let Some(Incoming::Notification { params, .. }) = parse_line(line) else {
                panic!("not a notification: {line}");
            };
            assert!(params.thread_id.is_none(), "{line}");
        }
    }

    #[test]
    fn an_unread_notification_is_not_parsed_past_its_method() {
        // Its params are not read, well-formed or not.
        let line = r#"{"method":"item/started","params":{"threadId":"t","item":{"#;
        let Some(Incoming::Notification { method, params }) = parse_line(line) else {
            panic!("a notification");
        };
        assert_eq!(method, "item/started");
        assert!(params.thread_id.is_none());
        // Read as usual: a method the gateway reads, one escaped, one not first.
        for line in [
            r#"{"method":"turn/completed","params":{"threadId":"t"}}"#,
            r#"{"method":"item\/started","params":{"threadId":"t"}}"#,
            r#"{"params":{"threadId":"t"},"method":"item/started"}"#,
        ] {
            let Some(Incoming::Notification { params, .. }) = parse_line(line) else {
                panic!("a notification: {line}");
            };
            assert_eq!(text(params.thread_id).as_deref(), Some("t"), "{line}");
        }
        assert_eq!(parse_line(r#"{"method":"item/started"#), None);
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
