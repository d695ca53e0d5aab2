//! Policy by group against a real OpenID provider (`tests/clients/oidc_idp.mjs`: alice is in
//! `developers`, bob in `developers` and `approvers`): a group grants its members models and
//! the approver role, a group budget is pooled over its members, a change of membership at
//! the provider applies at the next token, and an approver whose group is removed from the
//! config loses its open event stream within one keep-alive.

use serde_json::{json, Value};

use super::approvals::{open_events, to_end};
use super::oidc::{whoami, Idp};
use crate::support::*;

/// Developers may use `echo` and `cmd-ask` and share `budget`; approvers approve. The
/// provider's own entry grants nothing.
fn groups(budget: &str, approvers: bool) -> String {
    let mut s = format!(
        "\n[[groups]]\nname = \"developers\"\nmodels = [\"echo\", \"cmd-ask\"]\n{budget}\n"
    );
    if approvers {
        s.push_str("\n[[groups]]\nname = \"approvers\"\nroles = [\"approver\"]\n");
    }
    s
}

async fn gateway(idp: &Idp, groups: String) -> Gateway {
    let section = idp.section("");
    Gateway::start_raw(Opts::default(), move |o, d| {
        config_text(o, d) + &section + &groups
    })
    .await
}

fn echo() -> Value {
    json!({"model": "echo", "messages": [user("hi")]})
}

#[tokio::test]
async fn groups_grant_models_and_the_approver_role_and_pool_a_budget() {
    let Some(idp) = Idp::start() else {
        return;
    };
    // One demo turn is 15 tokens: the developers' pool holds one turn a day.
    let gw = gateway(&idp, groups("budget = { tokens_per_day = 15 }", true)).await;
    let (alice, bob) = (idp.token("alice").await, idp.token("bob").await);

    let (s, me) = whoami(&gw, &alice).await;
    assert_eq!(s, 200, "{me}\n{}", gw.log());
    assert_eq!(me["groups"], json!(["developers"]), "{me}");
    assert_eq!(me["approver"], false);
    assert_eq!(me["models"], json!(["echo", "cmd-ask"]), "{me}");
    let (_, me) = whoami(&gw, &bob).await;
    assert_eq!(me["groups"], json!(["developers", "approvers"]), "{me}");
    assert_eq!(me["approver"], true, "{me}");

    // A model no group grants is unknown to them.
    let (s, v) = gw
        .chat(&alice, &json!({"model": "tool", "messages": [user("x")]}))
        .await;
    assert_eq!(
        (s.as_u16(), error_code(&v)),
        (404, "model_not_found".into())
    );

    // Alice's turn uses up the pool; bob, with no cap of his own, is refused by it.
    let (s, v) = gw.chat(&alice, &echo()).await;
    assert_eq!(s, 200, "{v}");
    for key in [&bob, &alice] {
        let (s, v) = gw.chat(key, &echo()).await;
        assert_eq!(
            (s.as_u16(), error_code(&v)),
            (402, "budget_exceeded".into())
        );
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("group `developers`'s tokens_per_day cap"),
            "{message}"
        );
    }
    // The pool is listed only when asked for, by an approver, with its cap.
    let usage = |key: &str, q: &str| {
        let r = gw
            .http
            .get(format!("{}/v1/usage{q}", gw.url))
            .bearer_auth(key)
            .send();
        async move { r.await.unwrap().json::<Value>().await.unwrap() }
    };
    let all = usage(&bob, "").await;
    let rows = all["data"].as_array().unwrap();
    assert!(
        rows.iter()
            .all(|r| !r["client"].as_str().unwrap_or("").starts_with("group:")),
        "{all}"
    );
    let pool = usage(&bob, "?client=group:developers").await;
    assert_eq!(pool["budget"]["tokens_per_day"]["used"], 15, "{pool}");
    assert_eq!(pool["total"]["requests"], 1, "{pool}");
    let foreign = usage(&alice, "?client=group:developers").await;
    assert_eq!(foreign["data"], json!([]), "{foreign}");
}

#[tokio::test]
async fn a_membership_change_at_the_provider_applies_at_the_next_token() {
    let Some(idp) = Idp::start() else {
        return;
    };
    let gw = gateway(&idp, groups("", true)).await;
    let before = idp.token("bob").await;
    idp.call(reqwest::Method::POST, "/groups?user=bob&group=developers")
        .await;
    let after = idp.token("bob").await;
    let (_, me) = whoami(&gw, &after).await;
    assert_eq!(
        (me["approver"].clone(), me["groups"].clone()),
        (json!(false), json!(["developers"]))
    );
    // The earlier token still says what it said (until it expires).
    assert_eq!(whoami(&gw, &before).await.1["approver"], true);
    idp.call(reqwest::Method::POST, "/groups?user=bob").await;
    let none = idp.token("bob").await;
    let (s, me) = whoami(&gw, &none).await;
    assert_eq!((s, me["models"].clone()), (200, json!([])), "{me}");
    let (s, v) = gw.chat(&none, &echo()).await;
    assert_eq!(
        (s.as_u16(), error_code(&v)),
        (404, "model_not_found".into())
    );
}

#[tokio::test]
async fn an_approver_whose_group_is_removed_loses_its_event_stream() {
    let Some(idp) = Idp::start() else {
        return;
    };
    let gw = gateway(&idp, groups("", true)).await;
    let (alice, bob) = (idp.token("alice").await, idp.token("bob").await);
    let events = open_events(&gw, &bob).await;

    // The approvers group leaves the config.
    let text = config_text(&gw.opts, gw.dir.path()) + &idp.section("") + &groups("", false);
    std::fs::write(gw.config_path(), text).unwrap();
    gw.signal("HUP");
    wait_until("config reloaded", || gw.log().contains("config reloaded")).await;

    // Alice's turn asks for an approval; bob's stream ends without carrying it.
    let req = gw.post(
        &alice,
        &json!({"model": "cmd-ask", "stream": true, "messages": [user("go")]}),
    );
    let chat = tokio::spawn(async move { req.send().await.map(|r| r.status().as_u16()) });
    wait_until("alice's approval", || gw.log().contains("approval pending")).await;
    let seen = to_end(events).await;
    assert!(!seen.contains("event: created"), "{seen}");
    assert_eq!(whoami(&gw, &bob).await.1["approver"], false);
    chat.abort();
}
