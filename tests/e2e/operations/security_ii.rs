//! The second security review's findings (`docs/src/security.md`), each against the real
//! binary: every streamed answer of an upstream is metered, compaction items are bounded
//! before they cost anything, Responses WebSockets live inside the connection and kept-bytes
//! bounds, the MCP bridge listener is bounded, cache keys are per principal, and scratch
//! folders of a dead gateway are swept at start.

use serde_json::{json, Value};

use crate::support::fake_upstream::{gateway_on_fake_edited, FakeUpstream};
use crate::support::*;

/// A gateway on a fake upstream whose models are `u-echo` (usage only when asked, like
/// OpenAI) and `u-quiet` (never any usage); alice may spend 10 tokens a day.
async fn metered() -> (Gateway, FakeUpstream) {
    gateway_on_fake_edited(
        Opts::default(),
        &[("u-echo", "up-echo"), ("u-quiet", "up-no-usage")],
        |text| crate::operations::budgets::priced(text, &[("alice", "{ tokens_per_day = 10 }")]),
    )
    .await
}

#[tokio::test]
async fn a_streamed_chat_without_include_usage_is_metered_and_the_client_sees_no_usage() {
    let (gw, fake) = metered().await;
    let (s, _, body) = gw
        .chat_stream(ALICE, &json!({"model": "u-echo", "messages": [user("hi")]}))
        .await;
    assert_eq!(s, 200, "{body}");
    let (events, done) = sse_events(&body);
    assert_eq!(done, 1);
    assert!(
        events.iter().all(|e| e.get("usage").is_none()),
        "the client did not ask for usage: {body}"
    );
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "echo: hi");
    // The gateway asked the upstream for it.
    assert_eq!(fake.bodies()[0]["stream_options"]["include_usage"], true);

    let (_, v) = get(&gw, ALICE, "/v1/usage").await;
    assert_eq!(v["total"]["total_tokens"], 10, "{v}");
    assert_eq!(v["total"]["requests"], 1, "{v}");
    let (s, v) = gw
        .chat(
            ALICE,
            &json!({"model": "u-echo", "messages": [user("again")]}),
        )
        .await;
    assert_eq!(
        (s.as_u16(), error_code(&v)),
        (402, "budget_exceeded".into())
    );

    // A client that asked gets the usage chunk as the upstream sent it.
    let (s, _, body) = gw
        .chat_stream(
            BOB,
            &json!({"model": "u-echo", "messages": [user("hi")],
                    "stream_options": {"include_usage": true}}),
        )
        .await;
    assert_eq!(s, 200);
    let (events, _) = sse_events(&body);
    assert_eq!(
        events.last().unwrap()["usage"]["total_tokens"],
        10,
        "{body}"
    );
}

#[tokio::test]
async fn an_upstream_that_reports_no_usage_is_metered_from_an_estimate_logged_once() {
    let (gw, _fake) = metered().await;
    for _ in 0..2 {
        let (s, _, _) = gw
            .chat_stream(BOB, &json!({"model": "u-quiet", "messages": [user("hi")]}))
            .await;
        assert_eq!(s, 200);
    }
    let (s, v) = gw
        .chat(BOB, &json!({"model": "u-quiet", "messages": [user("hi")]}))
        .await;
    assert_eq!(s, 200, "{v}");
    let (_, v) = get(&gw, BOB, "/v1/usage").await;
    assert_eq!(v["total"]["requests"], 3, "{v}");
    let tokens = v["total"]["total_tokens"].as_u64().unwrap();
    assert!(tokens >= 3 * 10, "estimated from the bytes: {v}");
    let warned = gw.log().matches("reported no usage").count();
    assert_eq!(warned, 1, "{}", gw.log());
    // Alice's cap acts on an estimate too.
    let (s, _, _) = gw
        .chat_stream(
            ALICE,
            &json!({"model": "u-quiet", "messages": [user("hi")]}),
        )
        .await;
    assert_eq!(s, 200);
    let (s, v) = gw
        .chat(
            ALICE,
            &json!({"model": "u-quiet", "messages": [user("hi")]}),
        )
        .await;
    assert_eq!(
        (s.as_u16(), error_code(&v)),
        (402, "budget_exceeded".into())
    );
}

