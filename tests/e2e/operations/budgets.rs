//! Budgets against the real binary and the demo backend: daily token and USD caps refuse the
//! next fresh turn with 402 on all three surfaces (another principal unaffected), a
//! per-execution cap stops a running multi-round turn at its next round (the backend turn
//! interrupted, replays 410 across a restart), two replicas on PostgreSQL share one
//! principal's daily cap, and `turnstile check` warns of an unpriced model under a USD cap.

use std::process::Command;

use serde_json::{json, Value};

use crate::operations::cluster::replica_config;
use crate::support::{messages, postgres, responses, *};

/// $1 per demo model request (10 input tokens at $50,000 and 5 output at $100,000 per million).
const PRICE: &str = "{ input_per_mtok = 50000.0, output_per_mtok = 100000.0 }";

/// The demo config with priced models `p-echo` and `p-metered`, and `budget` on `client`s.
pub fn priced(text: String, budgets: &[(&str, &str)]) -> String {
    let mut text = text;
    for (client, budget) in budgets {
        let at = text.find(&format!("id = \"{client}\"\n")).expect("client");
        let models = at + text[at..].find("\nmodels = ").expect("models") + 1;
        let end = models + text[models..].find('\n').expect("line end");
        text = format!("{}\nbudget = {budget}{}", &text[..end], &text[end..]);
    }
    for (id, scenario) in [("p-echo", "echo"), ("p-metered", "metered")] {
        text.push_str(&format!(
            "\n[[models]]\nid = \"{id}\"\nbackend = \"demo\"\nbackend_model = \"{scenario}\"\nprice = {PRICE}\n"
        ));
    }
    text
}

async fn gateway(budgets: &'static [(&'static str, &'static str)]) -> Gateway {
    Gateway::start_raw(Opts::default(), |o, dir| {
        priced(config_text(o, dir), budgets)
    })
    .await
}

fn chat_request(model: &str) -> Value {
    json!({"model": model, "messages": [user("hi")]})
}

/// A fresh turn of `key` on each surface is refused with 402 `budget_exceeded`, naming `cap`.
async fn refused_everywhere(gw: &Gateway, key: &str, model: &str, cap: &str) {
    let r = gw.post(key, &chat_request(model)).send().await.unwrap();
    assert_eq!(r.status(), 402);
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=86_400).contains(&retry), "{retry}");
    let v: Value = r.json().await.unwrap();
    assert_eq!(error_code(&v), "budget_exceeded", "{v}");
    assert_eq!(v["error"]["type"], "insufficient_quota", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(cap) && message.contains("T00:00:00Z"),
        "{message}"
    );

    let r = responses::post(gw, key, &responses::request(model, "hi")).await;
    assert_eq!(r.status(), 402);
    same_reset(&r.headers()["retry-after"], retry);
    let v: Value = r.json().await.unwrap();
    assert_eq!(error_code(&v), "budget_exceeded", "{v}");

    // Claude Code's gateway protocol: 429 `billing_error`, not to be retried, with the
    // blocked-request headers.
    let r = messages::post(gw, key, &messages::request(model, "hi")).await;
    assert_eq!(r.status(), 429);
    let h = r.headers().clone();
    let v: Value = r.json().await.unwrap();
    schema::check(schema::Wire::MessageError, &v);
    assert_eq!(v["error"]["type"], "billing_error", "{v}");
    assert_eq!(messages::code(&v), "budget_exceeded");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("resets at"), "{message}");
    same_reset(&h["retry-after"], retry);
    assert_eq!(h["x-should-retry"], "false");
    let reset: u64 = h["anthropic-ratelimit-unified-reset"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(reset.is_multiple_of(86_400), "a UTC midnight");
    for (name, value) in [
        ("anthropic-ratelimit-unified-status", "rejected"),
        ("anthropic-ratelimit-unified-overage-period", "daily"),
        ("anthropic-ratelimit-unified-overage-utilization", "1"),
        (
            "anthropic-ratelimit-unified-overage-surpassed-threshold",
            "1",
        ),
        (
            "anthropic-ratelimit-unified-overage-disabled-reason",
            "org_spend_cap_reached",
        ),
    ] {
        assert_eq!(h[name], value, "{name}");
    }
    assert_eq!(
        h["anthropic-ratelimit-unified-overage-reset"],
        h["anthropic-ratelimit-unified-reset"]
    );
    assert!(h
        .get("anthropic-ratelimit-unified-representative-claim")
        .is_none());
}

