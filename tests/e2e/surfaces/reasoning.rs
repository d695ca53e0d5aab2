//! Reasoning shown to the harness in each surface's native form, and cache accounting (reads
//! and writes) on every surface and in `/v1/usage`: from a stateless upstream that reports
//! `reasoning_content` and `prompt_tokens_details`, and from the demo agent's reasoning
//! summaries (Codex's `item/reasoning/summaryTextDelta`).

use serde_json::{json, Value};

use crate::support::fake_upstream::{gateway_on_fake, THOUGHT};
use crate::support::{messages, responses, *};

/// The thinking block of a message, if any.
fn thinking(message: &Value) -> Option<Value> {
    message["content"]
        .as_array()?
        .iter()
        .find(|b| b["type"] == "thinking")
        .cloned()
}

/// A Messages request with `thinking` as given.
fn with_thinking(model: &str, prompt: &str, thinking: Value) -> Value {
    let mut r = messages::request(model, prompt);
    r["thinking"] = thinking;
    r
}

#[tokio::test]
async fn an_upstreams_reasoning_and_cache_counts_reach_every_surface() {
    let (gw, _fake) = gateway_on_fake(Opts::default(), &[("think", "up-think")]).await;
    let shown = json!({"type": "enabled", "budget_tokens": 31999, "display": "updates"});

    // Chat Completions: relayed as the upstream sent it.
    let (s, v) = gw
        .chat(ALICE, &json!({"model": "think", "messages": [user("hi")]}))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["reasoning_content"], THOUGHT);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
    let (_, _, text) = gw
        .chat_stream(
            ALICE,
            &json!({"model": "think", "stream": true, "messages": [user("hi")]}),
        )
        .await;
    assert!(
        text.contains(&format!("\"reasoning_content\":\"{THOUGHT}\"")),
        "{text}"
    );

    // Responses: a reasoning item before the message; cached input and cache writes.
    let (s, r) = responses::create(&gw, ALICE, &responses::request("think", "hi")).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["output"][0]["type"], "reasoning", "{r}");
    assert_eq!(r["output"][0]["summary"][0]["text"], THOUGHT);
    assert_eq!(
        r["usage"]["input_tokens_details"]["cached_tokens"], 4,
        "{r}"
    );
    assert_eq!(
        r["usage"]["input_tokens_details"]["cache_write_tokens"], 2,
        "{r}"
    );
    let (_, events) = responses::stream(&gw, ALICE, &responses::request("think", "hi")).await;
    let kinds = responses::kinds(&events);
    assert!(
        kinds.contains(&"response.reasoning_summary_text.delta"),
        "{kinds:?}"
    );

    // Messages: a thinking block when thinking is on, shown or omitted; none when it is off.
    let (s, m) = messages::create(&gw, ALICE, &with_thinking("think", "hi", shown.clone())).await;
    assert_eq!(s, 200, "{m}");
    assert_eq!(thinking(&m).unwrap()["thinking"], THOUGHT, "{m}");
    let u = &m["usage"];
    assert_eq!(
        (
            &u["input_tokens"],
            &u["cache_read_input_tokens"],
            &u["cache_creation_input_tokens"]
        ),
        (&json!(1), &json!(4), &json!(2)),
        "{m}"
    );
    let (_, _, m) = messages::stream(&gw, ALICE, &with_thinking("think", "hi", shown)).await;
    assert_eq!(thinking(&m).unwrap()["thinking"], THOUGHT, "{m}");
    assert_eq!(m["usage"]["cache_creation_input_tokens"], 2, "{m}");
    let omitted = json!({"type": "adaptive", "display": "omitted"});
    let (_, _, m) = messages::stream(&gw, ALICE, &with_thinking("think", "hi", omitted)).await;
    assert_eq!(thinking(&m).unwrap()["thinking"], "", "{m}");
    let off = json!({"type": "disabled"});
    let (_, m) = messages::create(&gw, ALICE, &with_thinking("think", "hi", off)).await;
    assert!(thinking(&m).is_none(), "{m}");

    // The usage report totals cache reads and writes (flushed within a second or so).
    // Seven calls report usage (a streamed chat relay asks for none).
    let total = usage_total(&gw, ALICE, |t| t["requests"].as_u64() >= Some(7)).await;
    let reported = total["cached_input_tokens"].as_u64().unwrap() / 4;
    assert_eq!(total["requests"], reported, "{total}");
    assert_eq!(total["cache_write_input_tokens"], 2 * reported, "{total}");
    let metrics = gw
        .http
        .get(format!("{}/metrics", gw.url))
        .send()
        .await
        .unwrap();
    let metrics = metrics.text().await.unwrap();
    assert!(
        metrics.contains("kind=\"cache_write_input\"} "),
        "{metrics}"
    );
}

#[tokio::test]
async fn an_agents_reasoning_summaries_reach_every_surface() {
    let gw = Gateway::start().await;
    let expect = "Thinking about: ponder this\n\nAnswering now.";

    let (_, _, text) = gw
        .chat_stream(
            ALICE,
            &json!({"model": "reasoning", "stream": true, "messages": [user("ponder this")]}),
        )
        .await;
    let reasoned: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| {
            c["choices"][0]["delta"]["reasoning_content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(reasoned, expect, "{text}");

    let (_, events) =
        responses::stream(&gw, ALICE, &responses::request("reasoning", "ponder this")).await;
    let done = responses::last_response(&events);
    assert_eq!(done["output"][0]["summary"][0]["text"], expect, "{done}");
    assert_eq!(responses::response_text(&done), "You said: ponder this");

    let adaptive = json!({"type": "adaptive"});
    let (_, _, m) = messages::stream(
        &gw,
        ALICE,
        &with_thinking("reasoning", "ponder this", adaptive),
    )
    .await;
    // The demo's turn text is the whole user message (Claude Code's reminder first).
    let shown = thinking(&m).unwrap()["thinking"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(shown.starts_with("Thinking about: "), "{m}");
    assert!(shown.ends_with("ponder this\n\nAnswering now."), "{m}");
    assert!(messages::text(&m).ends_with("ponder this"), "{m}");
}
