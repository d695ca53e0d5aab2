//! The official `openai` and `@google/genai` npm packages (pinned in `tests/clients/package.json`)
//! against the real binary: `tests/clients/openai_sdk.mjs` mirrors the Python script and adds
//! the 429 class; `tests/clients/gemini_sdk.mjs` mirrors `gemini_sdk.py`.
//! `.ci/run` installs it with `npm ci` into `tests/clients/node_modules`; when that is missing
//! the test says so loudly and returns, except under `CI`, where it fails.

use std::time::Duration;

use crate::support::node;
use crate::support::*;

/// Bound on the whole script (it takes about a second).
const SCRIPT_LIMIT: Duration = Duration::from_secs(120);

#[tokio::test]
async fn openai_node_sdk_plain_stream_tools_and_errors() {
    let Some(node) = node::node_with("openai", "openai npm SDK test") else {
        return;
    };
    // One pending call per client, so the script can provoke 429 `capacity_exhausted`.
    let gw = Gateway::start_with(Opts {
        max_pending_per_client: 1,
        ..Opts::default()
    })
    .await;
    let env = [
        ("TURNSTILE_URL", format!("{}/v1", gw.url)),
        ("TURNSTILE_KEY", ALICE.to_string()),
        ("TURNSTILE_OTHER_KEY", BOB.to_string()),
    ];
    let out = node::run(node, "openai_sdk.mjs", &env, SCRIPT_LIMIT).await;
    let stdout = node::succeeded(&out, "openai_sdk.mjs", &gw.log());
    assert!(stdout.contains("ALL OK"), "{stdout}");
}

#[tokio::test]
async fn google_genai_node_sdk_manual_function_loop_and_errors() {
    let Some(node) = node::node_with("@google/genai", "@google/genai npm SDK test") else {
        return;
    };
    let gw = Gateway::start().await;
    let env = [
        ("TURNSTILE_URL", gw.url.clone()),
        ("TURNSTILE_KEY", ALICE.to_string()),
        ("TURNSTILE_OTHER_KEY", BOB.to_string()),
    ];
    let out = node::run(node, "gemini_sdk.mjs", &env, SCRIPT_LIMIT).await;
    let stdout = node::succeeded(&out, "gemini_sdk.mjs", &gw.log());
    assert!(stdout.contains("ALL OK"), "{stdout}");
}