/// A `Retry-After` counting down to the same reset as `retry` (asked a moment earlier: a
/// second may have passed between the two answers).
fn same_reset(header: &reqwest::header::HeaderValue, retry: u64) {
    let got: u64 = header.to_str().unwrap().parse().unwrap();
    assert!(
        got == retry || got + 1 == retry,
        "Retry-After {got}, a moment after {retry}"
    );
}

async fn ok_turn(gw: &Gateway, key: &str, model: &str) {
    let (s, v) = gw.chat(key, &chat_request(model)).await;
    assert_eq!(s, 200, "{v}");
}

#[tokio::test]
async fn daily_token_and_usd_caps_refuse_the_next_fresh_turn_on_every_surface() {
    // One demo turn is 15 tokens and, priced, $1.
    let gw = gateway(&[
        ("alice", "{ tokens_per_day = 15 }"),
        ("bob", "{ usd_per_day = 1.0, usd_per_month = 100.0 }"),
    ])
    .await;
    ok_turn(&gw, ALICE, "echo").await;
    refused_everywhere(&gw, ALICE, "echo", "tokens_per_day").await;
    // Bob's unpriced turns cost nothing; his first priced one reaches the cap.
    ok_turn(&gw, BOB, "echo").await;
    ok_turn(&gw, BOB, "p-echo").await;
    refused_everywhere(&gw, BOB, "p-echo", "usd_per_day").await;
    refused_everywhere(&gw, BOB, "echo", "usd_per_day").await;
    // Carol has no budget.
    ok_turn(&gw, CAROL, "echo").await;
    ok_turn(&gw, CAROL, "echo").await;

    let (s, v) = get(&gw, BOB, "/v1/usage").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["total"]["spend_usd"], 1.0, "{v}");
    let day = &v["budget"]["usd_per_day"];
    assert_eq!(
        (day["cap"].as_f64(), day["used"].as_f64()),
        (Some(1.0), Some(1.0)),
        "{v}"
    );
    assert_eq!(day["remaining"], 0.0);
    let month = &v["budget"]["usd_per_month"];
    assert_eq!(month["remaining"], 99.0, "{v}");
    assert!(
        month["resets_at"]
            .as_str()
            .unwrap()
            .ends_with("-01T00:00:00Z"),
        "{v}"
    );
    let (_, v) = get(&gw, ALICE, "/v1/usage").await;
    assert_eq!(v["budget"]["tokens_per_day"]["used"], 15, "{v}");
    assert_eq!(v["total"]["spend_usd"], 0.0);
    let (_, v) = get(&gw, CAROL, "/v1/usage").await;
    assert!(v.get("budget").is_none(), "{v}");
    // An approver reads one client's budget.
    let (_, v) = get(&gw, ROOT, "/v1/usage?client=bob").await;
    assert_eq!(v["budget"]["usd_per_day"]["cap"], 1.0, "{v}");

    let (_, metrics) = get_text(&gw, ROOT, "/metrics").await;
    for line in [
        "turnstile_budget_refusals_total{cap=\"tokens_per_day\"} 3",
        "turnstile_budget_refusals_total{cap=\"usd_per_day\"} 6",
        "turnstile_spend_usd_total{model=\"p-echo\"} 1",
    ] {
        assert!(metrics.contains(line), "{line}\n{metrics}");
    }
}

