//! Approvals of the backend's own side effects (spec section 5): policy, durable records,
//! decisions, visibility, endings, events and the CLI. The demo backend's spy records every
//! answer it received to an approval request: the side effect runs only on `accept`.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::*;

fn decisions(gw: &Gateway) -> Vec<String> {
    gw.spy_events("approval_decision")
        .iter()
        .map(|e| {
            e["answer"]["result"]["decision"]
                .as_str()
                .unwrap_or("?")
                .to_string()
        })
        .collect()
}

async fn decide(gw: &Gateway, key: &str, id: &str, body: Value) -> (u16, Value) {
    let r = gw
        .http
        .post(format!("{}/v1/approvals/{id}/decision", gw.url))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// Starts a streaming chat on `model` in the background; returns its task.
fn start(gw: &Gateway, model: &str, prompt: &str) -> tokio::task::JoinHandle<(u16, String)> {
    let req = gw.post(
        ALICE,
        &json!({"model": model, "stream": true, "messages": [user(prompt)]}),
    );
    tokio::spawn(async move {
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.text().await.unwrap_or_default())
    })
}

fn streamed_text(body: &str) -> String {
    sse_events(body)
        .0
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect()
}

#[tokio::test]
async fn policy_allow_and_deny_answer_without_a_record() {
    let gw = Gateway::start().await;
    let (s, v) = gw
        .chat(
            ALICE,
            &json!({"model": "cmd-allow", "messages": [user("go")]}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(content(&v), "Command ran.");
    for model in ["cmd-deny", "cmd-default"] {
        let (s, v) = gw
            .chat(ALICE, &json!({"model": model, "messages": [user("go")]}))
            .await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(content(&v), "Command declined.", "{model}");
    }
    assert_eq!(decisions(&gw), ["accept", "decline", "decline"]);
    let (_, list) = get(&gw, ROOT, "/v1/approvals").await;
    assert_eq!(list["data"], json!([]));
}

#[tokio::test]
async fn ask_then_approve_runs_the_side_effect_once() {
    let gw = Gateway::start().await;
    let chat = start(&gw, "cmd-ask", "go");
    let a = pending(&gw, ALICE).await;
    let id = a["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("apr-") && id.len() == 36);
    assert_eq!(a["object"], "approval");
    assert_eq!(a["state"], "pending");
    assert!(a["reason"].is_null() && a["decided_at"].is_null());
    assert_eq!(a["kind"], "command");
    assert_eq!(a["client"], "alice");
    assert_eq!(a["model"], "cmd-ask");
    assert_eq!(a["summary"]["command"], "/bin/bash -lc 'rm -rf build'");
    assert_eq!(a["summary"]["backend_reason"], "clean the build");
    assert!(a["execution_id"].as_str().unwrap().starts_with("exe-"));
    assert_eq!(
        a["expires_at"].as_u64().unwrap() - a["created_at"].as_u64().unwrap(),
        60
    );
    // No backend ids leak into the record.
    let thread = gw.thread_starts()[0]["thread"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!a.to_string().contains(&thread) && !a.to_string().contains("call_sh_"));
    assert!(decisions(&gw).is_empty());
    let (s, shown) = get(&gw, ALICE, &format!("/v1/approvals/{id}")).await;
    assert_eq!((s, &shown), (200, &a));

    let (s, settled) = decide(
        &gw,
        ALICE,
        &id,
        json!({"decision": "approve", "reason": "fine"}),
    )
    .await;
    assert_eq!(s, 200, "{settled}");
    assert_eq!(
        (settled["state"].as_str(), settled["reason"].as_str()),
        (Some("approved"), Some("human"))
    );
    assert_eq!(settled["decided_by"], "alice");
    assert_eq!(settled["decision_reason"], "fine");
    let (status, body) = tokio::time::timeout(Duration::from_secs(15), chat)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, 200);
    assert!(body.contains(&format!(": approval pending {id}")), "{body}");
    assert_eq!(streamed_text(&body), "Command ran.");
    // A second decision: 409 with the settled record; the backend got exactly one answer.
    let (s, v) = decide(&gw, ALICE, &id, json!({"decision": "deny"})).await;
    assert_eq!(s, 409);
    assert_eq!(error_code(&v), "approval_already_decided");
    assert_eq!(v["approval"]["state"], "approved");
    assert_eq!(decisions(&gw), ["accept"]);
    let (_, approved) = get(&gw, ALICE, "/v1/approvals?state=approved").await;
    assert_eq!(approved["data"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn approver_denies_a_file_change() {
    let gw = Gateway::start().await;
    let chat = start(&gw, "file-ask", "go");
    let a = pending(&gw, ROOT).await;
    assert_eq!(a["kind"], "file_change");
    let (s, v) = decide(
        &gw,
        ROOT,
        a["id"].as_str().unwrap(),
        json!({"decision": "deny"}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (
            v["state"].as_str(),
            v["reason"].as_str(),
            v["decided_by"].as_str()
        ),
        (Some("denied"), Some("human"), Some("root"))
    );
    let (_, body) = tokio::time::timeout(Duration::from_secs(15), chat)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(streamed_text(&body), "File change declined.");
    assert_eq!(decisions(&gw), ["decline"]);
}

#[tokio::test]
async fn concurrent_decisions_have_one_winner() {
    let gw = Gateway::start().await;
    let chat = start(&gw, "cmd-ask", "go");
    let id = pending(&gw, ALICE).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let racers = (0..4).map(|i| {
        let d = if i % 2 == 0 { "approve" } else { "deny" };
        decide(
            &gw,
            if i < 2 { ALICE } else { ROOT },
            &id,
            json!({"decision": d}),
        )
    });
    let results = futures::future::join_all(racers).await;
    let mut statuses: Vec<u16> = results.iter().map(|r| r.0).collect();
    statuses.sort();
    assert_eq!(statuses, [200, 409, 409, 409]);
    let winner = &results.iter().find(|r| r.0 == 200).unwrap().1;
    let _ = tokio::time::timeout(Duration::from_secs(15), chat)
        .await
        .unwrap();
    let got = decisions(&gw);
    assert_eq!(got.len(), 1);
    let expected = if winner["state"] == "approved" {
        "accept"
    } else {
        "decline"
    };
    assert_eq!(
        got[0], expected,
        "the stored decision is what the backend received"
    );
    for (s, v) in &results {
        if *s == 409 {
            assert_eq!(v["approval"]["state"], winner["state"]);
        }
    }
}

#[tokio::test]
async fn foreign_clients_see_nothing_and_bad_bodies_change_nothing() {
    let gw = Gateway::start().await;
    let chat = start(&gw, "cmd-ask", "go");
    let id = pending(&gw, ALICE).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let unknown = format!("apr-{}", "0".repeat(32));
    // Show and decide: foreign = unknown, byte for byte.
    for path in [
        format!("/v1/approvals/{id}"),
        format!("/v1/approvals/{unknown}"),
    ] {
        let r = gw
            .http
            .get(format!("{}{path}", gw.url))
            .bearer_auth(BOB)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404);
    }
    let a = gw
        .http
        .get(format!("{}/v1/approvals/{id}", gw.url))
        .bearer_auth(BOB)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let b = gw
        .http
        .get(format!("{}/v1/approvals/{unknown}", gw.url))
        .bearer_auth(BOB)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(a, b);
    assert!(String::from_utf8_lossy(&a).contains("approval_not_found"));
    let (s1, v1) = decide(&gw, BOB, &id, json!({"decision": "approve"})).await;
    let (s2, v2) = decide(&gw, BOB, &unknown, json!({"decision": "approve"})).await;
    assert_eq!((s1, &v1), (s2, &v2));
    assert_eq!(s1, 404);
    let (_, list) = get(&gw, BOB, "/v1/approvals").await;
    assert_eq!(list["data"], json!([]));
    // A token is not an approval id.
    let (s, _) = decide(
        &gw,
        ALICE,
        &format!("srct-{}", "0".repeat(32)),
        json!({"decision": "approve"}),
    )
    .await;
    assert_eq!(s, 404);
    // Strict bodies: 400, still pending.
    for bad in [
        json!({"decision": "true"}),
        json!({"decision": 1}),
        json!({}),
        json!({"decision": "approve", "always_approve": true}),
        json!({"decision": "approve", "reason": 5}),
        json!({"decision": "approve", "reason": "x".repeat(1001)}),
        json!("approve"),
    ] {
        let (s, v) = decide(&gw, ALICE, &id, bad.clone()).await;
        assert_eq!(s, 400, "{bad}: {v}");
        assert_eq!(error_code(&v), "invalid_request");
    }
    assert_eq!(
        get(&gw, ALICE, &format!("/v1/approvals/{id}")).await.1["state"],
        "pending"
    );
    assert!(decisions(&gw).is_empty());
    let (s, _) = decide(&gw, ALICE, &id, json!({"decision": "approve"})).await;
    assert_eq!(s, 200);
    let _ = tokio::time::timeout(Duration::from_secs(15), chat)
        .await
        .unwrap();
    assert_eq!(decisions(&gw), ["accept"]);
    let (s, _) = get(&gw, ALICE, "/v1/approvals?state=bogus").await;
    assert_eq!(s, 400);
}

#[tokio::test]
async fn ttl_expiry_denies_and_late_decision_is_409() {
    let gw = Gateway::start_with(Opts {
        approval_ttl_seconds: 1,
        ..Opts::default()
    })
    .await;
    let (s, v) = gw
        .chat(
            ALICE,
            &json!({"model": "cmd-ask", "messages": [user("go")]}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(content(&v), "Command declined.");
    let (_, list) = get(&gw, ALICE, "/v1/approvals?state=denied").await;
    let a = &list["data"][0];
    assert_eq!(a["reason"], "expired");
    let (s, v) = decide(
        &gw,
        ALICE,
        a["id"].as_str().unwrap(),
        json!({"decision": "approve"}),
    )
    .await;
    assert_eq!(s, 409);
    assert_eq!(v["approval"]["reason"], "expired");
    assert_eq!(decisions(&gw), ["decline"]);
}

#[tokio::test]
async fn client_disconnect_cancels_pending_approvals() {
    let gw = Gateway::start().await;
    let resp = gw
        .post(
            ALICE,
            &json!({"model": "cmd-ask", "stream": true, "messages": [user("go")]}),
        )
        .send()
        .await
        .unwrap();
    let id = pending(&gw, ALICE).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    drop(resp);
    gw.wait_spy("approval_decision", 1).await;
    assert_eq!(decisions(&gw), ["decline"]);
    let a = get(&gw, ALICE, &format!("/v1/approvals/{id}")).await.1;
    assert_eq!(
        (a["state"].as_str(), a["reason"].as_str()),
        (Some("denied"), Some("cancelled"))
    );
    let (s, _) = decide(&gw, ALICE, &id, json!({"decision": "approve"})).await;
    assert_eq!(s, 409);
    assert_eq!(decisions(&gw), ["decline"]);
}

#[tokio::test]
async fn restart_orphans_pending_approvals() {
    let mut gw = Gateway::start().await;
    let _resp = gw
        .post(
            ALICE,
            &json!({"model": "cmd-ask", "stream": true, "messages": [user("go")]}),
        )
        .send()
        .await
        .unwrap();
    let id = pending(&gw, ALICE).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    // A crash, not a graceful stop: nothing gets to settle the approval.
    gw.signal("KILL");
    let mut child = gw.child.take().unwrap();
    let _ = tokio::task::spawn_blocking(move || child.wait()).await;
    gw.spawn().await;
    let a = get(&gw, ALICE, &format!("/v1/approvals/{id}")).await.1;
    assert_eq!(
        (a["state"].as_str(), a["reason"].as_str()),
        (Some("denied"), Some("orphaned"))
    );
    let (s, v) = decide(&gw, ALICE, &id, json!({"decision": "approve"})).await;
    assert_eq!(s, 409);
    assert_eq!(v["approval"]["reason"], "orphaned");
    assert!(!decisions(&gw).contains(&"accept".to_string()));
}

#[tokio::test]
async fn store_failure_denies() {
    // Locks the SQLite file itself, so it keeps SQLite on a PostgreSQL run too.
    let gw = Gateway::start_with(Opts {
        sqlite: true,
        ..Opts::default()
    })
    .await;
    let chat = start(&gw, "cmd-ask", "go delay=1500");
    gw.wait_spy("turn_start", 1).await;
    // Another connection holds the database's write lock while the approval is asked.
    let lock = SqliteLock::take(&gw.dir.path().join("turnstile.db"));
    gw.wait_spy("approval_decision", 1).await;
    drop(lock);
    assert_eq!(decisions(&gw), ["decline"]);
    let (_, body) = tokio::time::timeout(Duration::from_secs(15), chat)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(streamed_text(&body), "Command declined.");
    // Nothing was recorded, so nothing can be approved later.
    assert_eq!(get(&gw, ALICE, "/v1/approvals").await.1["data"], json!([]));
    assert!(gw.log().contains("store_unavailable"));
}

#[tokio::test]
async fn events_stream_created_then_decided() {
    let gw = Gateway::start().await;
    let mut events = open_events(&gw, ROOT).await;
    let chat = start(&gw, "cmd-ask", "go");
    let id = pending(&gw, ROOT).await["id"].as_str().unwrap().to_string();
    decide(&gw, ROOT, &id, json!({"decision": "approve"})).await;
    let mut seen = String::new();
    while !seen.contains("event: decided") {
        let c = tokio::time::timeout(Duration::from_secs(10), events.chunk())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&c));
    }
    let created = seen.find("event: created").expect("created event");
    let decided = seen.find("event: decided").unwrap();
    assert!(created < decided);
    let data: Vec<Value> = seen
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(data[0]["type"], "created");
    assert_eq!(data[0]["approval"]["id"], id.as_str());
    assert_eq!(data[1]["approval"]["state"], "approved");
    let _ = tokio::time::timeout(Duration::from_secs(15), chat)
        .await
        .unwrap();
}

#[tokio::test]
async fn cli_approves_end_to_end() {
    let gw = Gateway::start().await;
    let chat = start(&gw, "cmd-ask", "go");
    let id = pending(&gw, ROOT).await["id"].as_str().unwrap().to_string();
    let url = gw.url.clone();
    let run = move |args: Vec<String>| {
        std::process::Command::new(env!("CARGO_BIN_EXE_turnstile"))
            .arg("approvals")
            .args(args)
            .env("TURNSTILE_URL", &url)
            .env("TURNSTILE_KEY", ROOT)
            .output()
            .unwrap()
    };
    let r = run.clone();
    let out = tokio::task::spawn_blocking(move || {
        r(vec!["list".into(), "--state".into(), "pending".into()])
    })
    .await
    .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(&id));
    let i = id.clone();
    let out = tokio::task::spawn_blocking(move || {
        run(vec!["approve".into(), i, "--reason".into(), "ok".into()])
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["state"], "approved");
    let (_, body) = tokio::time::timeout(Duration::from_secs(15), chat)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(streamed_text(&body), "Command ran.");
    assert_eq!(decisions(&gw), ["accept"]);
}

/// Opens `GET /v1/approvals/events` as `key` and reads its opening comment.
pub(super) async fn open_events(gw: &Gateway, key: &str) -> reqwest::Response {
    let mut events = gw
        .http
        .get(format!("{}/v1/approvals/events", gw.url))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), 200);
    // The stream is open once its first comment arrives.
    let first = tokio::time::timeout(Duration::from_secs(10), events.chunk())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&first).starts_with(':'));
    events
}

/// Reads a stream to its end (bounded); what it carried.
pub(super) async fn to_end(mut events: reqwest::Response) -> String {
    let mut seen = String::new();
    loop {
        match tokio::time::timeout(WAIT, events.chunk()).await {
            Ok(Ok(Some(c))) => seen.push_str(&String::from_utf8_lossy(&c)),
            Ok(_) => return seen,
            Err(_) => panic!("the stream did not end: {seen}"),
        }
    }
}

/// Rewrites the config with `edit` applied and reloads it.
async fn reload(gw: &Gateway, edit: impl Fn(String) -> String, n: usize) {
    let text = edit(config_text(&gw.opts, gw.dir.path()));
    std::fs::write(gw.config_path(), text).unwrap();
    gw.signal("HUP");
    wait_until("reload logged", || {
        gw.log().matches("config reloaded").count() >= n
    })
    .await;
}

/// Security review finding 1: an approvals event stream is authorized for as long as it is
/// open, not once: a reload that takes the approver role away, or the key, ends it before
/// it carries another principal's approval.
#[tokio::test]
async fn an_event_stream_ends_when_its_authority_is_revoked() {
    let gw = Gateway::start().await;
    let no_role = |t: String| t.replace("roles = [\"approver\"]", "roles = []");
    let no_key = |t: String| t.replace(&hash(ROOT), &hash("sk-another-key-entirely"));
    let edits: [&dyn Fn(String) -> String; 2] = [&no_role, &no_key];
    for (n, edit) in edits.into_iter().enumerate() {
        if n > 0 {
            reload(&gw, |t| t, 2 * n).await;
        }
        let events = open_events(&gw, ROOT).await;
        reload(&gw, edit, 2 * n + 1).await;
        let chat = start(&gw, "cmd-ask", &format!("go {n}"));
        wait_until("alice's approval", || {
            gw.log().matches("approval pending").count() > n
        })
        .await;
        let seen = to_end(events).await;
        assert!(!seen.contains("event: created"), "{seen}");
        chat.abort();
    }
}

/// Security review finding 3: the list filters by principal before its limit, so another
/// client's 1001 approvals do not hide one's own.
#[tokio::test]
async fn another_clients_approvals_do_not_push_ones_own_out_of_the_list() {
    let gw = Gateway::start_with(Opts {
        sqlite: true,
        ..Opts::default()
    })
    .await;
    let chat = start(&gw, "cmd-ask", "go");
    let mine = wait_for("alice's approval", async || {
        let (_, v) = get(&gw, ALICE, "/v1/approvals").await;
        v["data"].as_array().filter(|d| !d.is_empty()).cloned()
    })
    .await;
    assert_eq!(mine.len(), 1);
    chat.abort();
    // 1001 newer approvals of bob's, written straight into the store.
    let db = gw.dir.path().join("turnstile.db");
    let script = "import sqlite3,sys\nc=sqlite3.connect(sys.argv[1])\ncols=[r[1] for r in c.execute('PRAGMA table_info(approvals)')]\nrow=dict(zip(cols,c.execute('SELECT * FROM approvals LIMIT 1').fetchone()))\nfor i in range(1001):\n  r=dict(row); r.pop('seq',None); r['id']='apr-bob-%d'%i; r['principal']='bob'\n  c.execute('INSERT INTO approvals (%s) VALUES (%s)'%(','.join(r),','.join('?'*len(r))),list(r.values()))\nc.commit()";
    let out = std::process::Command::new("python3")
        .args(["-c", script, db.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, v) = get(&gw, ALICE, "/v1/approvals").await;
    assert_eq!(v["data"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["data"][0]["id"], mine[0]["id"]);
    let (_, all) = get(&gw, ROOT, "/v1/approvals").await;
    assert_eq!(all["data"].as_array().unwrap().len(), 1000);
}
