//! The relay's byte edits: what changes in a body on its way up and an answer on its way
//! back, and what must not.

use super::*;

/// An answer's bytes read as [`super::plain`] reads text.
fn plain(raw: &[u8], model: &str, strip_usage: bool) -> Option<Plain> {
    super::plain(std::str::from_utf8(raw).ok()?, Some(model), strip_usage)
}

#[test]
fn only_the_model_value_changes() {
    let raw = Bytes::from_static(
        b"{ \"messages\" : [{\"role\":\"user\",\"content\":\"model\"}],\n  \"model\":\"pub\" , \"temperature\": 1.0e0, \"x\": {\"model\": 1} }",
    );
    let out = upstream_body(&raw, Some("real \"m\""), "p").unwrap().body;
    assert_eq!(
        std::str::from_utf8(&out).unwrap(),
        "{ \"messages\" : [{\"role\":\"user\",\"content\":\"model\"}],\n  \"model\":\"real \\\"m\\\"\" , \"temperature\": 1.0e0, \"x\": {\"model\": 1} }"
    );
}

#[test]
fn a_plain_answer_is_read_without_a_tree_and_relayed_as_sent() {
    let raw = Bytes::from_static(
        b"{\"id\":\"c\",\"model\":\"up\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"hi \\u00e9\"},\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6,\"total_tokens\":11,\"prompt_tokens_details\":{\"cached_tokens\":2},\"x\":null}}",
    );
    let p = plain(&raw, "pub", false).unwrap();
    assert_eq!(p.text, "hi \u{e9}");
    assert_eq!(p.finish.as_deref(), Some("length"));
    let u = p.usage.unwrap();
    assert_eq!(
        (u.prompt_tokens, u.cached_tokens, u.total_tokens),
        (5, 2, 11)
    );
    let back: serde_json::Value = serde_json::from_str(&p.json).unwrap();
    let mut want: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    want["model"] = "pub".into();
    // The members the published schema requires of a message, added.
    want["choices"][0]["message"]["refusal"] = serde_json::Value::Null;
    want["choices"][0]["message"]["annotations"] = serde_json::json!([]);
    assert_eq!(back, want);
    // A chunk: the delta's text, no usage, no finish.
    let chunk = Bytes::from_static(
        b"{\"model\":\"up\",\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":null}],\"usage\":null}",
    );
    let p = plain(&chunk, "pub", false).unwrap();
    assert_eq!(
        (p.text.as_str(), p.finish, p.usage.is_none()),
        ("a", None, true)
    );
}

#[test]
fn an_answer_with_tool_calls_is_not_plain() {
    for body in [
        &b"{\"model\":\"u\",\"choices\":[{\"message\":{\"content\":null,\"tool_calls\":[{\"id\":\"x\"}]}}]}"[..],
        b"{\"model\":\"u\",\"choices\":[{\"delta\":{\"tool\\u005fcalls\":[{\"index\":0}]}}]}",
        b"[1]",
        b"{\"model\":\"u\",\"choices\":7}",
        b"{\"choices\":[]}",
    ] {
        assert!(plain(&Bytes::copy_from_slice(body), "m", false).is_none());
    }
    let nulled = Bytes::from_static(
        b"{\"model\":\"u\",\"choices\":[{\"message\":{\"content\":\"x\",\"tool_calls\":null}}]}",
    );
    assert!(plain(&nulled, "m", false).is_some());
}

#[test]
fn escaped_and_missing_and_invalid() {
    let raw = Bytes::from_static(b"{\"mod\\u0065l\":\"a\",\"n\":1}");
    assert_eq!(
        &upstream_body(&raw, Some("b"), "p").unwrap().body[..],
        b"{\"mod\\u0065l\":\"b\",\"n\":1}"
    );
    let raw = Bytes::from_static(b"{\"n\":1}");
    assert_eq!(
        &upstream_body(&raw, Some("b"), "p").unwrap().body[..],
        b"{\"n\":1}"
    );
    assert!(upstream_body(&Bytes::from_static(b"{\"model\":\"a\""), Some("b"), "p").is_err());
    assert!(upstream_body(&Bytes::from_static(b"[1]"), Some("b"), "p").is_err());
}

#[test]
fn a_streamed_body_always_asks_for_usage_and_says_whether_the_client_did() {
    let up =
        |raw: &'static [u8]| upstream_body(&Bytes::from_static(raw), Some("real"), "p").unwrap();
    let plain_body = up(b" {\"model\":\"pub\",\"stream\":true,\"messages\":[]}");
    assert!(plain_body.strip_usage);
    assert_eq!(
        &plain_body.body[..],
        &b" {\"stream_options\":{\"include_usage\":true},\"model\":\"real\",\"stream\":true,\"messages\":[]}"[..]
    );
    let asked =
        up(b"{\"model\":\"pub\",\"stream\":true,\"stream_options\":{\"include_usage\":true}}");
    assert!(!asked.strip_usage);
    assert_eq!(
        &asked.body[..],
        &b"{\"model\":\"real\",\"stream\":true,\"stream_options\":{\"include_usage\":true}}"[..]
    );
    for declined in [
        &b"{\"stream\":true,\"stream_options\":{\"include_usage\":false,\"x\":1},\"model\":\"pub\"}"[..],
        b"{\"stream\":true,\"stream_options\":null,\"model\":\"pub\"}",
    ] {
        let u = upstream_body(&Bytes::copy_from_slice(declined), None, "p").unwrap();
        assert!(u.strip_usage);
        let v: serde_json::Value = serde_json::from_slice(&u.body).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true, "{v}");
        assert_eq!(v["model"], "pub");
    }
    let whole = up(b"{\"model\":\"pub\",\"stream\":false}");
    assert!(!whole.strip_usage);
    assert_eq!(
        &whole.body[..],
        &b"{\"model\":\"real\",\"stream\":false}"[..]
    );
}

