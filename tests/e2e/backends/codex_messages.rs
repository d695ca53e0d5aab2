//! The Anthropic Messages surface in front of the real Codex `app-server` (offline, behind the
//! scripted fake Responses API; see `codex.rs`): a Claude-Code-shaped request, a `tool_use`
//! held on the real binary, a failed (`is_error`) result with text beside it, and what the
//! model then sees: the result after its own call, and the text steered in after it.

use serde_json::json;

use crate::backends::codex::{bounded, codex_bin, Rig, Setup};
use crate::support::fake_responses::{self as fake, FakeResponses, Reply};
use crate::support::messages::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_round_trip_on_codex_with_text_beside_the_result() {
    let Some(bin) = codex_bin() else { return };
    let model = FakeResponses::start(|_, body| match fake::output_for(body, "call_m_1") {
        None => Reply::call("call_m_1", "Read", json!({"file_path": "/work/notes.txt"})),
        Some(out) => Reply::text(
            &format!("Seen: {}", crate::backends::codex::text_of(&out)),
            2,
        ),
    })
    .await;
    let rig = Rig::start(&bin, &model, Setup::default()).await;
    let mut req = request("codex", "read /work/notes.txt");
    req["tools"] = json!([claude_read_tool()]);
    let (s, _, resp) = bounded("first leg", stream(&rig.gw, crate::support::ALICE, &req)).await;
    assert_eq!(s, 200, "{resp}\n{}", rig.log_tail());
    let calls = tool_uses(&resp);
    assert_eq!(calls.len(), 1, "{resp}");
    assert!(is_token(&calls[0]["id"]), "{resp}");
    assert_eq!(calls[0]["input"], json!({"file_path": "/work/notes.txt"}));

    let next = answer(
        &req,
        &resp,
        |_, _| json!({"content": "no such file", "is_error": true}),
        &["<system-reminder>the user is waiting</system-reminder>"],
    );
    let (s, _, done) = bounded("resumed leg", stream(&rig.gw, crate::support::ALICE, &next)).await;
    assert_eq!(s, 200, "{done}\n{}", rig.log_tail());
    assert_eq!(text(&done), "Seen: no such file");
    assert_eq!(done["stop_reason"], "end_turn");

    let seen = model.requests();
    assert_eq!(seen.len(), 2, "{seen:?}");
    // The effort and the client's tool reached the model; the result came back verbatim
    // after the model's own call, and the text beside it as user input after that.
    assert_eq!(seen[0]["reasoning"]["effort"], "high", "{}", seen[0]);
    assert!(fake::tool(&seen[0], "Read").is_some(), "{}", seen[0]);
    assert_eq!(
        fake::output_for(&seen[1], "call_m_1"),
        Some(json!("no such file"))
    );
    let items = seen[1]["input"].as_array().unwrap();
    let output_at = items
        .iter()
        .position(|i| i["type"] == "function_call_output")
        .unwrap();
    let steered_at = items
        .iter()
        .position(|i| i["role"] == "user" && i.to_string().contains("the user is waiting"))
        .unwrap_or_else(|| {
            panic!(
                "the text beside the result never reached the model: {}",
                seen[1]
            )
        });
    assert!(steered_at > output_at, "{}", seen[1]);
}
