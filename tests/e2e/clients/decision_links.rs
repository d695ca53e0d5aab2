//! Slack-ready approvals in real headless Chromium: a fake Slack endpoint (the verifying
//! receiver of the notification tests) captures the Block Kit messages of two pending
//! approvals; `tests/clients/decision_links.mjs` follows the Approve link of one and the Deny
//! link of the other (the confirmation page, then the decision, made once) and works the
//! console's Notifications view. Screenshots go to `target/console-screenshots/`.

use std::time::Duration;

use serde_json::{json, Value};

use super::console::{chromium, screenshots};
use crate::operations::webhooks::{endpoint, opts, Receiver};
use crate::support::node;
use crate::support::*;

const SCRIPT_LIMIT: Duration = Duration::from_secs(300);

/// The approval id and the Approve and Deny links of a captured `approval.pending` message.
fn links(msg: &Value) -> (String, String, String) {
    let body = &msg["body"];
    let id = body["metadata"]["event_payload"]["id"]
        .as_str()
        .expect("id");
    let actions = body["blocks"]
        .as_array()
        .and_then(|b| b.iter().find(|b| b["type"] == "actions"))
        .expect("actions block");
    let url = |i: usize| actions["elements"][i]["url"].as_str().expect("url");
    (id.to_string(), url(0).to_string(), url(1).to_string())
}

#[tokio::test]
async fn block_kit_links_decide_once_in_headless_chromium() {
    let Some(node) = node::node_with("playwright-core", "decision link browser test") else {
        return;
    };
    let Some(chromium) = chromium() else {
        return;
    };
    let Some(slack) = Receiver::start("") else {
        return;
    };
    let section = endpoint(
        "slack",
        &slack,
        "events = [\"approval.pending\", \"approval.decided\"]\nformat = \"slack\"",
    );
    let gw = Gateway::start_raw(opts(), move |o, d| config_text(o, d) + &section).await;
    let mut chats = Vec::new();
    let mut pending = Vec::new();
    for n in 1..=2 {
        let req = gw.post(
            ALICE,
            &json!({"model": "cmd-ask", "stream": true, "messages": [user("go")]}),
        );
        chats.push(tokio::spawn(async move {
            req.send().await.expect("chat").text().await
        }));
        let msgs = wait_for("the Block Kit message", async || {
            let msgs: Vec<Value> = slack
                .seen()
                .into_iter()
                .filter(|d| d["body"]["metadata"]["event_type"] == "approval_pending")
                .collect();
            (msgs.len() >= n).then_some(msgs)
        })
        .await;
        pending.push(links(&msgs[n - 1]));
    }
    let ((approve_id, approve, _), (deny_id, _, deny)) = (&pending[0], &pending[1]);
    let shots = screenshots();
    let env = [
        ("TURNSTILE_URL", gw.url.clone()),
        ("TURNSTILE_APPROVER_KEY", ROOT.to_string()),
        ("TURNSTILE_APPROVE_URL", approve.clone()),
        ("TURNSTILE_APPROVE_ID", approve_id.clone()),
        ("TURNSTILE_DENY_URL", deny.clone()),
        ("TURNSTILE_DENY_ID", deny_id.clone()),
        ("TURNSTILE_CHROMIUM", chromium.display().to_string()),
        ("TURNSTILE_SCREENSHOTS", shots.display().to_string()),
    ];
    let out = node::run(node, "decision_links.mjs", &env, SCRIPT_LIMIT).await;
    let stdout = node::succeeded(&out, "decision_links.mjs", &gw.log());
    eprintln!("{stdout}");
    assert!(stdout.contains(" 0 failed"), "{stdout}");
    for name in [
        "link-confirm",
        "link-approved",
        "link-denied",
        "notifications",
    ] {
        let png = shots.join(format!("{name}.png"));
        assert!(png.exists(), "no screenshot {}", png.display());
    }
    // Both waiting turns went on; each message was followed by its decision's.
    for chat in chats {
        chat.await.expect("join").expect("chat body");
    }
    let decided = wait_for("both decisions' messages", async || {
        let msgs: Vec<Value> = slack
            .seen()
            .into_iter()
            .filter(|d| d["body"]["metadata"]["event_type"] == "approval_decided")
            .collect();
        (msgs.len() >= 2).then_some(msgs)
    })
    .await;
    for (id, state) in [(approve_id, "approved"), (deny_id, "denied")] {
        let msg = decided
            .iter()
            .find(|d| d["body"]["metadata"]["event_payload"]["id"] == id.as_str())
            .unwrap_or_else(|| panic!("no decided message for {id}: {decided:?}"));
        let text = msg["body"]["text"].as_str().unwrap_or("");
        assert!(
            text.contains(state) && text.contains("webhook:slack"),
            "{text}"
        );
    }
    let (_, left) = get(&gw, ROOT, "/v1/approvals?state=pending").await;
    assert_eq!(left["data"], json!([]), "{left}");
}
