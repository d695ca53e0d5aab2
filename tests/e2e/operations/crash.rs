//! Crash rounds: continuations (held demo turns and durable upstream records) and approvals
//! are driven while `kill -9` hits the gateway at a random moment; after each restart nothing
//! may have been answered twice, every token the client ever saw is usable once or answers
//! 409/410 (never 404, never a fresh turn; a durable one only 410 if its continuation was
//! in flight at the kill), every approval is pending or settled exactly
//! once, and SQLite passes `PRAGMA integrity_check`. `TURNSTILE_CRASH_ROUNDS` (default 12)
//! and `TURNSTILE_CRASH_SEED` (default: random, printed) replay a run.

use std::collections::HashMap;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::support::fake_upstream::FakeUpstream;
use crate::support::*;

/// A token the client was given, with the continuation that answers it.
struct Seen {
    body: Value,
    durable: bool,
    /// Answered 200 once, or refused as spent (409 / 410).
    spent: bool,
    /// Its continuation was sent before a kill cut the answer off: a durable record whose
    /// outcome is unknown is settled lost at the restart (fail closed), so 410 is allowed.
    in_flight: bool,
    /// A check answered it 410: it stays lost.
    lost: bool,
    /// What happened to it, for a failure's message.
    history: Vec<String>,
}

const PER_REQUEST: Duration = Duration::from_secs(10);

async fn post(
    gw_url: &str,
    http: &reqwest::Client,
    key: &str,
    path: &str,
    body: &Value,
) -> Option<(u16, Value)> {
    let send = http
        .post(format!("{gw_url}{path}"))
        .bearer_auth(key)
        .json(body)
        .timeout(PER_REQUEST)
        .send();
    let r = send.await.ok()?;
    let status = r.status().as_u16();
    let v = r.json().await.ok()?;
    Some((status, v))
}

/// What one round's traffic saw, as it saw it (the kill can stop it anywhere).
#[derive(Default)]
struct Log {
    /// Tokens given to the client, with their continuation and whether they are durable.
    issued: Vec<(String, Value, bool)>,
    /// Tokens whose continuation was sent.
    sent: Vec<String>,
    /// Tokens whose continuation was answered 200.
    answered: Vec<String>,
}

type Shared = std::sync::Arc<std::sync::Mutex<Log>>;

/// A tool call, then (after a random pause) its continuation.
async fn call_and_resume(
    url: String,
    http: reqwest::Client,
    model: &'static str,
    pause: u64,
    log: Shared,
) -> Option<()> {
    let req = json!({"model": model, "messages": [user("go")], "tools": [read_tool()]});
    let (s, resp) = post(&url, &http, ALICE, "/v1/chat/completions", &req).await?;
    if s != 200 {
        return None;
    }
    let token = calls(&resp)[0]["id"].as_str()?.to_string();
    let body = continuation(&req, &resp, |_, _| json!("R"));
    log.lock()
        .unwrap()
        .issued
        .push((token.clone(), body.clone(), model == "u-tool"));
    tokio::time::sleep(Duration::from_millis(pause)).await;
    log.lock().unwrap().sent.push(token.clone());
    let (s, _) = post(&url, &http, ALICE, "/v1/chat/completions", &body).await?;
    if s == 200 {
        log.lock().unwrap().answered.push(token);
    }
    Some(())
}

