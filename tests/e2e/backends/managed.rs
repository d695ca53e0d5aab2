//! The Managed Agents API on the backend kinds with their own rigs: the real Codex
//! `app-server` and an OpenAI-compatible upstream (the agent kinds run it in their contract,
//! the bundled demo app-server in `clients::managed_agents`).

use serde_json::json;

use crate::backends::codex::{codex_bin, text_of, Rig, Setup};
use crate::clients::managed_agents::managed_round_trip;
use crate::support::fake_responses::{self as fake, FakeResponses, Reply};
use crate::support::fake_upstream::gateway_on_fake;
use crate::support::{Opts, ALICE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_agents_session_on_the_codex_binary() {
    let Some(bin) = codex_bin() else { return };
    let model = FakeResponses::start(|_, body| match fake::output_for(body, "call_ma_1") {
        None => Reply::call("call_ma_1", "read_file", json!({"path": "a.txt"})),
        Some(out) => Reply::text(&format!("results: {}", text_of(&out)), 2),
    })
    .await;
    let rig = Rig::start(&bin, &model, Setup::default()).await;
    let said = "results: contents of a";
    managed_round_trip(
        &rig.gw,
        "codex",
        "read a.txt",
        json!({"path": "a.txt"}),
        "contents of a",
        said,
    )
    .await;
    // Codex under `approval_policy = "never"` asks before nothing: a toolset that asks
    // (or disables a tool) cannot be enforced there, and is refused.
    let toolset = json!({"type": "agent_toolset_20260401",
        "configs": [{"name": "bash", "permission_policy": {"type": "always_ask"}}]});
    let r = (rig.gw.http.post(format!("{}/v1/agents", rig.gw.url)))
        .bearer_auth(ALICE)
        .header("anthropic-beta", "managed-agents-2026-04-01")
        .json(&json!({"name": "asker", "model": "codex", "tools": [toolset]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"].as_str().unwrap().contains("`tools`"),
        "{v}"
    );
    let seen = model.requests();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(
        fake::output_for(&seen[1], "call_ma_1").map(|o| text_of(&o)),
        Some("contents of a".into())
    );
}

#[tokio::test]
async fn managed_agents_session_on_an_openai_upstream() {
    let (gw, fake) = gateway_on_fake(Opts::default(), &[("u-tool", "up-tool")]).await;
    managed_round_trip(
        &gw,
        "u-tool",
        "read it",
        json!({"path": "/x"}),
        "UP-RESULT",
        "=UP-RESULT",
    )
    .await;
    let bodies = fake.bodies();
    assert_eq!(bodies.len(), 2, "{bodies:?}");
    // The system prompt and the client's tool reached the upstream.
    assert_eq!(bodies[0]["messages"][0]["role"], "system", "{}", bodies[0]);
    assert_eq!(
        bodies[0]["tools"][0]["function"]["name"], "read_file",
        "{}",
        bodies[0]
    );
}