#[tokio::test]
async fn a_per_execution_cap_stops_a_multi_round_turn_at_its_next_round() {
    let mut gw = gateway(&[("alice", "{ usd_per_execution = 0.5 }")]).await;
    // Round 1 is exposed; the request behind it reports $1 once answered, in round 2, which
    // is still exposed; the continuation of round 2 is where the execution stops.
    let req = tool_request("p-metered", "go");
    let (s, first) = gw.chat(ALICE, &req).await;
    assert_eq!((s.as_u16(), calls(&first).len()), (200, 1), "{first}");
    let req2 = continuation(&req, &first, |_, _| json!("one"));
    let (s, second) = gw.chat(ALICE, &req2).await;
    assert_eq!((s.as_u16(), calls(&second).len()), (200, 1), "{second}");
    let third = continuation(&req2, &second, |_, _| json!("two"));
    let (s, v) = gw.chat(ALICE, &third).await;
    assert_eq!(
        (s.as_u16(), error_code(&v)),
        (402, "budget_exceeded".into()),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("usd_per_execution"),
        "{v}"
    );
    // The held backend turn was interrupted, not left running.
    gw.wait_spy("interrupt", 1).await;
    let (s, v) = gw.chat(ALICE, &third).await;
    assert_eq!(
        (s.as_u16(), error_code(&v)),
        (410, "execution_budget_exceeded".into()),
        "{v}"
    );
    let (_, metrics) = get_text(&gw, ROOT, "/metrics").await;
    for line in [
        "turnstile_executions_ended_total{reason=\"budget_exceeded\"} 1",
        "turnstile_budget_refusals_total{cap=\"usd_per_execution\"} 1",
    ] {
        assert!(metrics.contains(line), "{line}\n{metrics}");
    }
    // A fresh turn is not gated by the per-execution cap.
    ok_turn(&gw, ALICE, "p-echo").await;
    // The ending is durable: after a restart the replay still answers 410 with its code.
    gw.stop().await;
    gw.spawn().await;
    let (s, v) = gw.chat(ALICE, &third).await;
    assert_eq!(
        (s.as_u16(), error_code(&v)),
        (410, "execution_budget_exceeded".into()),
        "{v}"
    );
}

#[tokio::test]
async fn two_replicas_on_postgres_share_one_principals_daily_cap() {
    let db = postgres::database();
    let mut replicas = Vec::new();
    for id in ["a", "b"] {
        let (id, db) = (id.to_string(), db.clone());
        replicas.push(
            Gateway::start_raw(Opts::default(), move |o, dir| {
                let text = replica_config(o, dir, &id, &db, None, None);
                priced(text, &[("alice", "{ usd_per_day = 2.0 }")])
            })
            .await,
        );
    }
    let (a, b) = (&replicas[0], &replicas[1]);
    ok_turn(a, ALICE, "p-echo").await;
    ok_turn(b, ALICE, "p-echo").await;
    // Each replica spent $1; a usage read writes a replica's unwritten delta at once (else
    // its timer does within a second), and the other then sees the shared total.
    let (_, v) = get(a, ALICE, "/v1/usage").await;
    assert_eq!(v["budget"]["usd_per_day"]["used"], 1.0, "{v}");
    let (_, v) = get(b, ALICE, "/v1/usage").await;
    assert_eq!(v["budget"]["usd_per_day"]["used"], 2.0, "{v}");
    refused_everywhere(a, ALICE, "p-echo", "usd_per_day").await;
    refused_everywhere(b, ALICE, "echo", "usd_per_day").await;
    ok_turn(a, BOB, "p-echo").await;
}

