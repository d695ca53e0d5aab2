//! Backend threads over their whole life, on the demo backend: every ending releases the
//! thread (`thread/delete`), a completed turn's thread is kept idle for the conversation's
//! next turn (continuity: principal-bound, bounded, released after its idle TTL), effort
//! reaches `turn/start` and is bound in the fingerprint, a process is recycled after
//! `recycle_after_threads` while a held turn on it still resumes, and usage is totalled per
//! client and model, interrupted turns included.

use serde_json::{json, Value};

use crate::support::responses::{create, response_text};
use crate::support::*;

/// The conversation so far plus the assistant's answer and a new user message.
fn follow_up(req: &Value, resp: &Value, next: &str) -> Value {
    let mut req = req.clone();
    let messages = req["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": content(resp)}));
    messages.push(user(next));
    req
}

fn turn_starts(gw: &Gateway) -> Vec<Value> {
    gw.spy_events("turn_start")
}

/// `thread_delete` events of execution threads (the startup probe's excluded).
fn released(gw: &Gateway) -> Vec<Value> {
    let probes: Vec<Value> = gw
        .spy_events("thread_start")
        .into_iter()
        .filter(|e| e["dynamic_tools"] == json!(["turnstile_probe"]))
        .map(|e| e["thread"].clone())
        .collect();
    gw.spy_events("thread_delete")
        .into_iter()
        .filter(|e| !probes.contains(&e["thread"]))
        .collect()
}

async fn wait_released(gw: &Gateway, n: usize) -> Vec<Value> {
    wait_for(
        &format!("{n} execution threads to be deleted"),
        async || {
            let found = released(gw);
            (found.len() >= n).then_some(found)
        },
    )
    .await
}

async fn ok_chat(gw: &Gateway, key: &str, body: &Value) -> Value {
    let (s, v) = gw.chat(key, body).await;
    assert_eq!(s, 200, "{v}");
    v
}

#[tokio::test]
async fn a_conversation_continues_on_one_thread_and_edited_history_gets_a_fresh_one() {
    let gw = Gateway::start().await;
    let first = json!({"model": "echo", "messages": [
        {"role": "system", "content": "be brief"}, user("one")]});
    let a1 = ok_chat(&gw, ALICE, &first).await;
    let second = follow_up(&first, &a1, "two");
    let a2 = ok_chat(&gw, ALICE, &second).await;
    assert_eq!(content(&a2), "You said: two");
    let third = follow_up(&second, &a2, "three");
    let a3 = ok_chat(&gw, ALICE, &third).await;
    assert_eq!(content(&a3), "You said: three");
    // One thread, three turns; turns 2 and 3 got only their new message (no transcript).
    assert_eq!(gw.thread_starts().len(), 1, "{:?}", gw.spy());
    let starts = turn_starts(&gw);
    assert_eq!(starts.len(), 3);
    assert!(starts.iter().all(|t| t["thread"] == starts[0]["thread"]));
    assert_eq!(starts[1]["input"], json!(["two"]));
    assert_eq!(starts[2]["input"], json!(["three"]));

    // An edited answer is another conversation: a fresh thread with the transcript.
    let mut edited = follow_up(&second, &a2, "four");
    edited["messages"][2]["content"] = json!("something I never said");
    let a4 = ok_chat(&gw, ALICE, &edited).await;
    assert_eq!(content(&a4), "You said: four");
    assert_eq!(gw.thread_starts().len(), 2);
    let last = turn_starts(&gw).pop().unwrap();
    assert_ne!(last["thread"], starts[0]["thread"]);
    assert!(last["input"][0]
        .as_str()
        .unwrap()
        .contains("something I never said"));

    let (_, metrics) = get_text(&gw, ALICE, "/metrics").await;
    assert!(
        metrics.contains("turnstile_continuity_hits_total 2"),
        "{metrics}"
    );
    assert!(metrics.contains("turnstile_continuity_misses_total{reason=\"unknown\"} 1"));
    assert!(metrics.contains("turnstile_continuity_idle_threads 2"));
}

