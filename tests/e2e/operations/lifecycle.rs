//! Endings and process lifecycle: crashes, pool bounds, restart, reload and shutdown (a held
//! turn's expiry, its backend's death and a disconnect are the surface contract's, on every
//! surface: `surfaces/contract.rs`).

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::*;

fn demo_pids(gw: &Gateway) -> Vec<u64> {
    gw.spy_events("started")
        .iter()
        .filter_map(|e| e["pid"].as_u64())
        .collect()
}

/// Security review finding 7: an agent backend's child gets the default pass list and its
/// config's `env`, nothing else of the gateway's environment (the store password, the cluster
/// key and the upstream key are all set on the gateway here).
#[tokio::test]
async fn the_backend_child_environment_holds_only_its_pass_list() {
    let gw = Gateway::start_with(Opts {
        env: vec![("SOME_SECRET_TOKEN".into(), "s3cr3t".into())],
        ..Opts::default()
    })
    .await;
    let (status, v) = gw
        .chat(ALICE, &json!({"model": "echo", "messages": [user("hi")]}))
        .await;
    assert_eq!(status, 200, "{v}");
    let pid = *demo_pids(&gw).first().expect("a demo backend started");
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let mut names: Vec<String> = environ
        .split(|b| *b == 0)
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            String::from_utf8_lossy(kv)
                .split('=')
                .next()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    names.sort();
    for secret in [
        "SOME_SECRET_TOKEN",
        "TURNSTILE_TEST_UPSTREAM_KEY",
        postgres::PASSWORD_ENV,
        CLUSTER_KEY_ENV,
        "TURNSTILE_LOG",
    ] {
        assert!(!names.iter().any(|n| n == secret), "{secret} in {names:?}");
    }
    assert!(names.iter().any(|n| n == "TURNSTILE_DEMO_SPY"), "{names:?}");
    let allowed = turnstile::config::DEFAULT_ENV_PASSTHROUGH;
    for n in &names {
        let ok = allowed.contains(&n.as_str()) || n == "TURNSTILE_DEMO_SPY";
        assert!(ok, "unexpected {n} in {names:?}");
    }
}