/// An approval asked for and approved by the approver as soon as it is listed.
async fn ask_and_approve(url: String, http: reqwest::Client) -> Option<()> {
    let body = json!({"model": "cmd-ask", "messages": [user("rm")]});
    let ask = post(&url, &http, ALICE, "/v1/chat/completions", &body);
    let decide = async {
        loop {
            let r = http
                .get(format!("{url}/v1/approvals?state=pending"))
                .bearer_auth(ROOT)
                .timeout(PER_REQUEST)
                .send()
                .await
                .ok()?;
            let v: Value = r.json().await.ok()?;
            for a in v["data"].as_array().cloned().unwrap_or_default() {
                let id = a["id"].as_str().unwrap_or_default();
                post(
                    &url,
                    &http,
                    ROOT,
                    &format!("/v1/approvals/{id}/decision"),
                    &json!({"decision": "approve"}),
                )
                .await;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::select! { _ = ask => {}, r = decide => return r }
    Some(())
}

fn integrity(gw: &Gateway) {
    let db = rusqlite::Connection::open(gw.dir.path().join("turnstile.db")).expect("open store");
    let check: String = db
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("check");
    assert_eq!(check, "ok");
    let states: Vec<String> = db
        .prepare("SELECT state FROM approvals")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for s in &states {
        assert!(
            ["pending", "approved", "denied", "expired", "cancelled"].contains(&s.as_str()),
            "state {s}"
        );
    }
    let mut settled: HashMap<String, usize> = HashMap::new();
    let details: Vec<String> = db
        .prepare("SELECT detail FROM journal WHERE event = 'approval_settled'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for d in details {
        let id = d.split_whitespace().next().unwrap_or_default().to_string();
        *settled.entry(id).or_default() += 1;
    }
    assert!(
        settled.values().all(|n| *n == 1),
        "an approval settled twice: {settled:?}"
    );
}

/// How many `event`s the demo backend recorded per value of `key`.
fn per(gw: &Gateway, event: &str, key: &str) -> HashMap<String, usize> {
    let mut counts: HashMap<String, usize> = HashMap::new();
    for e in gw.spy_events(event) {
        *counts
            .entry(e[key].as_str().unwrap_or_default().into())
            .or_default() += 1;
    }
    counts
}

fn kill9(gw: &mut Gateway) {
    let mut child = gw.child.take().expect("running");
    child.kill().expect("kill -9");
    child.wait().expect("reap");
}

#[tokio::test]
async fn kill_9_at_random_moments_loses_nothing_and_answers_nothing_twice() {
    let rounds: usize = std::env::var("TURNSTILE_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let seed: u64 = std::env::var("TURNSTILE_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random);
    println!("crash rounds: {rounds}, seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let fake = FakeUpstream::start().await;
    let url = fake.url.clone();
    // Checks the SQLite file's integrity after each kill: SQLite on a PostgreSQL run too.
    let opts = Opts {
        sqlite: true,
        ..Opts::default()
    };
    let mut gw = Gateway::start_raw(opts, move |o, dir| {
        let mut s = config_text(o, dir);
        s.push_str(&format!(
            "\n[backends.up]\nkind = \"openai\"\nbase_url = \"{url}\"\n\
             \n[[models]]\nid = \"u-tool\"\nbackend = \"up\"\nbackend_model = \"up-tool\"\n"
        ));
        s
    })
    .await;
    let mut tokens: HashMap<String, Seen> = HashMap::new();
    let mut approvals = 0;
    let mut resumed_after_restart = 0;
    for round in 0..rounds {
        let log = Shared::default();
        let mut work = tokio::task::JoinSet::new();
        for i in 0..6u64 {
            let model = if i % 2 == 0 { "tool" } else { "u-tool" };
            let pause = rng.random_range(0..150);
            work.spawn(call_and_resume(
                gw.url.clone(),
                gw.http.clone(),
                model,
                pause,
                log.clone(),
            ));
        }
        work.spawn(ask_and_approve(gw.url.clone(), gw.http.clone()));
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..400))).await;
        kill9(&mut gw);
        // The traffic ends once the gateway is gone (every request is bounded).
        tokio::time::timeout(Duration::from_secs(30), work.join_all())
            .await
            .expect("traffic ended");
        let Log {
            issued,
            sent,
            answered,
        } = std::mem::take(&mut *log.lock().unwrap());
        for (token, body, durable) in issued {
            tokens.insert(
                token,
                Seen {
                    body,
                    durable,
                    spent: false,
                    in_flight: false,
                    lost: false,
                    history: vec![format!("issued {round}")],
                },
            );
        }
        for t in sent {
            let s = tokens.get_mut(&t).expect("known token");
            s.in_flight = true;
            s.history.push(format!("sent {round}"));
        }
        for t in answered {
            let s = tokens.get_mut(&t).expect("known token");
            s.spent = true;
            s.history.push(format!("answered {round}"));
        }
        integrity(&gw);
        gw.spawn().await;

        // Every token the client ever saw: usable once, else 409 / 410; never 404.
        for (t, s) in tokens.iter_mut() {
            let (status, v) = gw.chat(ALICE, &s.body).await;
            let code = error_code(&v);
            s.history.push(format!("check {round}: {status}"));
            match status.as_u16() {
                200 => {
                    assert!(
                        s.durable && !s.spent,
                        "round {round}: {t} answered again: {v}"
                    );
                    resumed_after_restart += 1;
                }
                // A lost token stays lost.
                409 => assert!(
                    code == "continuation_already_resolved" && !s.lost,
                    "round {round}: {:?}: {v}",
                    s.history
                ),
                410 => assert!(
                    (!s.durable || s.lost || s.in_flight && !s.spent)
                        && code == "continuation_lost",
                    "round {round}: {:?}: {v}",
                    s.history
                ),
                other => panic!("round {round}: {t} answered {other}: {v}"),
            }
            s.lost |= status.as_u16() == 410;
            s.spent = true;
            s.in_flight = false;
        }
        // The backend never saw a held call answered twice, nor an approval decided twice.
        let results = per(&gw, "tool_result", "call_id");
        assert!(
            results.values().all(|n| *n == 1),
            "round {round}: {results:?}"
        );
        let decided = per(&gw, "approval_decision", "thread");
        assert!(
            decided.values().all(|n| *n == 1),
            "round {round}: {decided:?}"
        );
        let (s, v) = get(&gw, ROOT, "/v1/approvals").await;
        assert_eq!(s, 200, "{v}");
        approvals = v["data"].as_array().map_or(0, Vec::len);
    }
    let held = tokens.values().filter(|s| !s.durable).count();
    println!(
        "crash rounds survived: {rounds}; tokens checked: {} ({held} held, {} durable), durable tokens first resumed after a kill: {resumed_after_restart}, approvals: {approvals}, answered by the backend: {}",
        tokens.len(),
        tokens.len() - held,
        gw.spy_events("approval_decision").len()
    );
    gw.stop().await;
    // Every backend process a killed gateway left behind has exited.
    for e in gw.spy_events("started") {
        let pid = e["pid"].as_u64().unwrap_or_default();
        wait_until("a killed gateway's backend process to exit", || {
            !pid_alive(pid)
        })
        .await;
    }
}