#[tokio::test]
async fn continuity_is_bound_to_the_principal_the_tools_and_the_effort() {
    let gw = Gateway::start().await;
    let first = json!({"model": "echo", "messages": [user("one")]});
    let a1 = ok_chat(&gw, ALICE, &first).await;
    let second = follow_up(&first, &a1, "two");
    // Bob sending alice's exact conversation gets a fresh thread.
    ok_chat(&gw, BOB, &second).await;
    // So does alice with other tools or another effort.
    let mut tools = second.clone();
    tools["tools"] = json!([read_tool()]);
    ok_chat(&gw, ALICE, &tools).await;
    let mut effort = second.clone();
    effort["reasoning_effort"] = json!("high");
    ok_chat(&gw, ALICE, &effort).await;
    assert_eq!(gw.thread_starts().len(), 4);
    // Alice's own follow-up still finds her thread.
    ok_chat(&gw, ALICE, &second).await;
    assert_eq!(gw.thread_starts().len(), 4, "{:?}", gw.spy());
    let (_, metrics) = get_text(&gw, ALICE, "/metrics").await;
    assert!(
        metrics.contains("turnstile_continuity_misses_total{reason=\"binding\"} 3"),
        "{metrics}"
    );
}

#[tokio::test]
async fn previous_response_id_of_a_completed_response_continues_its_thread() {
    let gw = Gateway::start().await;
    let first = json!({"model": "echo", "input": "one"});
    let (s, r1) = create(&gw, ALICE, &first).await;
    assert_eq!(s, 200, "{r1}");
    let next = json!({"model": "echo", "previous_response_id": r1["id"], "input": "two"});
    // Another principal naming it: the same 404 as an unknown id, nothing taken.
    let (s, v) = create(&gw, BOB, &next).await;
    assert_eq!(
        (s, error_code(&v)),
        (404, "continuation_not_found".into()),
        "{v}"
    );
    let (s, unknown) = create(
        &gw,
        ALICE,
        &json!({"model": "echo", "previous_response_id": "resp_0123", "input": "two"}),
    )
    .await;
    assert_eq!(s, 404);
    assert_eq!(unknown["error"]["message"], v["error"]["message"]);
    // Another effort is a mismatch, and takes nothing either.
    let mut effort = next.clone();
    effort["reasoning"] = json!({"effort": "low"});
    let (s, v) = create(&gw, ALICE, &effort).await;
    assert_eq!(
        (s, error_code(&v)),
        (400, "continuation_mismatch".into()),
        "{v}"
    );

    let (s, r2) = create(&gw, ALICE, &next).await;
    assert_eq!(s, 200, "{r2}");
    assert_eq!(response_text(&r2), "You said: two");
    let (s, r3) = create(
        &gw,
        ALICE,
        &json!({"model": "echo", "previous_response_id": r2["id"], "input": "three"}),
    )
    .await;
    assert_eq!((s, response_text(&r3)), (200, "You said: three".into()));
    assert_eq!(gw.thread_starts().len(), 1);
    // A response already continued is no longer held.
    let (s, _) = create(&gw, ALICE, &next).await;
    assert_eq!(s, 404);
}