/// Security review finding 13 (settled: it was true of a backend that logs its input): the
/// gateway forwards a backend's stderr lines verbatim only until its handshake is done; after
/// that, a line (which may quote a prompt) is logged by its size alone, even at debug.
#[tokio::test]
async fn a_backends_stderr_never_carries_a_prompt_into_the_log() {
    let gw = Gateway::start().await;
    let (status, v) = gw
        .chat(
            ALICE,
            &json!({"model": "echo", "messages": [user("PROMPT-7f3a-SECRET")]}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    wait_until("the stderr line logged", || {
        gw.log().contains("backend stderr line (content withheld)")
    })
    .await;
    assert!(!gw.log().contains("PROMPT-7f3a-SECRET"));
}

#[tokio::test]
async fn backend_crash_mid_turn_is_502_and_the_next_request_works() {
    let gw = Gateway::start().await;
    let (status, v) = gw
        .chat(ALICE, &json!({"model": "crash", "messages": [user("x")]}))
        .await;
    assert_eq!(status, 502, "{v}");
    assert_eq!(error_code(&v), "upstream_error");
    let first = demo_pids(&gw)[0];
    wait_until("crashed child reaped", || !pid_alive(first)).await;
    let (status, v) = gw
        .chat(
            ALICE,
            &json!({"model": "echo", "messages": [user("again")]}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(demo_pids(&gw).len(), 2, "a replacement process was started");

    // Streaming: the failure after headers is one error event, then [DONE].
    let (status, _, body) = gw
        .chat_stream(ALICE, &json!({"model": "crash", "messages": [user("x")]}))
        .await;
    assert_eq!(status, 200);
    let (events, done) = sse_events(&body);
    assert_eq!(done, 1);
    assert_eq!(events.last().unwrap()["error"]["code"], "upstream_error");
}

#[tokio::test]
async fn pool_exhaustion_is_429_after_a_bounded_wait() {
    let gw = Gateway::start_with(Opts {
        max_sessions: 1,
        acquire_timeout_ms: 300,
        ..Opts::default()
    })
    .await;
    let hold = gw.hold_stream(ALICE).await;
    let (status, v) = gw
        .chat(ALICE, &json!({"model": "echo", "messages": [user("y")]}))
        .await;
    assert_eq!(status, 429, "{v}");
    assert_eq!(error_code(&v), "capacity_exhausted");
    drop(hold);
    gw.wait_spy("interrupt", 1).await;
    // The session comes back once the held turn is interrupted.
    let within = Duration::from_secs(10);
    wait_for_within("the session to be freed", within, String::new, async || {
        let (status, _) = gw
            .chat(ALICE, &json!({"model": "echo", "messages": [user("z")]}))
            .await;
        (status == 200).then_some(())
    })
    .await;
}

#[tokio::test]
async fn restart_while_suspended_is_410_and_consumed_replay_stays_409() {
    let mut gw = Gateway::start().await;
    // One execution fully resumed (its token is consumed), one left suspended.
    let req = tool_request("tool", "x");
    let (_, resp) = gw.chat(ALICE, &req).await;
    let consumed = continuation(&req, &resp, |_, _| json!("R"));
    assert_eq!(gw.chat(ALICE, &consumed).await.0, 200);
    let req2 = tool_request("tool", "y");
    let (_, resp2) = gw.chat(ALICE, &req2).await;
    let held = continuation(&req2, &resp2, |_, _| json!("R2"));

    assert_eq!(gw.stop().await, Some(0));
    for pid in demo_pids(&gw) {
        assert!(!pid_alive(pid), "demo backend {pid} survived shutdown");
    }
    gw.spawn().await;
    let (status, v) = gw.chat(ALICE, &held).await;
    assert_eq!(status, 410, "{v}");
    assert_eq!(error_code(&v), "continuation_lost");
    let (status, v) = gw.chat(ALICE, &consumed).await;
    assert_eq!(status, 409, "{v}");
    // Tombstones stay principal-bound across restarts.
    assert_eq!(gw.chat(BOB, &consumed).await.0, 404);
    assert_eq!(gw.spy_events("tool_result").len(), 1);
}

#[tokio::test]
async fn sighup_revocation_interrupts_and_broken_reload_keeps_serving() {
    let gw = Gateway::start().await;
    let req = tool_request("tool", "x");
    let (_, resp) = gw.chat(ALICE, &req).await;
    let next = continuation(&req, &resp, |_, _| json!("R"));

    // A broken file is refused; the running config stays.
    std::fs::write(gw.config_path(), "[server]\nbogus = 1\n").unwrap();
    gw.signal("HUP");
    wait_until("reload refusal logged", || {
        gw.log().contains("config reload refused")
    })
    .await;
    assert_eq!(
        gw.chat(ALICE, &json!({"model": "echo", "messages": [user("ok")]}))
            .await
            .0,
        200
    );

    // Narrow alice to `echo` only: the held turn is revoked on resume.
    let narrowed = config_text(
        &Opts {
            alice_models: r#"["echo"]"#,
            ..gw.opts.clone()
        },
        gw.dir.path(),
    );
    std::fs::write(gw.config_path(), narrowed).unwrap();
    gw.signal("HUP");
    wait_until("reload logged", || gw.log().contains("config reloaded")).await;
    let (status, v) = gw.chat(ALICE, &next).await;
    assert_eq!(status, 403, "{v}");
    assert_eq!(error_code(&v), "unauthorized_target");
    gw.wait_spy("interrupt", 1).await;
    assert!(gw.spy_events("tool_result").is_empty());
    // New requests see the narrower allowlist at once.
    assert_eq!(gw.chat(ALICE, &tool_request("tool", "y")).await.0, 404);
}

#[tokio::test]
async fn graceful_shutdown_leaves_no_child() {
    let mut gw = Gateway::start().await;
    // A running turn and a suspended one at the moment of shutdown.
    let hold = gw.hold_stream(ALICE).await;
    let (_, resp) = gw.chat(ALICE, &tool_request("tool", "x")).await;
    assert_eq!(calls(&resp).len(), 1);
    assert_eq!(gw.stop().await, Some(0));
    let pids = demo_pids(&gw);
    assert!(!pids.is_empty());
    for pid in pids {
        assert!(!pid_alive(pid), "demo backend {pid} survived shutdown");
    }
    let body = tokio::time::timeout(Duration::from_secs(5), hold.text())
        .await
        .unwrap()
        .unwrap_or_default();
    let (events, _) = sse_events(&body);
    let _: Vec<Value> = events;
}