/// The gateway's peak resident memory so far, in kB.
fn peak_kb(gw: &Gateway) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", gw.pid())).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
async fn compaction_items_are_bounded_and_read_only_after_admission() {
    let (gw, _fake) = gateway_on_fake_edited(
        Opts {
            sqlite: true,
            continuations: "max_compaction_items = 8",
            ..Opts::default()
        },
        &[("u-echo", "up-echo"), ("u-long", "up-long")],
        |text| crate::operations::budgets::priced(text, &[("alice", "{ tokens_per_day = 1 }")]),
    )
    .await;
    // A summary of 256 KiB (the model made it that long).
    let compact = json!({"model": "u-long", "input": [
        {"type": "message", "role": "user", "content": "remember this"}]});
    let r = gw
        .http
        .post(format!("{}/v1/responses/compact", gw.url))
        .bearer_auth(BOB)
        .json(&compact)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let item = v["output"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(item["type"], "compaction", "{v}");
    let with = |model: &str, copies: usize| {
        let mut input = vec![item.clone(); copies];
        input.push(json!({"type": "message", "role": "user", "content": "go on"}));
        json!({"model": model, "input": input})
    };

    // A thousand copies of one handle: refused before any is read.
    let before = peak_kb(&gw);
    for model in ["nope", "u-echo"] {
        let (s, v) = crate::support::responses::create(&gw, BOB, &with(model, 1000)).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (400, Some("invalid_request")),
            "{v}"
        );
        assert_eq!(v["error"]["param"], "input", "{v}");
    }
    let grown = peak_kb(&gw).saturating_sub(before);
    assert!(grown < 32 * 1024, "the gateway grew by {grown} kB");
    // Eight copies fit the item cap but expand past max_body_bytes (1 MiB): 413.
    let (s, v) = crate::support::responses::create(&gw, BOB, &with("u-echo", 8)).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (413, Some("request_too_large")),
        "{v}"
    );
    // Once still works.
    let (s, v) = crate::support::responses::create(&gw, BOB, &with("u-echo", 1)).await;
    assert_eq!(s, 200, "{v}");

    // With the summaries' table gone, a read would be 503: refused requests read nothing.
    let (s, _) = gw
        .chat(
            ALICE,
            &json!({"model": "u-echo", "messages": [user("spend")]}),
        )
        .await;
    assert_eq!(s, 200);
    let db = gw.dir.path().join("turnstile.db");
    let dropped = std::process::Command::new("python3")
        .args(["-c", "import sqlite3,sys\nc=sqlite3.connect(sys.argv[1])\nc.execute('DROP TABLE compactions')\nc.commit()"])
        .arg(&db)
        .status()
        .unwrap();
    assert!(dropped.success());
    let (s, v) = crate::support::responses::create(&gw, BOB, &with("nope", 1)).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (404, Some("model_not_found")),
        "{v}"
    );
    let (s, v) = crate::support::responses::create(&gw, ALICE, &with("u-echo", 1)).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (402, Some("budget_exceeded")),
        "{v}"
    );
    let (s, v) = crate::support::responses::create(&gw, BOB, &with("u-echo", 1)).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("store_unavailable")),
        "{v}"
    );
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A Responses WebSocket of `key`.
async fn socket(gw: &Gateway, key: &str) -> Ws {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut upgrade = format!("{}/v1/responses", gw.url.replace("http://", "ws://"))
        .into_client_request()
        .unwrap();
    let bearer = format!("Bearer {key}").parse().unwrap();
    upgrade.headers_mut().insert("authorization", bearer);
    tokio_tungstenite::connect_async(upgrade)
        .await
        .expect("upgrade")
        .0
}