#[tokio::test]
async fn idle_threads_are_bounded_per_client_and_released_after_their_ttl() {
    let gw = Gateway::start_with(Opts {
        continuity: "idle_ttl_seconds = 1\nmax_idle_per_client = 1",
        ..Opts::default()
    })
    .await;
    let a = json!({"model": "echo", "messages": [user("a")]});
    let b = json!({"model": "echo", "messages": [user("b")]});
    ok_chat(&gw, ALICE, &a).await;
    let rb = ok_chat(&gw, ALICE, &b).await;
    // Alice's second conversation released her first thread (bound of one).
    let deleted = wait_released(&gw, 1).await;
    let threads = gw.thread_starts();
    assert_eq!(deleted[0]["thread"], threads[0]["thread"]);
    // After the idle TTL the other is released too, and its follow-up starts afresh.
    let deleted = wait_released(&gw, 2).await;
    assert_eq!(deleted[1]["thread"], threads[1]["thread"]);
    ok_chat(&gw, ALICE, &follow_up(&b, &rb, "b2")).await;
    assert_eq!(gw.thread_starts().len(), 3);
    let (_, metrics) = get_text(&gw, ALICE, "/metrics").await;
    assert!(
        metrics.contains("turnstile_continuity_released_total{reason=\"client_bound\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("turnstile_continuity_released_total{reason=\"ttl\"} 1"));
}

#[tokio::test]
async fn every_ending_releases_the_thread() {
    let gw = Gateway::start_with(Opts {
        continuity: "enabled = false",
        execution_ttl_seconds: 2,
        ..Opts::default()
    })
    .await;
    // Completed (nothing kept with continuity off).
    ok_chat(
        &gw,
        ALICE,
        &json!({"model": "echo", "messages": [user("x")]}),
    )
    .await;
    wait_released(&gw, 1).await;
    // Failed.
    let (s, _) = gw
        .chat(ALICE, &json!({"model": "fail", "messages": [user("x")]}))
        .await;
    assert_eq!(s, 502);
    wait_released(&gw, 2).await;
    // Cancelled: the client leaves mid-leg; the turn is interrupted, then deleted.
    drop(gw.hold_stream(ALICE).await);
    gw.wait_spy("interrupt", 1).await;
    wait_released(&gw, 3).await;
    // Expired while held.
    let (s, v) = gw.chat(ALICE, &tool_request("tool", "read /a")).await;
    assert_eq!((s.as_u16(), calls(&v).len()), (200, 1));
    let deletes = wait_released(&gw, 4).await;
    assert_eq!(gw.spy_events("interrupt").len(), 2);
    assert_eq!(deletes.len(), gw.thread_starts().len());
    assert_eq!(
        deletes.last().unwrap()["loaded"],
        0,
        "no thread is left loaded"
    );
}

#[tokio::test]
async fn effort_reaches_the_backend_and_a_changed_effort_is_drift() {
    let gw = Gateway::start().await;
    let (s, v) = gw
        .chat(
            ALICE,
            &json!({"model": "echo", "reasoning_effort": "turbo", "messages": [user("x")]}),
        )
        .await;
    assert_eq!(
        (s.as_u16(), error_code(&v)),
        (400, "invalid_request".into())
    );
    assert_eq!(v["error"]["param"], "reasoning_effort");

    let mut req = tool_request("tool", "read /etc/hostname");
    req["reasoning_effort"] = json!("high");
    let (s, v) = gw.chat(ALICE, &req).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(turn_starts(&gw)[0]["effort"], "high");
    let mut changed = continuation(&req, &v, |_, _| json!("R"));
    changed["reasoning_effort"] = json!("low");
    let (s, e) = gw.chat(ALICE, &changed).await;
    assert_eq!(
        (s.as_u16(), error_code(&e)),
        (400, "continuation_mismatch".into()),
        "{e}"
    );
    // Nothing was consumed: the right effort resumes.
    let (s, done) = gw
        .chat(ALICE, &continuation(&req, &v, |_, _| json!("R")))
        .await;
    assert_eq!((s.as_u16(), content(&done)), (200, "Tool result: R".into()));
}

#[tokio::test]
async fn a_held_turn_lives_across_a_recycle_and_the_old_process_exits() {
    let gw = Gateway::start_with(Opts {
        recycle_after_threads: 2,
        continuity: "enabled = false",
        ..Opts::default()
    })
    .await;
    let req = tool_request("tool", "read /etc/hostname");
    let (s, held) = gw.chat(ALICE, &req).await;
    assert_eq!((s.as_u16(), calls(&held).len()), (200, 1));
    // The second thread reaches the bound: a fresh process is started and takes new work.
    ok_chat(
        &gw,
        ALICE,
        &json!({"model": "echo", "messages": [user("x")]}),
    )
    .await;
    let started = gw.wait_spy("started", 2).await;
    let (old, new) = (started[0]["pid"].clone(), started[1]["pid"].clone());
    wait_for("new turns on the fresh process", async || {
        ok_chat(
            &gw,
            ALICE,
            &json!({"model": "echo", "messages": [user("y")]}),
        )
        .await;
        let last = gw
            .spy_events("request")
            .into_iter()
            .rev()
            .find(|e| e["method"] == "turn/start")?;
        (last["pid"] == new).then_some(())
    })
    .await;
    let old_pid = old.as_u64().unwrap();
    assert!(pid_alive(old_pid), "drains first");
    // The held turn still resumes on the old process, which then exits.
    let (s, done) = gw
        .chat(ALICE, &continuation(&req, &held, |_, _| json!("R")))
        .await;
    assert_eq!((s.as_u16(), content(&done)), (200, "Tool result: R".into()));
    // Drained, it is killed (and reaped).
    wait_until("the old process to exit", || !pid_alive(old_pid)).await;
    ok_chat(
        &gw,
        ALICE,
        &json!({"model": "echo", "messages": [user("z")]}),
    )
    .await;
}

#[tokio::test]
async fn usage_is_totalled_per_client_and_model_interrupted_turns_included() {
    let gw = Gateway::start().await;
    ok_chat(
        &gw,
        ALICE,
        &json!({"model": "echo", "messages": [user("x")]}),
    )
    .await;
    ok_chat(&gw, BOB, &json!({"model": "echo", "messages": [user("x")]})).await;
    // Alice leaves a turn mid-leg: the backend reports that request's usage after the
    // interrupt, and it still counts.
    drop(gw.hold_stream(ALICE).await);
    wait_released(&gw, 1).await;
    let (s, mine) = get(&gw, ALICE, "/v1/usage").await;
    assert_eq!(s, 200, "{mine}");
    let rows = mine["data"].as_array().unwrap();
    assert!(rows.iter().all(|r| r["client"] == "alice"), "{mine}");
    let row = |model: &str| rows.iter().find(|r| r["model"] == model).cloned().unwrap();
    assert_eq!(row("echo")["input_tokens"], 10);
    assert_eq!(row("echo")["output_tokens"], 5);
    assert_eq!(row("echo")["reasoning_tokens"], 2);
    assert_eq!(row("hang")["input_tokens"], 10, "{mine}");
    assert_eq!(row("hang")["requests"], 1);
    assert_eq!(mine["total"]["input_tokens"], 20);
    // A client asking for another's sees nothing; an approver sees everyone.
    let (_, foreign) = get(&gw, ALICE, "/v1/usage?client=bob").await;
    assert_eq!(foreign["data"], json!([]));
    let (_, all) = get(&gw, ROOT, "/v1/usage").await;
    assert_eq!(all["total"]["input_tokens"], 30, "{all}");
    let (_, bob) = get(&gw, ROOT, "/v1/usage?client=bob").await;
    assert_eq!(bob["data"].as_array().unwrap().len(), 1);
    let today = rows[0]["date"].as_str().unwrap().to_string();
    let (_, later) = get(&gw, ROOT, &format!("/v1/usage?from={today}&to={today}")).await;
    assert_eq!(later["total"]["input_tokens"], 30);
    let (s, bad) = get(&gw, ROOT, "/v1/usage?from=yesterday").await;
    assert_eq!((s, error_code(&bad)), (400, "invalid_request".into()));
    let (_, metrics) = get_text(&gw, ROOT, "/metrics").await;
    assert!(
        metrics
            .contains("turnstile_tokens_total{client=\"alice\",model=\"hang\",kind=\"input\"} 10"),
        "{metrics}"
    );

    // The CLI reads the same endpoint.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args(["usage", "--url", &gw.url, "--key", ROOT, "--client", "bob"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["total"]["input_tokens"], 10);
}

/// No one but an approver reads principals off `/metrics`: without a credential, or with a
/// client's, the same series come totalled by model.
#[tokio::test]
async fn metrics_name_principals_only_to_an_approver() {
    let gw = Gateway::start().await;
    ok_chat(
        &gw,
        ALICE,
        &json!({"model": "echo", "messages": [user("x")]}),
    )
    .await;
    let counted = "turnstile_tokens_total{client=\"alice\",model=\"echo\",kind=\"input\"} 10";
    wait_for("alice's usage in an approver's scrape", async || {
        let (_, text) = get_text(&gw, ROOT, "/metrics").await;
        text.contains(counted).then_some(())
    })
    .await;
    let anonymous = gw
        .http
        .get(format!("{}/metrics", gw.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let (_, alices) = get_text(&gw, ALICE, "/metrics").await;
    for text in [&anonymous, &alices] {
        assert!(!text.contains("client="), "{text}");
        assert!(
            text.contains("turnstile_tokens_total{model=\"echo\",kind=\"input\"} 10"),
            "{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_plain_turns_release_every_thread_but_the_kept_ones() {
    let gw = Gateway::start().await;
    for batch in 0..25 {
        let turns: Vec<_> = (0..4)
            .map(|i| {
                let body = json!({"model": "echo", "messages": [user(&format!("t{batch}.{i}"))]});
                let gw = &gw;
                async move { gw.chat(ALICE, &body).await }
            })
            .collect();
        for (s, v) in futures::future::join_all(turns).await {
            assert_eq!(s, 200, "{v}");
        }
    }
    // 100 threads; alice keeps at most 4 idle (the default bound), every other one goes.
    let deleted = wait_released(&gw, 96).await;
    assert_eq!(gw.thread_starts().len(), 100);
    assert_eq!(deleted.len(), 96);
    let (_, metrics) = get_text(&gw, ALICE, "/metrics").await;
    assert!(
        metrics.contains("turnstile_continuity_idle_threads 4"),
        "{metrics}"
    );
}
