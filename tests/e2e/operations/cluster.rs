//! Three gateway replicas on one real PostgreSQL server (started by the tests, see
//! `support/postgres.rs`), each with its own demo backend: a held turn is continued through
//! any replica (forwarded to its owner and streamed back), raced claims have one winner,
//! tombstones and approvals are shared, a killed owner's turns become `continuation_lost` once
//! its lease lapses, and a stateless upstream's continuation needs no owner at all.

use std::io::Write as _;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::fake_upstream::FakeUpstream;
use crate::support::postgres;
use crate::support::{responses, *};

/// Short, so the lapse of a killed replica's lease is quick to reach.
const LEASE_SECONDS: u64 = 2;

fn report(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// One replica on database `db`, with the demo backend and, given a fake upstream's URL, the
/// `up-tool` model on it.
async fn replica(id: &str, db: &str, upstream: Option<String>) -> Gateway {
    replica_with(id, db, upstream, Opts::default()).await
}

async fn replica_with(id: &str, db: &str, upstream: Option<String>, opts: Opts) -> Gateway {
    replica_at(id, db, upstream, opts, None).await
}

/// A replica that advertises `advertise_url` (else its internal listener) to the others.
async fn replica_at(
    id: &str,
    db: &str,
    upstream: Option<String>,
    opts: Opts,
    advertise_url: Option<String>,
) -> Gateway {
    let (id, db) = (id.to_string(), db.to_string());
    Gateway::start_raw(opts, move |o, dir| {
        replica_config(o, dir, &id, &db, upstream, advertise_url)
    })
    .await
}

/// The config of replica `id` on database `db` (see [`replica_at`]).
pub fn replica_config(
    o: &Opts,
    dir: &std::path::Path,
    id: &str,
    db: &str,
    upstream: Option<String>,
    advertise_url: Option<String>,
) -> String {
    let mut s = config_text(o, dir).replace("[store]\npath = \"turnstile.db\"\n", "");
    s.push_str(&postgres::store_section(db));
    s.push_str(&format!(
        "\n[cluster]\nreplica_id = \"{id}\"\ninternal_listen = \"127.0.0.1:0\"\nkey_env = \"{CLUSTER_KEY_ENV}\"\nlease_seconds = {LEASE_SECONDS}\n"
    ));
    if let Some(url) = advertise_url {
        s.push_str(&format!("advertise_url = \"{url}\"\n"));
    }
    if let Some(url) = upstream {
        s.push_str(&format!(
            "\n[backends.up]\nkind = \"openai\"\nbase_url = \"{url}\"\napi_key_env = \"TURNSTILE_TEST_UPSTREAM_KEY\"\n\n[[models]]\nid = \"up-tool\"\nbackend = \"up\"\nbackend_model = \"up-tool\"\n"
        ));
    }
    s
}

/// Replicas `a`, `b`, `c` on a fresh database.
async fn three(upstream: Option<String>) -> (String, Vec<Gateway>) {
    let db = postgres::database();
    let mut out = Vec::new();
    for id in ["a", "b", "c"] {
        out.push(replica(id, &db, upstream.clone()).await);
    }
    (db, out)
}

/// A streamed `cmd-ask` turn of alice's on `a`, waiting on its approval, and the approval's id
/// once `b` lists it (the store is shared). The task ends with the turn's status and body.
async fn ask_on(a: &Gateway, b: &Gateway) -> (tokio::task::JoinHandle<(u16, String)>, String) {
    let req = a.post(
        ALICE,
        &json!({"model": "cmd-ask", "stream": true, "messages": [user("go")]}),
    );
    let chat = tokio::spawn(async move {
        let r = req.send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap_or_default())
    });
    let id = wait_for("the approval on B", async || {
        let (_, v) = get(b, ROOT, "/v1/approvals?state=pending").await;
        v["data"][0]["id"].as_str().map(String::from)
    })
    .await;
    (chat, id)
}