#[tokio::test]
async fn check_warns_of_an_unpriced_model_under_a_usd_cap() {
    let dir = tempfile::tempdir().unwrap();
    let check = |budget: &'static [(&'static str, &'static str)]| {
        let path = dir.path().join("turnstile.toml");
        std::fs::write(
            &path,
            priced(config_text(&Opts::default(), dir.path()), budget),
        )
        .unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_turnstile"))
            .args(["check", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let stderr = check(&[("carol", "{ usd_per_month = 10.0 }")]);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("warning: clients `carol` has a USD budget but may use model `echo`, which has no price"),
        "{stderr}"
    );
    // Tokens need no price; carol may use only `echo`.
    assert_eq!(check(&[("carol", "{ tokens_per_day = 10 }")]), "");
}

#[tokio::test]
async fn an_issuers_budget_is_each_of_its_subjects_default() {
    let gw = Gateway::start_raw(Opts::default(), |o, dir| {
        let text = crate::operations::jwt::jwt_config(o, dir, "");
        let issuer = format!("issuer = \"{}\"\n", crate::operations::jwt::ISS_A);
        text.replacen(
            &issuer,
            &format!("{issuer}budget = {{ tokens_per_day = 15 }}\n"),
            1,
        )
    })
    .await;
    let (sam, kim) = (
        crate::operations::jwt::token_a("sam"),
        crate::operations::jwt::token_a("kim"),
    );
    ok_turn(&gw, &sam, "echo").await;
    refused_everywhere(&gw, &sam, "echo", "tokens_per_day").await;
    ok_turn(&gw, &kim, "echo").await;
    let (s, v) = get(&gw, &kim, "/v1/usage").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["budget"]["tokens_per_day"]["remaining"], 0, "{v}");
    assert_eq!(v["total"]["total_tokens"], 15, "{v}");
}

/// Claude Code's gateway protocol: every successful Messages answer of a capped caller says
/// where it stands against its fullest cap (`allowed`, then `allowed_warning` past 75%, the
/// threshold it passed, the reset); an uncapped caller's answers carry none of it.
#[tokio::test]
async fn a_capped_callers_messages_answers_carry_its_standing() {
    let gw = gateway(&[("alice", "{ usd_per_day = 1.25, usd_per_month = 100.0 }")]).await;
    let standing = async |key: &str| {
        let r = messages::post(&gw, key, &messages::request("echo", "hi")).await;
        assert_eq!(r.status(), 200);
        let h = r.headers().clone();
        schema::check(schema::Wire::Message, &r.json().await.unwrap());
        h
    };
    let h = standing(ALICE).await;
    assert_eq!(h["anthropic-ratelimit-unified-status"], "allowed");
    assert_eq!(h["anthropic-ratelimit-unified-overage-status"], "allowed");
    assert_eq!(
        h["anthropic-ratelimit-unified-representative-claim"],
        "overage"
    );
    assert_eq!(h["anthropic-ratelimit-unified-overage-utilization"], "0.00");
    assert!(h
        .get("anthropic-ratelimit-unified-overage-surpassed-threshold")
        .is_none());
    // $1 of $1.25 today (80%), 1% of the month: the day is the fullest cap.
    ok_turn(&gw, ALICE, "p-echo").await;
    wait_for("the spend on the ledger", async || {
        let (_, v) = get(&gw, ALICE, "/v1/usage").await;
        (v["budget"]["usd_per_day"]["used"] == 1.0).then_some(())
    })
    .await;
    let h = standing(ALICE).await;
    assert_eq!(h["anthropic-ratelimit-unified-status"], "allowed_warning");
    assert_eq!(
        h["anthropic-ratelimit-unified-overage-status"],
        "allowed_warning"
    );
    assert_eq!(h["anthropic-ratelimit-unified-overage-utilization"], "0.80");
    assert_eq!(
        h["anthropic-ratelimit-unified-overage-surpassed-threshold"],
        "0.75"
    );
    let reset: u64 = h["anthropic-ratelimit-unified-reset"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        reset.is_multiple_of(86_400) && reset > now && reset <= now + 86_400,
        "{reset}"
    );
    let h = standing(CAROL).await;
    assert!(
        h.keys()
            .all(|k| !k.as_str().starts_with("anthropic-ratelimit")),
        "{h:?}"
    );
}
