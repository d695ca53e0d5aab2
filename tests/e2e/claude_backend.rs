//! Claude Code as a held-turn backend (`kind = "claude-code"`): the real `claude` CLI
//! (`.cache/harnesses/claude`, installed by `.ci/run`) against a scripted Messages API
//! (`support/fake_messages.rs`), driven through the gateway's three surfaces.

use serde_json::{json, Value};

use crate::coding_harnesses::CLAUDE;
use crate::support::fake_messages::FakeMessages;
use crate::support::*;

/// Models of the claude backends: (id, backend, scenario, approvals).
const MODELS: &[(&str, &str, &str, &str)] = &[
    ("cc-one", "claude", "one", "{}"),
    ("cc-parallel", "claude", "parallel", "{}"),
    ("cc-rounds", "claude", "rounds3", "{}"),
    ("cc-text", "claude", "text", "{}"),
    ("cc-think", "claude", "think", "{}"),
    ("cc-bash-ask", "claude-work", "bash", r#"{ command = "ask" }"#),
    ("cc-bash-deny", "claude-work", "bash", r#"{ command = "deny" }"#),
];

/// A gateway with two Claude Code backends on `fake` (`claude-work` has `Bash` and a fixed
/// working folder, `work/` in the gateway's folder); None when the CLI is not installed.
pub(crate) async fn gateway(fake: &FakeMessages, opts: Opts) -> Option<Gateway> {
    let bin = CLAUDE.locate()?;
    let url = fake.url.clone();
    let gw = Gateway::start_raw(opts, move |o, dir| {
        let mut s = config_text(o, dir);
        let work = dir.join("work");
        std::fs::create_dir_all(&work).unwrap();
        for (name, extra) in [
            ("claude", String::new()),
            (
                "claude-work",
                format!("builtin_tools = [\"Bash\"]\ncwd = \"{}\"\n", work.display()),
            ),
        ] {
            s.push_str(&format!(
                "\n[backends.{name}]\nkind = \"claude-code\"\ncommand = [\"{}\"]\n\
                 env = {{ ANTHROPIC_BASE_URL = \"{url}\", ANTHROPIC_API_KEY = \"sk-fake-upstream\" }}\n\
                 max_sessions = 4\n{extra}",
                bin.display()
            ));
        }
        for (id, backend, scenario, approvals) in MODELS {
            s.push_str(&format!(
                "\n[[models]]\nid = \"{id}\"\nbackend = \"{backend}\"\nbackend_model = \"{scenario}\"\napprovals = {approvals}\n"
            ));
        }
        s
    })
    .await;
    Some(gw)
}

#[tokio::test]
async fn a_held_round_trip_on_chat_completions() {
    let fake = FakeMessages::start().await;
    let Some(gw) = gateway(&fake, Opts::default()).await else {
        return;
    };
    let req = tool_request("cc-one", "read a.txt");
    let (status, resp) = gw.chat(ALICE, &req).await;
    assert_eq!(status, 200, "{resp}\n{}", gw.log());
    let calls = calls(&resp);
    assert_eq!(calls.len(), 1, "{resp}");
    assert!(calls[0]["id"].as_str().unwrap().starts_with("srct-"));
    assert_eq!(calls[0]["function"]["name"], "read_file");
    let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"path": "a.txt"}));
    let next = continuation(&req, &resp, |_, _| json!("contents of a"));
    let (status, resp) = gw.chat(ALICE, &next).await;
    assert_eq!(status, 200, "{resp}\n{}", gw.log());
    assert_eq!(content(&resp), "results: contents of a");
}