/// A tool turn suspended on `gw`: the request and its response.
async fn suspend(gw: &Gateway, prompt: &str) -> (Value, Value) {
    let req = tool_request("tool", prompt);
    let (status, resp) = gw.chat(ALICE, &req).await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(calls(&resp).len(), 1, "{resp}");
    (req, resp)
}

fn answer(req: &Value, resp: &Value, text: &str) -> Value {
    continuation(req, resp, |_, _| json!(text))
}

fn streamed(body: &Value) -> Value {
    let mut b = body.clone();
    b["stream"] = json!(true);
    b
}

/// The text of a streamed chat answer.
fn stream_text(body: &str) -> String {
    let (events, done) = sse_events(body);
    assert_eq!(done, 1, "{body}");
    events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect()
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_turn_suspended_on_a_continues_through_b_streamed_like_a_direct_one() {
    let (_db, gws) = three(None).await;
    let (a, b) = (&gws[0], &gws[1]);

    // Direct, on the owner.
    let (req, resp) = suspend(a, "read the notes").await;
    let (status, _, direct) = a
        .chat_stream(ALICE, &streamed(&answer(&req, &resp, "notes: 42")))
        .await;
    assert_eq!(status, 200, "{direct}");
    // Forwarded: the same turn shape, continued on B.
    let (req, resp) = suspend(a, "read the notes").await;
    let (status, _, forwarded) = b
        .chat_stream(ALICE, &streamed(&answer(&req, &resp, "notes: 42")))
        .await;
    assert_eq!(status, 200, "{forwarded}");
    assert_eq!(stream_text(&forwarded), stream_text(&direct));
    assert!(stream_text(&forwarded).contains("notes: 42"), "{forwarded}");
    // Non-streaming through C as well.
    let (req, resp) = suspend(a, "read the notes").await;
    let (status, v) = gws[2].chat(ALICE, &answer(&req, &resp, "notes: 7")).await;
    assert_eq!(status, 200, "{v}");
    assert!(content(&v).contains("notes: 7"), "{v}");
    // The owner's backend answered every call; B's and C's never saw a turn.
    assert_eq!(a.spy_events("tool_result").len(), 3);
    assert!(b.spy_events("turn_start").is_empty() && gws[2].spy_events("turn_start").is_empty());
    let (_, m) = get_text(b, ROOT, "/metrics").await;
    assert_eq!(
        metric(
            &m,
            "turnstile_forwarded_total{kind=\"continuation\",status=\"200\"}"
        ),
        1.0,
        "{m}"
    );
    assert!(metric(&m, "turnstile_lease_renewals_total") >= 0.0);

    // The hop's cost, against direct continuations in the same run (figures for the record,
    // not a timed assertion).
    let mut direct = Vec::new();
    let mut hop = Vec::new();
    for i in 0..20 {
        for (via, out) in [(a, &mut direct), (b, &mut hop)] {
            let (req, resp) = suspend(a, &format!("read {i}")).await;
            let body = answer(&req, &resp, "ok");
            let started = Instant::now();
            let (status, v) = via.chat(ALICE, &body).await;
            out.push(started.elapsed());
            assert_eq!(status, 200, "{v}");
        }
    }
    direct.sort();
    hop.sort();
    let (d, h) = (direct[direct.len() / 2], hop[hop.len() / 2]);
    report(&format!(
        "cluster hop: continuation p50 direct {:.2} ms, through another replica {:.2} ms, added {:.2} ms (20 each)",
        d.as_secs_f64() * 1e3,
        h.as_secs_f64() * 1e3,
        (h.as_secs_f64() - d.as_secs_f64()) * 1e3
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_token_raced_on_three_replicas_has_one_winner_and_replay_anywhere_is_409() {
    let (_db, gws) = three(None).await;
    let (req, resp) = suspend(&gws[0], "read the notes").await;
    let body = answer(&req, &resp, "notes: 42");
    let sends: Vec<_> = gws.iter().map(|g| g.post(ALICE, &body).send()).collect();
    let results = futures::future::join_all(sends).await;
    let mut statuses: Vec<u16> = Vec::new();
    for r in results {
        let r = r.unwrap();
        let status = r.status().as_u16();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        if status == 409 {
            assert_eq!(error_code(&v), "continuation_already_resolved", "{v}");
        }
        statuses.push(status);
    }
    statuses.sort();
    assert_eq!(statuses, [200, 409, 409], "{statuses:?}");
    assert_eq!(gws[0].spy_events("tool_result").len(), 1);
    // Replay after success, on a replica that never saw the turn.
    let (status, v) = gws[2].chat(ALICE, &body).await;
    assert_eq!(
        (status.as_u16(), error_code(&v).as_str()),
        (409, "continuation_already_resolved")
    );
    // Another principal learns nothing anywhere.
    for g in &gws {
        let (status, v) = g.chat(BOB, &body).await;
        assert_eq!(
            (status.as_u16(), error_code(&v).as_str()),
            (404, "continuation_not_found"),
            "{v}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_owner_s_held_turn_is_lost_once_its_lease_lapses_never_a_fresh_turn() {
    let (db, mut gws) = three(None).await;
    let (req, resp) = suspend(&gws[0], "read the notes").await;
    let body = answer(&req, &resp, "notes: 42");
    gws[0].signal("KILL");
    let _ = gws[0].child.take().map(|mut c| c.wait());
    // B cannot reach A, waits out A's lease, settles A, answers 410.
    let started = Instant::now();
    let (status, v) = gws[1].chat(ALICE, &body).await;
    assert_eq!(
        (status.as_u16(), error_code(&v).as_str()),
        (410, "continuation_lost"),
        "{v}"
    );
    assert!(started.elapsed() < Duration::from_secs(LEASE_SECONDS + 5));
    // Tombstoned for everyone: C answers the same without waiting.
    let (status, v) = gws[2].chat(ALICE, &body).await;
    assert_eq!(
        (status.as_u16(), error_code(&v).as_str()),
        (410, "continuation_lost"),
        "{v}"
    );
    // Never re-run elsewhere.
    for g in &gws[1..] {
        assert!(g.spy_events("turn_start").is_empty(), "a fresh turn ran");
    }
    let settled = postgres::psql(&db, "SELECT settled FROM replicas WHERE replica_id = 'a'");
    assert_eq!(settled, "1");
    let lost = postgres::psql(&db, "SELECT count(*) FROM tombstones WHERE reason = 'lost'");
    assert_eq!(lost, "1");
    let (_, m) = get_text(&gws[1], ROOT, "/metrics").await;
    assert!(
        metric(
            &m,
            "turnstile_forwarded_total{kind=\"continuation\",status=\"0\"}"
        ) >= 1.0,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateless_continuation_suspended_on_a_is_claimed_on_b_with_a_stopped() {
    let fake = FakeUpstream::start().await;
    let (_db, mut gws) = three(Some(fake.url.clone())).await;
    let req = tool_request("up-tool", "read x");
    let (status, resp) = gws[0].chat(ALICE, &req).await;
    assert_eq!(status, 200, "{resp}");
    let token = calls(&resp)[0]["id"].as_str().unwrap().to_string();
    assert!(token.starts_with("srct-"), "{resp}");
    assert_eq!(gws[0].stop().await, Some(0));
    let body = answer(&req, &resp, "contents of x");
    let (status, v) = gws[1].chat(ALICE, &body).await;
    assert_eq!(status, 200, "{v}");
    // The upstream got its own call id back, never the token.
    assert_eq!(content(&v), "Results: call_up_1=contents of x", "{v}");
    let forwarded = fake.bodies().last().cloned().unwrap();
    assert!(!forwarded.to_string().contains(&token));
    // Spent for everyone.
    let (status, v) = gws[2].chat(ALICE, &body).await;
    assert_eq!(
        (status.as_u16(), error_code(&v).as_str()),
        (409, "continuation_already_resolved"),
        "{v}"
    );
    assert_eq!(fake.bodies().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_asked_on_a_is_decided_on_b_and_reaches_a_s_backend_once() {
    let (_db, gws) = three(None).await;
    let (a, b) = (&gws[0], &gws[1]);
    // A console on C, which neither asks nor decides, sees both at once.
    let mut on_c = gws[2]
        .http
        .get(format!("{}/v1/approvals/events", gws[2].url))
        .bearer_auth(ROOT)
        .send()
        .await
        .unwrap();
    assert_eq!(on_c.status(), 200);
    let mut seen_on_c = String::new();
    let mut read_c_until = async |what: &str, id: &str| {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !seen_on_c.contains(what) || !seen_on_c.contains(id) {
            let chunk = tokio::time::timeout_at(deadline, on_c.chunk())
                .await
                .unwrap_or_else(|_| panic!("no `{what}` on C's event stream: {seen_on_c}"))
                .unwrap()
                .expect("C's event stream ended");
            seen_on_c.push_str(&String::from_utf8_lossy(&chunk));
        }
        std::mem::take(&mut seen_on_c)
    };
    // Visible on B (the store is shared).
    let (chat, id) = ask_on(a, b).await;
    let created = read_c_until("event: created", &id).await;
    assert!(created.contains("\"state\":\"pending\""), "{created}");
    let r = b
        .http
        .post(format!("{}/v1/approvals/{id}/decision", b.url))
        .bearer_auth(ROOT)
        .json(&json!({"decision": "approve"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (v["state"].as_str(), v["decided_by"].as_str()),
        (Some("approved"), Some("root")),
        "{v}"
    );
    let decided = read_c_until("event: decided", &id).await;
    assert!(decided.contains("\"decided_by\":\"root\""), "{decided}");
    let (status, text) = tokio::time::timeout(Duration::from_secs(15), chat)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, 200, "{text}");
    let decisions: Vec<Value> = a.spy_events("approval_decision");
    assert_eq!(decisions.len(), 1, "{decisions:?}");
    assert_eq!(decisions[0]["answer"]["result"]["decision"], "accept");
    // A second decision on C: already decided, the backend is not answered again.
    let r = gws[2]
        .http
        .post(format!("{}/v1/approvals/{id}/decision", gws[2].url))
        .bearer_auth(ROOT)
        .json(&json!({"decision": "deny"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409);
    assert_eq!(a.spy_events("approval_decision").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_every_replica_restarts_tombstones_still_answer_409_and_readiness_shows_the_lease() {
    let (_db, mut gws) = three(None).await;
    let (req, resp) = suspend(&gws[0], "read the notes").await;
    let body = answer(&req, &resp, "notes: 42");
    let (status, v) = gws[1].chat(ALICE, &body).await;
    assert_eq!(status, 200, "{v}");
    for g in gws.iter_mut() {
        assert_eq!(g.stop().await, Some(0));
        g.spawn().await;
    }
    for g in &gws {
        let (status, v) = g.chat(ALICE, &body).await;
        assert_eq!(
            (status.as_u16(), error_code(&v).as_str()),
            (409, "continuation_already_resolved"),
            "{v}"
        );
        let (status, ready) = get(g, ROOT, "/readyz").await;
        assert_eq!(status, 200, "{ready}");
        assert_eq!(ready["checks"]["store"]["engine"], "postgres");
        assert_eq!(ready["checks"]["lease"]["status"], "ok");
    }
    // A fresh turn still works on each restarted replica.
    let (status, v) = gws[2]
        .chat(ALICE, &json!({"model": "echo", "messages": [user("hi")]}))
        .await;
    assert_eq!(status, 200, "{v}");
    let (_, m) = get_text(&gws[0], ROOT, "/metrics").await;
    assert!(metric(&m, "turnstile_replicas_seen") >= 1.0, "{m}");
}

/// Security review finding 12: the relay to an owner replica carries the cluster key and the
/// client's credential, so it never goes through a proxy named by the environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_to_the_owner_ignores_proxy_variables() {
    let trap = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = format!("http://{}", trap.local_addr().unwrap());
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = seen.clone();
    let trap_task = tokio::spawn(async move {
        while let Ok((socket, _)) = trap.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(socket);
        }
    });
    let env: Vec<(String, String)> = ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"]
        .iter()
        .map(|k| (k.to_string(), proxy.clone()))
        .chain([("NO_PROXY".to_string(), String::new())])
        .collect();
    let db = postgres::database();
    let opts = Opts {
        env,
        ..Opts::default()
    };
    let a = replica_with("a", &db, None, opts.clone()).await;
    let b = replica_with("b", &db, None, opts).await;
    let (req, resp) = suspend(&a, "read the notes").await;
    let (status, v) = b.chat(ALICE, &answer(&req, &resp, "notes: 42")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 0);
    trap_task.abort();
}

/// Security review finding 5: a decision relayed to an owner that is alive by its lease but
/// does not answer is 503 `replica_unavailable` (retry), never "already decided"; the approval
/// stays pending and is decided later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_relayed_to_an_owner_that_does_not_answer_is_503_and_stays_pending() {
    // A's lease is renewed, but the address it advertises refuses every connection.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let nowhere = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let db = postgres::database();
    let a = replica_at("a", &db, None, Opts::default(), Some(nowhere)).await;
    let b = replica("b", &db, None).await;
    let (chat, id) = ask_on(&a, &b).await;
    let decide = async |gw: &Gateway| {
        gw.http
            .post(format!("{}/v1/approvals/{id}/decision", gw.url))
            .bearer_auth(ROOT)
            .json(&json!({"decision": "approve"}))
            .send()
            .await
            .unwrap()
    };
    let r = decide(&b).await;
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let v: Value = r.json().await.unwrap();
    assert_eq!(error_code(&v), "replica_unavailable", "{v}");
    let (_, record) = get(&b, ROOT, &format!("/v1/approvals/{id}")).await;
    assert_eq!(record["state"], "pending", "{record}");
    // Decided where the backend waits, it reaches the backend once.
    let r = decide(&a).await;
    assert_eq!(r.status(), 200);
    let (status, text) = tokio::time::timeout(Duration::from_secs(15), chat)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, 200, "{text}");
    assert_eq!(a.spy_events("approval_decision").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_internal_listener_wants_the_cluster_key() {
    let (db, gws) = three(None).await;
    let url = postgres::psql(&db, "SELECT url FROM replicas WHERE replica_id = 'a'");
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let http = reqwest::Client::new();
    for key in [None, Some("wrong-key-wrong-key-wrong")] {
        let mut r = http
            .post(format!("{url}/v1/chat/completions"))
            .bearer_auth(ALICE)
            .json(&json!({"model": "echo", "messages": [user("hi")]}));
        if let Some(k) = key {
            r = r.header("x-turnstile-cluster-key", k);
        }
        let r = r.send().await.unwrap();
        assert_eq!(r.status(), 401);
    }
    let r = http
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(ALICE)
        .header("x-turnstile-cluster-key", CLUSTER_KEY)
        .json(&json!({"model": "echo", "messages": [user("hi")]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // The public listener ignores the header (it is not where replicas talk).
    let (status, _) = gws[0]
        .chat(ALICE, &json!({"model": "echo", "messages": [user("hi")]}))
        .await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_loses_the_database_refuses_fresh_turns_and_finishes_what_it_holds() {
    // Its own server, to take away; a long lease, so the held turn is still vouched for.
    let pg = postgres::Server::start();
    let db = pg.database();
    let gw = Gateway::start_raw(Opts::default(), move |o, dir| {
        let mut s = config_text(o, dir).replace("[store]\npath = \"turnstile.db\"\n", "");
        s.push_str(&postgres::store_section(&db));
        s.push_str(&format!(
            "\n[cluster]\nreplica_id = \"solo\"\ninternal_listen = \"127.0.0.1:0\"\nkey_env = \"{CLUSTER_KEY_ENV}\"\nlease_seconds = 60\n"
        ));
        s
    })
    .await;
    let (req, resp) = suspend(&gw, "read the notes").await;
    let (status, ready) = get(&gw, ROOT, "/readyz").await;
    assert_eq!(
        (status, &ready["checks"]["lease"]["status"]),
        (200, &json!("ok")),
        "{ready}"
    );
    drop(pg);
    let ready = wait_for("readiness to fail", async || {
        let (status, v) = get(&gw, ROOT, "/readyz").await;
        (status == 503).then_some(v)
    })
    .await;
    assert_eq!(ready["checks"]["store"]["status"], "failing", "{ready}");
    let (status, v) = gw
        .chat(ALICE, &json!({"model": "echo", "messages": [user("hi")]}))
        .await;
    assert_eq!(
        (status.as_u16(), error_code(&v).as_str()),
        (503, "store_unavailable"),
        "{v}"
    );
    // The held turn finishes.
    let (status, v) = gw.chat(ALICE, &answer(&req, &resp, "notes: 42")).await;
    assert_eq!(status, 200, "{v}");
    assert!(content(&v).contains("notes: 42"), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_made_on_a_is_read_on_b_and_only_by_its_principal() {
    let db = postgres::database();
    let a = replica("a", &db, None).await;
    let b = replica("b", &db, None).await;
    let trigger = json!({"model": "echo", "input": [
        {"role": "user", "content": "a long story"}, {"type": "compaction_trigger"}]});
    let (s, r) = responses::create(&a, ALICE, &trigger).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["output"][0]["type"], "compaction", "{r}");
    let next = json!({"model": "echo", "input": [
        r["output"][0].clone(), {"role": "user", "content": "go on"}]});
    let (s, r) = responses::create(&b, ALICE, &next).await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(responses::response_text(&r), "You said: go on");
    let (s, r) = responses::create(&b, BOB, &next).await;
    assert_eq!(
        (s, r["error"]["code"].as_str()),
        (404, Some("continuation_not_found"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_turn_continued_over_a_websocket_on_b_is_relayed_from_its_owner_a() {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Message};
    let db = postgres::database();
    let a = replica("a", &db, None).await;
    let b = replica("b", &db, None).await;
    let tools = json!([responses::read_file_tool()]);
    let req = json!({"model": "tool", "input": "read /tmp/relay.txt", "tools": tools});
    let (s, held) = responses::create(&a, ALICE, &req).await;
    assert_eq!(s, 200, "{held}");
    let call = responses::response_calls(&held)[0].clone();
    let mut upgrade = format!("{}/v1/responses", b.url.replace("http://", "ws://"))
        .into_client_request()
        .unwrap();
    let bearer = format!("Bearer {ALICE}").parse().unwrap();
    upgrade.headers_mut().insert("authorization", bearer);
    let (mut ws, _) = tokio_tungstenite::connect_async(upgrade)
        .await
        .expect("upgrade");
    let create = json!({"type": "response.create", "model": "tool", "tools": tools,
        "previous_response_id": held["id"],
        "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "RELAYED"}]});
    ws.send(Message::Text(create.to_string().into()))
        .await
        .unwrap();
    let mut events = Vec::new();
    let done = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(Ok(m)) = ws.next().await {
            let Message::Text(t) = m else { continue };
            let v: Value = serde_json::from_str(&t).unwrap();
            let end = matches!(v["type"].as_str(), Some("response.completed" | "error"));
            events.push(v);
            if end {
                break;
            }
        }
    })
    .await;
    assert!(done.is_ok(), "{events:?}");
    let last = events.last().cloned().unwrap_or_default();
    assert_eq!(last["type"], "response.completed", "{events:?}");
    assert_eq!(last["response"]["id"], held["id"]);
    assert_eq!(
        responses::response_text(&last["response"]),
        "Tool result: RELAYED"
    );
    let seq: Vec<u64> = events
        .iter()
        .filter_map(|e| e["sequence_number"].as_u64())
        .collect();
    assert_eq!(seq, (0..events.len() as u64).collect::<Vec<_>>());
    let metrics = b
        .http
        .get(format!("{}/metrics", b.url))
        .send()
        .await
        .unwrap();
    let metrics = metrics.text().await.unwrap();
    assert!(
        metrics.contains("turnstile_forwarded_total{kind=\"continuation\",status=\"200\"} 1"),
        "{metrics}"
    );
}