#[test]
fn usage_the_client_did_not_ask_for_is_cut_from_chunks() {
    for (raw, want, relay) in [
        (
            &b"{\"id\":\"c\",\"model\":\"up\",\"choices\":[],\"usage\":{\"total_tokens\":3}}"[..],
            &b"{\"id\":\"c\",\"model\":\"pub\",\"choices\":[]}"[..],
            false,
        ),
        (
            b"{\"usage\" : null , \"model\":\"up\",\"choices\":[{\"delta\":{\"content\":\"a\"}}]}",
            b"{\"model\":\"pub\",\"choices\":[{\"delta\":{\"content\":\"a\"}}]}",
            true,
        ),
        (
            b"{\"model\":\"up\",\"choices\":[{\"delta\":{}}],\"us\\u0061ge\":null}",
            b"{\"model\":\"pub\",\"choices\":[{\"delta\":{}}]}",
            true,
        ),
    ] {
        let p = plain(&Bytes::copy_from_slice(raw), "pub", true).unwrap();
        assert_eq!(p.json.as_str(), std::str::from_utf8(want).unwrap());
        assert_eq!(p.relay, relay);
    }
    let u = plain(
        &Bytes::from_static(
            b"{\"model\":\"up\",\"choices\":[],\"usage\":{\"prompt_tokens\":2,\"total_tokens\":3}}",
        ),
        "pub",
        true,
    )
    .unwrap();
    assert_eq!(u.usage.map(|u| u.total_tokens), Some(3));
}

#[test]
fn cache_hints_reach_the_upstream_scoped_to_the_principal() {
    let raw = Bytes::from_static(
        b"{\"model\":\"m\",\"prompt_cache_key\":\"victim-42\",\"user\":\"u1\",\"messages\":[]}",
    );
    let key = |p: &str| {
        let up = upstream_body(&raw, None, p).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&up.body).unwrap();
        (
            v["prompt_cache_key"].clone(),
            v["user"].clone(),
            v["messages"].clone(),
        )
    };
    let (alice, bob) = (key("alice"), key("bob"));
    assert_ne!(alice.0, bob.0);
    assert_ne!(alice.1, bob.1);
    assert_eq!(alice, key("alice"), "stable for its principal");
    assert_eq!(alice.0, scoped_cache_key("alice", &"victim-42".into()));
    assert_eq!(alice.0.as_str().map(str::len), Some(64));
    assert_eq!(alice.2, serde_json::json!([]));
}

#[test]
fn a_whole_answer_gets_what_the_schema_requires_and_loses_a_null_fingerprint() {
    let raw = Bytes::from_static(
        br#"{"id":"c","model":"up","system_fingerprint":null,"choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"},{"index":1,"message":{"role":"assistant","content":"yo","refusal":null},"finish_reason":"stop"}]}"#,
    );
    let p = plain(&raw, "m", false).unwrap();
    let v: serde_json::Value = serde_json::from_str(&p.json).unwrap();
    assert!(v.get("system_fingerprint").is_none(), "{v}");
    for c in v["choices"].as_array().unwrap() {
        assert_eq!(c["message"]["refusal"], serde_json::Value::Null, "{v}");
        assert_eq!(c["message"]["annotations"], serde_json::json!([]), "{v}");
    }
    assert_eq!((v["model"].as_str(), p.text.as_str()), (Some("m"), "hi"));
    // What already conforms passes byte for byte, `model` aside.
    let raw = Bytes::from_static(
        br#"{"model":"up","system_fingerprint":"fp","choices":[{"message":{"content":"x","refusal":null,"annotations":[]}}]}"#,
    );
    let p = plain(&raw, "up", false).unwrap();
    assert_eq!(p.json.as_bytes(), &raw[..]);
    // An empty message is completed without a stray comma.
    let raw = Bytes::from_static(br#"{"model":"up","choices":[{"message":{ }}]}"#);
    let p = plain(&raw, "up", false).unwrap();
    let v: serde_json::Value = serde_json::from_str(&p.json).unwrap();
    assert_eq!(
        v["choices"][0]["message"]["annotations"],
        serde_json::json!([])
    );
    // A message that is no object is left as the upstream wrote it.
    let raw = Bytes::from_static(br#"{"model":"up","choices":[{"message":[]}]}"#);
    assert_eq!(plain(&raw, "up", false).unwrap().json.as_bytes(), &raw[..]);
}
