//! Claude Code as a held-turn backend (`kind = "claude-code"`): the real `claude` CLI
//! (`.cache/harnesses/claude`, installed by `.ci/run`) against a scripted Messages API
//! (`support/fake_messages.rs`), driven through the gateway's three surfaces.

use std::process::Command;

use serde_json::{json, Value};

use crate::clients::coding_harnesses::{claude_in, Scene, CLAUDE};
use crate::support::agents::{self, agent_processes, no_agent_left};
use crate::support::fake_messages::FakeMessages;
use crate::support::*;

/// Models of the claude backends: (id, backend, scenario, approvals).
const MODELS: &[(&str, &str, &str, &str)] = &[
    ("cc-one", "claude", "one", "{}"),
    ("cc-parallel", "claude", "parallel", "{}"),
    ("cc-rounds", "claude", "rounds3", "{}"),
    ("cc-text", "claude", "text", "{}"),
    ("cc-think", "claude", "think", "{}"),
    ("cc-harness", "claude", "readfile", "{}"),
    ("cc-shell", "claude", "shell", "{}"),
    (
        "cc-bash-deny",
        "claude-work",
        "bash",
        r#"{ command = "deny" }"#,
    ),
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
                 max_sessions = {}\n{extra}",
                bin.display(),
                o.max_sessions.min(4)
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
async fn effort_reaches_claude_code() {
    let fake = FakeMessages::start().await;
    let Some(gw) = gateway(&fake, Opts::default()).await else {
        return;
    };
    for (asked, sent) in [("minimal", "low"), ("medium", "medium"), ("xhigh", "xhigh")] {
        let req = json!({"model": "cc-text", "messages": [user(asked)], "reasoning_effort": asked});
        let (s, v) = gw.chat(ALICE, &req).await;
        assert_eq!(s, 200, "{v}");
        let body = fake.bodies("text").pop().unwrap();
        assert_eq!(body["output_config"]["effort"], sent, "{asked}");
    }
    let req = json!({"model": "cc-text", "messages": [user("x")], "reasoning_effort": "extreme"});
    let (s, v) = gw.chat(ALICE, &req).await;
    assert_eq!(s, 400, "{v}");
}

/// The user and assistant messages of a model request (Claude Code adds system ones).
fn conversation(body: &Value) -> Vec<Value> {
    let all = body["messages"].as_array().unwrap().iter();
    all.filter(|m| m["role"] != "system").cloned().collect()
}

/// The sessions' scratch folders (`HOME`, and the working folder when none is set) left.
fn scratch_folders(gw: &Gateway) -> Vec<String> {
    agents::scratch_folders(gw, "claude")
}

#[tokio::test]
async fn three_sequential_rounds_and_usage_with_cache_tokens() {
    let fake = FakeMessages::start().await;
    let Some(gw) = gateway(&fake, Opts::default()).await else {
        return;
    };
    let mut req = tool_request("cc-rounds", "read three files");
    let mut tokens = Vec::new();
    for round in 0..3 {
        let (s, resp) = gw.chat(ALICE, &req).await;
        assert_eq!(s, 200, "round {round}: {resp}\n{}", gw.log());
        let c = calls(&resp);
        assert_eq!(c.len(), 1, "round {round}: {resp}");
        tokens.push(c[0]["id"].clone());
        req = continuation(&req, &resp, |_, _| json!(format!("r{round}")));
    }
    let (s, done) = gw.chat(ALICE, &req).await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(content(&done), "results: r0 | r1 | r2");
    tokens.dedup();
    assert_eq!(tokens.len(), 3, "a token per round");
    // Four model calls, each reported as it ended: input 100 + cache reads 50 + cache
    // writes 7, output 20.
    let total = usage_total(&gw, ALICE, |t| t["requests"].as_u64() >= Some(4)).await;
    assert_eq!(total["requests"], 4, "{total}");
    assert_eq!(total["input_tokens"], 4 * 157, "{total}");
    assert_eq!(total["cached_input_tokens"], 4 * 50, "{total}");
    assert_eq!(total["cache_write_input_tokens"], 4 * 7, "{total}");
    assert_eq!(total["output_tokens"], 4 * 20, "{total}");
    // The session is kept between rounds: the model saw the rounds as its own history.
    let last = fake.bodies("rounds3").pop().unwrap();
    assert_eq!(conversation(&last).len(), 7, "{last}");
}

#[tokio::test]
async fn thinking_streams_as_reasoning() {
    let fake = FakeMessages::start().await;
    let Some(gw) = gateway(&fake, Opts::default()).await else {
        return;
    };
    let (s, _, body) = gw
        .chat_stream(
            ALICE,
            &json!({"model": "cc-think", "messages": [user("why")]}),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    let (events, _) = sse_events(&body);
    let delta = |k: &str| -> String {
        let parts = events
            .iter()
            .filter_map(|e| e["choices"][0]["delta"][k].as_str());
        parts.collect()
    };
    assert_eq!(
        delta("reasoning_content"),
        "pondering the question",
        "{body}"
    );
    assert_eq!(delta("content"), "You said: why", "{body}");
}

/// A built-in under `deny` (here `Bash`) is never offered to the model, never run, and
/// nobody is asked (`ask`, approved and denied, is the agent-kind contract's).
#[tokio::test]
async fn a_denied_builtin_is_never_offered() {
    let fake = FakeMessages::start().await;
    let Some(gw) = gateway(&fake, Opts::default()).await else {
        return;
    };
    let marker = gw.dir.path().join("work/bash-ran.txt");
    let req = json!({"model": "cc-bash-deny", "messages": [user("run it")]});
    let (s, resp) = gw.chat(ALICE, &req).await;
    assert_eq!(s, 200, "{resp}");
    assert!(!marker.exists());
    let tools = fake.bodies("bash").pop().unwrap()["tools"].to_string();
    assert!(!tools.contains("\"Bash\""), "{tools}");
    let (_, v) = get(&gw, ROOT, "/v1/approvals").await;
    assert_eq!(v["data"].as_array().unwrap().len(), 0, "{v}");
}

#[tokio::test]
async fn a_revoked_grant_ends_the_held_session() {
    let fake = FakeMessages::start().await;
    let Some(gw) = gateway(&fake, Opts::default()).await else {
        return;
    };
    let req = tool_request("cc-one", "read a.txt");
    let (s, resp) = gw.chat(ALICE, &req).await;
    assert_eq!(s, 200, "{resp}");
    assert!(!agent_processes(&gw).is_empty());
    // Narrow alice to `echo` only: the held turn is revoked on resume.
    let text = std::fs::read_to_string(gw.config_path()).unwrap();
    let narrowed = text.replacen("models = [\"*\"]", "models = [\"echo\"]", 1);
    assert_ne!(text, narrowed);
    std::fs::write(gw.config_path(), narrowed).unwrap();
    gw.signal("HUP");
    wait_until("reload logged", || gw.log().contains("config reloaded")).await;
    let next = continuation(&req, &resp, |_, _| json!("a"));
    let (s, v) = gw.chat(ALICE, &next).await;
    assert_eq!(
        (s.as_u16(), error_code(&v)),
        (403, "unauthorized_target".into()),
        "{v}"
    );
    no_agent_left(&gw, "claude").await;
    // The model never got the result.
    assert_eq!(fake.bodies("one").len(), 1);
}

#[tokio::test]
async fn claude_code_as_the_client_reads_a_file_through_a_held_turn() {
    let fake = FakeMessages::start().await;
    let Some(gw) = gateway(&fake, Opts::default()).await else {
        return;
    };
    let Some(bin) = CLAUDE.locate() else {
        return;
    };
    let scene = Scene::new(&gw);
    let prompt = scene.prompt.clone();
    let args = [
        "-p",
        &prompt,
        "--model",
        "cc-harness",
        "--allowedTools",
        "Read",
    ];
    let (stdout, why) = claude_in(&bin, &gw, &scene, &args, None).await;
    assert!(stdout.contains(&scene.secret), "{why}");
    assert!(stdout.contains("Tool result:"), "{why}");
}

#[tokio::test]
async fn sessions_are_bounded_and_an_idle_one_makes_room() {
    let fake = FakeMessages::start().await;
    let opts = Opts {
        max_sessions: 1,
        ..Opts::default()
    };
    let Some(gw) = gateway(&fake, opts).await else {
        return;
    };
    let (s, resp) = gw
        .chat(
            ALICE,
            &json!({"model": "cc-text", "messages": [user("first")]}),
        )
        .await;
    assert_eq!(s, 200, "{resp}");
    let kept = agent_processes(&gw);
    let folders = scratch_folders(&gw);
    assert_eq!(folders.len(), 1);
    let mode = std::fs::metadata(std::env::temp_dir().join(&folders[0])).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o700
    );
    // Another conversation: the idle session makes room.
    let (s, resp) = gw
        .chat(
            ALICE,
            &json!({"model": "cc-text", "messages": [user("second")]}),
        )
        .await;
    assert_eq!(s, 200, "{resp}");
    assert_eq!(content(&resp), "You said: second");
    wait_until("the idle session ended", || {
        !agent_processes(&gw).iter().any(|p| kept.contains(p))
    })
    .await;
    // A held turn keeps its place: the next turn waits, then is refused.
    let req = tool_request("cc-one", "read a.txt");
    let (s, held) = gw.chat(ALICE, &req).await;
    assert_eq!(s, 200, "{held}");
    let (s, v) = gw.chat(BOB, &tool_request("cc-one", "read b.txt")).await;
    assert_eq!(
        (s.as_u16(), error_code(&v)),
        (429, "capacity_exhausted".into()),
        "{v}"
    );
    let (s, done) = gw
        .chat(ALICE, &continuation(&req, &held, |_, _| json!("a")))
        .await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(scratch_folders(&gw).len(), 1, "one session, one folder");
}

#[tokio::test]
async fn shutdown_leaves_no_claude_behind() {
    let fake = FakeMessages::start().await;
    let Some(mut gw) = gateway(&fake, Opts::default()).await else {
        return;
    };
    let (s, resp) = gw.chat(ALICE, &tool_request("cc-one", "read a.txt")).await;
    assert_eq!(s, 200, "{resp}");
    let pids = agent_processes(&gw);
    let folders = scratch_folders(&gw);
    assert!(!pids.is_empty() && !folders.is_empty());
    assert_eq!(gw.stop().await, Some(0));
    for pid in pids {
        assert!(!pid_alive(pid.into()), "claude {pid} outlived the gateway");
    }
    for f in folders {
        assert!(
            !std::env::temp_dir().join(&f).exists(),
            "{f} outlived the gateway"
        );
    }
}

#[tokio::test]
async fn check_reports_the_cli_version() {
    let fake = FakeMessages::start().await;
    let Some(gw) = gateway(&fake, Opts::default()).await else {
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args(["check", "--config"])
        .arg(gw.config_path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("3 backends"), "{stdout}");
    assert!(
        stdout.contains("backend claude (claude-code): 2.1.332"),
        "{stdout}"
    );
    // A command that does not run is reported, and the check fails.
    let text = std::fs::read_to_string(gw.config_path()).unwrap();
    let broken = gw.dir.path().join("broken.toml");
    let bin = CLAUDE.locate().unwrap().display().to_string();
    std::fs::write(&broken, text.replacen(&bin, "/nonexistent/claude", 1)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_turnstile"))
        .args(["check", "--config"])
        .arg(&broken)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "backend claude (claude-code): backend unavailable: cannot start /nonexistent/claude"
        ),
        "{stderr}"
    );
}

/// The per-turn cost of a Claude Code backend against Codex's, measured in the same run
/// against instant fakes of their model APIs (figures printed, not asserted: the machines are
/// shared): a plain turn, a follow-up on the session it kept, and a held round trip (the
/// call, then the answered continuation).
/// `cargo test --test e2e -- claude_backend::per_turn --nocapture`.
#[tokio::test]
async fn per_turn_cost_against_codex_in_the_same_run() {
    use crate::backends::codex::{codex_bin, Rig, Setup};
    use crate::support::fake_responses::{output_for, FakeResponses, Reply};
    const N: usize = 6;
    let Some(codex) = codex_bin() else { return };
    let fake = FakeMessages::start().await;
    let Some(cc) = gateway(&fake, Opts::default()).await else {
        return;
    };
    let model = FakeResponses::start(|_, body| {
        let plain = body.to_string().contains("plain turn");
        match (plain, output_for(body, "call_1")) {
            (true, _) => Reply::text("ok", 1),
            (false, None) => Reply::call("call_1", "read_file", json!({"path": "a.txt"})),
            (false, Some(_)) => Reply::text("done", 1),
        }
    })
    .await;
    let rig = Rig::start(&codex, &model, Setup::default()).await;
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut lines = Vec::new();
    for (name, gw, plain_model, tool_model) in [
        ("claude-code", &cc, "cc-text", "cc-one"),
        ("app-server (Codex)", &rig.gw, "codex", "codex"),
    ] {
        let (mut plain, mut trip, mut follow) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..N {
            let first = user(&format!("plain turn {i}"));
            let req = json!({"model": plain_model, "messages": [first]});
            let t = std::time::Instant::now();
            let (s, v) = gw.chat(ALICE, &req).await;
            plain.push(t.elapsed().as_secs_f64() * 1e3);
            assert_eq!(s, 200, "{name}: {v}");
            let answer = json!({"role": "assistant", "content": content(&v)});
            let req = json!({"model": plain_model,
                             "messages": [first, answer, user("plain turn, once more")]});
            let t = std::time::Instant::now();
            let (s, v) = gw.chat(ALICE, &req).await;
            follow.push(t.elapsed().as_secs_f64() * 1e3);
            assert_eq!(s, 200, "{name}: {v}");
            let req = tool_request(tool_model, &format!("read a.txt, try {i}"));
            let t = std::time::Instant::now();
            let (s, resp) = gw.chat(ALICE, &req).await;
            assert_eq!(s, 200, "{name}: {resp}");
            let (s, v) = gw
                .chat(ALICE, &continuation(&req, &resp, |_, _| json!("a")))
                .await;
            trip.push(t.elapsed().as_secs_f64() * 1e3);
            assert_eq!(s, 200, "{name}: {v}");
        }
        lines.push(format!(
            "{name:>20}: plain turn p50 {:6.1} ms, follow-up on the kept session {:6.1} ms, \
             held round trip {:6.1} ms (n={N})",
            median(plain),
            median(follow),
            median(trip)
        ));
    }
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "\nper-turn cost, same run:\n{}",
        lines.join("\n")
    );
}

#[tokio::test]
async fn codex_cli_runs_its_own_tool_through_a_held_turn_over_the_websocket() {
    use crate::clients::codex_cli::{builtin_home, client_home, exec, VERSION};
    let Some(codex) = crate::backends::codex::codex_bin() else {
        return;
    };
    let fake = FakeMessages::start().await;
    let Some(gw) = gateway(&fake, Opts::default()).await else {
        return;
    };
    let home = client_home();
    let saw = |secret: &str| {
        let bodies = fake.bodies("shell");
        bodies.iter().any(|b| results_hold(b, secret))
    };
    crate::clients::coding_harnesses::reads_secret(
        &gw,
        "codex-cli",
        VERSION,
        &codex,
        saw,
        |s, cmd| {
            builtin_home(home.path(), &s.base_url, "");
            exec("cc-shell", home.path(), cmd, &[&s.prompt]);
        },
    )
    .await;
    assert!(gw.log().contains("socket opened"), "{}", gw.log());
}

/// A tool result of the model request holds `needle`.
fn results_hold(body: &Value, needle: &str) -> bool {
    body["messages"].as_array().into_iter().flatten().any(|m| {
        m["content"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|b| b["type"] == "tool_result" && b["content"].to_string().contains(needle))
    })
}
