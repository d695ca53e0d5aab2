//! Notifications (`[[webhooks]]`): every delivery verified by the `standardwebhooks` library in
//! a real endpoint (`tests/clients/webhook_receiver.py`), retries with the same id, delivery
//! after a crash, and nothing secret in any body.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use crate::clients::sdk::python;
use crate::support::*;

mod replicas;

pub(crate) const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// The secret being rotated out: the gateway signs with both during the overlap.
pub(crate) const PREVIOUS: &str = "whsec_dHVybnN0aWxlLXByZXZpb3VzLXNlY3JldC0wMDAx";
/// In the prompt, the tool's arguments and its result: never in a notification.
pub(crate) const CANARY: &str = "canary-7f3e1d-never-notified";

/// The endpoint process and the deliveries it reported.
pub(crate) struct Receiver {
    child: Child,
    pub port: u16,
    seen: Arc<Mutex<Vec<Value>>>,
}

impl Receiver {
    /// None when the venv is missing outside CI (a loud skip).
    pub fn start(plan: &str) -> Option<Receiver> {
        let Some(py) = python() else {
            eprintln!("\n!!!!! SKIPPED webhook test: no venv at .cache/venv (run .ci/run) !!!!!\n");
            assert!(
                std::env::var_os("CI").is_none(),
                "the venv must exist in CI"
            );
            return None;
        };
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/clients/webhook_receiver.py"
        );
        let mut child = Command::new(py)
            .arg(script)
            .env("RECEIVER_SECRETS", format!("{SECRET} {PREVIOUS}"))
            .env("RECEIVER_PLAN", plan)
            .stdout(Stdio::piped())
            .spawn()
            .expect("receiver");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut first = String::new();
        out.read_line(&mut first).expect("receiver line");
        let port = first
            .trim()
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("receiver said {first:?}"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    sink.lock().expect("lock").push(v);
                }
            }
        });
        Some(Receiver { child, port, seen })
    }

    pub fn seen(&self) -> Vec<Value> {
        self.seen.lock().expect("lock").clone()
    }

    /// Waits (bounded) until `n` deliveries of `event` arrived; returns them (a timeout
    /// shows what arrived and the gateway's log).
    pub async fn wait(&self, gw: &Gateway, event: &str, n: usize) -> Vec<Value> {
        let detail = || format!("seen: {:?}\nlog: {}", self.seen(), gw.log());
        wait_for_within(
            &format!("{n} deliveries of {event}"),
            WAIT,
            detail,
            async || {
                let got: Vec<Value> = self
                    .seen()
                    .into_iter()
                    .filter(|d| d["type"] == event)
                    .collect();
                (got.len() >= n).then_some(got)
            },
        )
        .await
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The endpoint `ops` (every event unless `extra` says, standard format unless it says) at `r`.
pub(crate) fn section(r: &Receiver, extra: &str) -> String {
    endpoint("ops", r, extra)
}

/// Endpoint `id` at `r`, signing with the test secrets.
pub(crate) fn endpoint(id: &str, r: &Receiver, extra: &str) -> String {
    format!(
        "\n[[webhooks]]\nid = \"{id}\"\nurl = \"http://127.0.0.1:{}/hooks\"\nsecret_env = \"OPS_SECRET\"\nprevious_secret_env = \"OPS_PREVIOUS\"\n{extra}\n",
        r.port
    )
}

/// Options whose environment holds the endpoint's secrets.
pub(crate) fn opts() -> Opts {
    Opts {
        env: vec![
            ("OPS_SECRET".into(), SECRET.into()),
            ("OPS_PREVIOUS".into(), PREVIOUS.into()),
        ],
        ..Opts::default()
    }
}

/// A gateway whose endpoint `ops` is `r`.
pub(crate) async fn gateway(r: &Receiver, extra: &str) -> Gateway {
    let section = section(r, extra);
    Gateway::start_raw(opts(), move |o, d| config_text(o, d) + &section).await
}

async fn test_event(gw: &Gateway, key: &str) -> (u16, Value) {
    let r = gw
        .http
        .post(format!("{}/v1/webhooks/ops/test", gw.url))
        .bearer_auth(key)
        .send()
        .await
        .expect("test event");
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn every_event_is_delivered_signed_by_both_secrets_and_carries_no_secret() {
    let Some(r) = Receiver::start("") else {
        return;
    };
    let gw = gateway(&r, "").await;

    // An approval asked and decided.
    let chat = {
        let req = gw.post(
            ALICE,
            &json!({"model": "cmd-ask", "stream": true, "messages": [user(CANARY)]}),
        );
        tokio::spawn(async move { req.send().await.expect("chat").text().await })
    };
    let pending = r.wait(&gw, "approval.pending", 1).await;
    let approval = &pending[0]["body"]["data"];
    assert_eq!(approval["client"], "alice");
    assert_eq!(approval["state"], "pending");
    let id = approval["id"].as_str().expect("approval id");
    let decided = gw
        .http
        .post(format!("{}/v1/approvals/{id}/decision", gw.url))
        .bearer_auth(ROOT)
        .json(&json!({"decision": "approve"}))
        .send()
        .await
        .expect("decide");
    assert_eq!(decided.status(), 200);
    let decided = r.wait(&gw, "approval.decided", 1).await;
    assert_eq!(decided[0]["body"]["data"]["state"], "approved");
    assert_eq!(decided[0]["body"]["data"]["decided_by"], "root");
    chat.await.expect("join").expect("chat body");

    // A held turn: its calls exposed, then answered.
    let req = tool_request("tool", CANARY);
    let (s, held) = gw.chat(ALICE, &req).await;
    assert_eq!(s, 200, "{held}");
    let requires = r.wait(&gw, "turn.requires_action", 1).await;
    let data = &requires[0]["body"]["data"];
    assert_eq!(
        (data["client"].as_str(), data["calls"].as_u64()),
        (Some("alice"), Some(1))
    );
    let next = continuation(&req, &held, |_, _| json!(CANARY));
    let (s, done) = gw.chat(ALICE, &next).await;
    assert_eq!(s, 200, "{done}");

    // A failed execution; then a test event asked by an approver (anyone else: 404).
    let (s, _) = gw
        .chat(ALICE, &json!({"model": "fail", "messages": [user(CANARY)]}))
        .await;
    assert!(s.is_server_error(), "{s}");
    let failed = r.wait(&gw, "execution.failed", 1).await;
    assert_eq!(failed[0]["body"]["data"]["reason"], "failed");
    assert_eq!(test_event(&gw, ALICE).await.0, 404);
    let (s, queued) = test_event(&gw, ROOT).await;
    assert_eq!(s, 202, "{queued}");
    let test = r.wait(&gw, "webhook.test", 1).await;
    assert_eq!(test[0]["id"], queued["id"]);

    let all = r.seen();
    for d in &all {
        assert_eq!(
            d["verified"],
            json!([true, true]),
            "both secrets verify: {d}"
        );
        let raw = d["raw"].as_str().expect("raw");
        for secret in [CANARY, ALICE, ROOT, SECRET, PREVIOUS, "srct-", "sk-"] {
            assert!(!raw.contains(secret), "{secret} in {raw}");
        }
        assert!(
            d["id"].as_str().is_some_and(|i| i.starts_with("msg_")),
            "{d}"
        );
    }
    let ids: std::collections::HashSet<_> = all.iter().map(|d| d["id"].clone()).collect();
    assert_eq!(ids.len(), all.len(), "each event once: {all:?}");

    // The console's view and the metrics agree.
    let (s, view) = get(&gw, ROOT, "/v1/webhooks").await;
    assert_eq!(s, 200, "{view}");
    assert_eq!(get(&gw, ALICE, "/v1/webhooks").await.0, 404);
    let sent = view["endpoints"][0]["sent"].as_u64().expect("sent");
    assert!(sent >= all.len() as u64 - 1, "{view}");
    let delivered = view["deliveries"]
        .as_array()
        .expect("deliveries")
        .iter()
        .filter(|d| d["state"] == "delivered")
        .count();
    assert!(delivered >= all.len() - 1, "{view}");
    let (_, metrics) = get_text(&gw, ROOT, "/metrics").await;
    assert!(
        metrics.contains("turnstile_webhook_deliveries_total{endpoint=\"ops\",outcome=\"sent\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("turnstile_webhook_outbox{endpoint=\"ops\",state=\"dead\"} 0"),
        "{metrics}"
    );
    assert_eq!(view["endpoints"][0]["outbox"]["dead"], 0, "{view}");
}

#[tokio::test]
async fn a_refused_delivery_is_retried_with_the_same_id() {
    let Some(r) = Receiver::start("500") else {
        return;
    };
    let gw = gateway(&r, "events = [\"approval.pending\"]").await;
    let (s, queued) = test_event(&gw, ROOT).await;
    assert_eq!(s, 202);
    let got = r.wait(&gw, "webhook.test", 2).await;
    assert_eq!(
        (got[0]["answered"].as_str(), got[1]["answered"].as_str()),
        (Some("500"), Some("200"))
    );
    assert_eq!(got[0]["id"], queued["id"]);
    assert_eq!(got[1]["id"], queued["id"]);
    assert_ne!(
        got[0]["timestamp"], got[1]["timestamp"],
        "each attempt is signed anew"
    );
    let row = wait_for("the delivery recorded", async || {
        let (_, v) = get(&gw, ROOT, "/v1/webhooks").await;
        let row = v["deliveries"][0].clone();
        (row["state"] == "delivered").then_some(row)
    })
    .await;
    assert_eq!(
        (row["attempts"].as_u64(), row["last_status"].as_u64()),
        (Some(2), Some(200))
    );
    let (_, metrics) = get_text(&gw, ROOT, "/metrics").await;
    assert!(
        metrics
            .contains("turnstile_webhook_deliveries_total{endpoint=\"ops\",outcome=\"retried\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn an_event_whose_delivery_a_crash_cut_short_arrives_after_the_restart() {
    let Some(r) = Receiver::start("hang") else {
        return;
    };
    let mut gw = gateway(&r, "").await;
    let (s, queued) = test_event(&gw, ROOT).await;
    assert_eq!(s, 202);
    // The attempt is in flight (the endpoint never answers) when the gateway dies.
    r.wait(&gw, "webhook.test", 1).await;
    gw.signal("KILL");
    let _ = gw.child.take().map(|mut c| c.wait());
    gw.spawn().await;
    let got = r.wait(&gw, "webhook.test", 2).await;
    assert_eq!(got[1]["id"], queued["id"]);
    assert_eq!(got[1]["verified"], json!([true, true]));
}

/// A Managed Agents session's status changes reach an endpoint in Anthropic's webhook shape:
/// the `anthropic` SDK's `client.beta.webhooks.unwrap` verifies and parses each.
#[tokio::test]
async fn managed_agents_session_events_unwrap_with_the_anthropic_sdk() {
    let Some(r) = Receiver::start("") else {
        return;
    };
    let gw = gateway(&r, "events = [\"session.created\", \"session.running\", \"session.requires_action\", \"session.idled\", \"session.deleted\"]").await;
    if !crate::clients::managed_agents::part(&gw, "roundtrip", &[]).await {
        return;
    }
    let created = r.wait(&gw, "event", 1).await;
    let session = created[0]["unwrapped"][1]
        .as_str()
        .expect("unwrapped")
        .to_string();
    assert!(session.starts_with("sesn_"), "{created:?}");
    let kinds = wait_for("the session's events", async || {
        let kinds: Vec<String> = r
            .seen()
            .iter()
            .filter(|d| d["unwrapped"][1] == session.as_str())
            .map(|d| d["unwrapped"][0].as_str().unwrap_or("?").to_string())
            .collect();
        kinds.iter().any(|k| k == "session.idled").then_some(kinds)
    })
    .await;
    for want in [
        "session.created",
        "session.running",
        "session.requires_action",
        "session.idled",
    ] {
        assert!(kinds.iter().any(|k| k == want), "{want} in {kinds:?}");
    }
    for d in r.seen() {
        assert_eq!(d["verified"], json!([true, true]), "{d}");
        assert_eq!(d["unwrapped"][2], "event", "{d}");
        assert_eq!(
            d["unwrapped"][3], d["id"],
            "the event id is its webhook-id: {d}"
        );
    }
}

/// The POST of a decision link, as the confirmation page's button sends it.
async fn follow(gw: &Gateway, url: &str, post: bool) -> (u16, String) {
    let req = if post {
        gw.http.post(url)
    } else {
        gw.http.get(url)
    };
    let r = req.send().await.expect("link");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

/// Slack-ready approvals: the Block Kit message's Approve and Deny links. A GET only shows
/// the confirmation page; the POST decides once; a second use, the other link and a link of
/// an approval decided in the console change nothing.
#[tokio::test]
async fn a_decision_link_decides_once_and_a_get_never_decides() {
    let Some(r) = Receiver::start("") else {
        return;
    };
    let gw = gateway(
        &r,
        "events = [\"approval.pending\", \"approval.decided\"]\nformat = \"slack\"",
    )
    .await;
    let start = |gw: &Gateway| {
        let req = gw.post(
            ALICE,
            &json!({"model": "cmd-ask", "stream": true, "messages": [user("go")]}),
        );
        tokio::spawn(async move { req.send().await.expect("chat").text().await })
    };
    let buttons = |d: &Value| -> (String, String) {
        let blocks = d["body"]["blocks"].as_array().expect("blocks");
        let actions = blocks
            .iter()
            .find(|b| b["type"] == "actions")
            .expect("actions");
        let url = |i: usize| {
            actions["elements"][i]["url"]
                .as_str()
                .expect("url")
                .to_string()
        };
        (url(0), url(1))
    };
    let chat = start(&gw);
    let msg = wait_for("the Block Kit message", async || {
        r.seen()
            .into_iter()
            .find(|d| d["body"]["blocks"].is_array())
    })
    .await;
    assert!(msg["verified"][0].as_bool().unwrap_or(false), "{msg}");
    let (approve, deny) = buttons(&msg);
    assert!(
        approve.contains("/v1/decisions/sdl-") && deny.contains("/v1/decisions/sdl-"),
        "{approve}"
    );
    let (s, page) = follow(&gw, &approve, false).await;
    assert_eq!(s, 200, "{page}");
    assert!(page.contains("<form method=\"post\">"), "{page}");
    let (_, pending) = get(&gw, ROOT, "/v1/approvals?state=pending").await;
    assert_eq!(
        pending["data"].as_array().map(Vec::len),
        Some(1),
        "a GET decided: {pending}"
    );
    let (s, page) = follow(&gw, &approve, true).await;
    assert_eq!(s, 200, "{page}");
    assert!(page.contains("Approved"), "{page}");
    assert_eq!(follow(&gw, &approve, true).await.0, 410);
    assert_eq!(follow(&gw, &deny, true).await.0, 410);
    assert_eq!(follow(&gw, &deny, false).await.0, 410);
    chat.await.expect("join").expect("chat body");
    let (_, approved) = get(&gw, ROOT, "/v1/approvals?state=approved").await;
    assert_eq!(
        approved["data"][0]["decided_by"], "webhook:ops",
        "{approved}"
    );

    // Decided in the console first: the links show it and change nothing.
    let chat = start(&gw);
    let second = wait_for("the second message", async || {
        let msgs: Vec<Value> = r
            .seen()
            .into_iter()
            .filter(|d| d["body"]["blocks"].is_array())
            .collect();
        msgs.iter()
            .filter(|d| d["body"]["metadata"]["event_type"] == "approval_pending")
            .nth(1)
            .cloned()
    })
    .await;
    let (approve, _) = buttons(&second);
    let id = second["body"]["metadata"]["event_payload"]["id"]
        .as_str()
        .expect("id")
        .to_string();
    let r2 = gw
        .http
        .post(format!("{}/v1/approvals/{id}/decision", gw.url))
        .bearer_auth(ROOT)
        .json(&json!({"decision": "deny"}))
        .send()
        .await
        .expect("decide");
    assert_eq!(r2.status(), 200);
    let (s, page) = follow(&gw, &approve, true).await;
    assert_eq!(s, 409, "{page}");
    assert!(page.contains("already denied by root"), "{page}");
    chat.await.expect("join").expect("chat body");
    // Unknown tokens look alike.
    let unknown = format!(
        "{}/v1/decisions/sdl-00000000000000000000000000000000",
        gw.url
    );
    assert_eq!(follow(&gw, &unknown, true).await.0, 404);
}

/// `budget.threshold`: a usage write that crosses 75 %, 95 % or 100 % of a daily, monthly or
/// token cap is one event, sent once per threshold in the cap's window.
#[tokio::test]
async fn a_budget_threshold_crossed_is_notified_once() {
    let Some(r) = Receiver::start("") else {
        return;
    };
    let section = section(&r, "events = [\"budget.threshold\"]");
    let gw = Gateway::start_raw(opts(), move |o, d| {
        let text = config_text(o, d) + &section;
        crate::operations::budgets::priced(text, &[("alice", "{ usd_per_day = 4.0 }")])
    })
    .await;
    // $1 a turn; a usage read writes the turn's usage at once.
    let turn = async || {
        let (s, v) = gw
            .chat(
                ALICE,
                &json!({"model": "p-echo", "messages": [user(CANARY)]}),
            )
            .await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(get(&gw, ALICE, "/v1/usage").await.0, 200);
    };
    for _ in 0..3 {
        turn().await;
    }
    let first = r.wait(&gw, "budget.threshold", 1).await;
    let data = &first[0]["body"]["data"];
    assert_eq!(
        *data,
        json!({"object": "budget_threshold", "client": "alice", "cap": "usd_per_day",
               "threshold": 75, "limit": 4.0, "used": 3.0, "unit": "usd",
               "resets_at": data["resets_at"]}),
    );
    assert!(data["resets_at"].as_u64().is_some_and(|t| t % 86_400 == 0));
    turn().await;
    let both = r.wait(&gw, "budget.threshold", 2).await;
    assert_eq!(both[1]["body"]["data"]["threshold"], 100);
    assert_eq!(both.len(), 2, "75 % once: {both:?}");
    assert_eq!(both[1]["verified"], json!([true, true]));
    assert!(!both[1]["raw"].as_str().unwrap_or("").contains(CANARY));
}

/// A decision link of an approval that expired shows so and changes nothing.
#[tokio::test]
async fn a_decision_link_after_its_approval_expired_changes_nothing() {
    let Some(r) = Receiver::start("") else {
        return;
    };
    let section = section(
        &r,
        "events = [\"approval.pending\", \"approval.decided\"]\nformat = \"slack\"",
    );
    let gw = Gateway::start_raw(
        Opts {
            approval_ttl_seconds: 1,
            ..opts()
        },
        move |o, d| config_text(o, d) + &section,
    )
    .await;
    let req = gw.post(
        ALICE,
        &json!({"model": "cmd-ask", "stream": true, "messages": [user("go")]}),
    );
    let chat = tokio::spawn(async move { req.send().await.expect("chat").text().await });
    let msg = wait_for("the Block Kit message", async || {
        r.seen()
            .into_iter()
            .find(|d| d["body"]["metadata"]["event_type"] == "approval_pending")
    })
    .await;
    let approve = msg["body"]["blocks"]
        .as_array()
        .and_then(|b| b.iter().find(|b| b["type"] == "actions"))
        .and_then(|a| a["elements"][0]["url"].as_str())
        .expect("approve url")
        .to_string();
    // The approval expires; the message is updated.
    let decided = wait_for("the expiry's message", async || {
        r.seen()
            .into_iter()
            .find(|d| d["body"]["metadata"]["event_type"] == "approval_decided")
    })
    .await;
    assert!(
        decided["body"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("expired")),
        "{decided}"
    );
    for post in [false, true] {
        let (s, page) = follow(&gw, &approve, post).await;
        assert!(s == 409 || s == 410, "{s} {page}");
        assert!(page.contains("expired"), "{page}");
    }
    chat.await.expect("join").expect("chat body");
    let (_, approved) = get(&gw, ROOT, "/v1/approvals?state=approved").await;
    assert_eq!(approved["data"], json!([]), "{approved}");
}