/// Sends `message` and reads events until a terminal one, which it returns.
async fn exchange(ws: &mut Ws, message: &Value) -> Value {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    ws.send(Message::Text(message.to_string().into()))
        .await
        .unwrap();
    wait_for("a terminal event", async || loop {
        let Some(Ok(Message::Text(t))) = ws.next().await else {
            return None;
        };
        let v: Value = serde_json::from_str(&t).unwrap();
        if matches!(
            v["type"].as_str(),
            Some("response.completed" | "response.failed" | "error")
        ) {
            return Some(v);
        }
    })
    .await
}

fn prewarm(bytes: usize) -> Value {
    json!({"type": "response.create", "model": "echo", "generate": false,
           "input": [{"type": "message", "role": "user", "content": "x".repeat(bytes)}]})
}

#[tokio::test]
async fn a_websocket_holds_a_connection_place_for_its_life() {
    let gw = Gateway::start_with(Opts {
        server: "max_connections = 4\nmax_streams_per_client = 64",
        ..Opts::default()
    })
    .await;
    let mut open = Vec::new();
    for _ in 0..4 {
        let mut ws = socket(&gw, ALICE).await;
        assert_eq!(
            exchange(&mut ws, &prewarm(10)).await["type"],
            "response.completed"
        );
        open.push(ws);
    }
    // A fifth connection waits in the backlog while four sockets are open...
    let fifth = tokio::spawn({
        let url = gw.url.clone();
        async move {
            reqwest::get(format!("{url}/healthz"))
                .await
                .map(|r| r.status())
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(
        !fifth.is_finished(),
        "a fifth connection was served beside four sockets"
    );
    // ... and is served once one closes.
    drop(open.pop());
    let status = tokio::time::timeout(WAIT, fifth)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_sockets_remembered_conversation_counts_in_the_kept_bytes() {
    let gw = Gateway::start_with(Opts {
        server: "max_streams_per_client = 64",
        continuations: "max_kept_bytes_per_client = 1000000",
        ..Opts::default()
    })
    .await;
    let mut first = socket(&gw, ALICE).await;
    assert_eq!(
        exchange(&mut first, &prewarm(600_000)).await["type"],
        "response.completed"
    );
    let mut second = socket(&gw, ALICE).await;
    let refused = exchange(&mut second, &prewarm(600_000)).await;
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(refused["status"], 429);
    assert_eq!(refused["error"]["code"], "capacity_exhausted", "{refused}");
    // Another principal's bound is its own; closing the first socket frees alice's.
    let mut bobs = socket(&gw, BOB).await;
    assert_eq!(
        exchange(&mut bobs, &prewarm(600_000)).await["type"],
        "response.completed"
    );
    drop(first);
    wait_for("the first socket's bytes released", async || {
        let v = exchange(&mut second, &prewarm(600_000)).await;
        (v["type"] == "response.completed").then_some(())
    })
    .await;
}

#[tokio::test]
async fn only_a_response_keeps_a_websocket_from_idling() {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let gw = Gateway::start_with(Opts {
        server: "websocket_idle_timeout_seconds = 2",
        ..Opts::default()
    })
    .await;
    let mut ws = socket(&gw, ALICE).await;
    let opened = std::time::Instant::now();
    let mut junk = tokio::time::interval(std::time::Duration::from_millis(500));
    let closed = tokio::time::timeout(WAIT, async {
        loop {
            tokio::select! {
                _ = junk.tick() => {
                    if ws.send(Message::Text("{}".into())).await.is_err() {
                        return None;
                    }
                }
                m = ws.next() => match m {
                    Some(Ok(Message::Close(frame))) => return frame.map(|f| f.reason.to_string()),
                    Some(Ok(_)) => {}
                    _ => return None,
                },
            }
        }
    })
    .await
    .expect("the socket sending only junk was never closed");
    assert_eq!(closed.as_deref(), Some("idle"));
    assert!(opened.elapsed() < std::time::Duration::from_secs(10));
}

#[tokio::test]
async fn cache_keys_reach_a_shared_upstream_scoped_to_each_principal() {
    use crate::support::{messages, responses};
    let (gw, fake) = gateway_on_fake_edited(Opts::default(), &[("u-echo", "up-echo")], |t| t).await;
    for key in [ALICE, BOB, ALICE] {
        let chat = json!({"model": "u-echo", "messages": [user("hi")],
                          "prompt_cache_key": "victim-session-42", "user": "victim"});
        assert_eq!(gw.chat(key, &chat).await.0, 200);
        let mut resp = responses::request("u-echo", "hi");
        resp["prompt_cache_key"] = json!("victim-session-42");
        assert_eq!(responses::create(&gw, key, &resp).await.0, 200);
        let mut msg = messages::request("u-echo", "hi");
        msg["metadata"] = json!({"user_id": "user_victim_device_1"});
        assert_eq!(messages::create(&gw, key, &msg).await.0, 200);
    }
    let seen = fake.bodies();
    assert_eq!(seen.len(), 9);
    let keys: Vec<&Value> = seen.iter().map(|b| &b["prompt_cache_key"]).collect();
    for (i, k) in keys.iter().enumerate() {
        let k = k
            .as_str()
            .unwrap_or_else(|| panic!("no key in {}", seen[i]));
        assert!(!k.contains("victim") && k.len() == 64, "{k}");
    }
    // Alice's three kinds of key differ from Bob's, and each is stable for her.
    for surface in 0..3 {
        assert_ne!(keys[surface], keys[3 + surface]);
        assert_eq!(keys[surface], keys[6 + surface]);
    }
    assert_ne!(seen[0]["user"], seen[3]["user"]);
    assert_eq!(seen[0]["user"], seen[6]["user"]);
}

#[tokio::test]
async fn scratch_folders_a_dead_gateway_left_are_swept_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let hex = "c9d5aa00c9d5aa00c9d5aa00c9d5aa00";
    let stale = tmp.path().join(format!("turnstile-acp-{dead}-2-{hex}"));
    let live = tmp
        .path()
        .join(format!("turnstile-acp-{}-2-{hex}", std::process::id()));
    for dir in [&stale, &live] {
        std::fs::create_dir_all(dir.join("work")).unwrap();
        std::fs::write(dir.join("work/transcript"), "what the agent wrote").unwrap();
    }
    let _gw = Gateway::start_with(Opts {
        env: vec![("TMPDIR".into(), tmp.path().display().to_string())],
        ..Opts::default()
    })
    .await;
    assert!(!stale.exists(), "the dead gateway's folder is still there");
    assert!(
        live.join("work/transcript").exists(),
        "a live process's folder went"
    );
}

#[tokio::test]
async fn a_principals_stored_summaries_are_bounded_its_oldest_going_first() {
    use crate::support::responses;
    let gw = Gateway::start_with(Opts {
        continuations: "max_compactions_per_client = 2",
        ..Opts::default()
    })
    .await;
    let mut items = Vec::new();
    for n in 0..3 {
        let input = json!([{"type": "message", "role": "user", "content": format!("part {n}")},
                           {"type": "compaction_trigger"}]);
        let (s, r) = responses::create(&gw, BOB, &json!({"model": "echo", "input": input})).await;
        assert_eq!(s, 200, "{r}");
        items.push(r["output"][0].clone());
    }
    let works = async |item: &Value| {
        let input = json!([item, {"type": "message", "role": "user", "content": "go on"}]);
        let (s, r) = responses::create(&gw, BOB, &json!({"model": "echo", "input": input})).await;
        assert!(s == 200 || s == 404, "{s} {r}");
        s == 200
    };
    assert!(works(&items[2]).await, "the newest stays");
    let older = u8::from(works(&items[0]).await) + u8::from(works(&items[1]).await);
    assert_eq!(older, 1, "two kept in all");
}
