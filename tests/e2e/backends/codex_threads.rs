//! The real Codex `app-server` over a long run, behind the gateway (fake Responses model,
//! offline): the memory of its children stays bounded over hundreds of turns with default
//! settings, a held turn survives a process recycle, effort reaches the model, and a
//! conversation continues on one Codex thread (the model sees its own history as items, not
//! a transcript) only for the same principal and the same history.

use std::io::Write as _;

use serde_json::{json, Value};

use crate::backends::codex::{codex_bin, text_of, Rig, Setup};
use crate::support::fake_responses::{self as fake, FakeResponses, Reply};
use crate::support::*;

/// Turns of the soak, and how many run at once.
const SOAK_TURNS: usize = 600;
const SOAK_CONCURRENCY: usize = 4;
/// Turns before the baseline sample (Codex loads its models and caches on the first ones).
const WARM_UP: usize = 50;
/// The growth the RSS of a Codex child may show after the warm-up, alone or while a
/// recycled one drains beside it.
const RSS_BUDGET_MIB: u64 = 128;
/// Codex children alive at once: the serving one and, during a recycle, the draining one.
const MAX_CHILDREN: usize = 2;

/// Resident memory of a process in MiB (0 once it has exited). Under
/// `TURNSTILE_CODEX_TRACE` each Codex runs below a shell, which this soak then measures.
fn rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0);
    kib / 1024
}

fn plain(text: &str) -> Value {
    json!({"model": "codex", "messages": [user(text)]})
}

/// Straight to the process's stderr, so the figures show in a passing run's log too.
fn report(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soak_of_plain_turns_keeps_codex_memory_bounded() {
    let Some(bin) = codex_bin() else { return };
    let model = FakeResponses::start(|_, _| Reply::text("ok", 1)).await;
    let rig = Rig::start(&bin, &model, Setup::default()).await;
    let pid = rig.gw.pid();
    let rig = &rig;
    // (turns done, [(pid, RSS MiB)])
    let mut samples: Vec<(usize, Vec<(u32, u64)>)> = Vec::new();
    let mut done = 0;
    while done < SOAK_TURNS {
        let batch: Vec<_> = (0..SOAK_CONCURRENCY)
            .map(|i| {
                let body = plain(&format!("turn {}", done + i));
                async move { rig.chat(&body).await }
            })
            .collect();
        for (status, v) in futures::future::join_all(batch).await {
            assert_eq!(status, 200, "{v}\n{}", rig.log_tail());
        }
        done += SOAK_CONCURRENCY;
        if done % 20 == 0 {
            // The gateway's own children: the Codex app-servers. What a Codex spawns for
            // itself (short-lived shells at its start) is not one of them.
            let procs = children(pid);
            samples.push((done, procs.iter().map(|p| (*p, rss_mib(*p))).collect()));
        }
    }
    // The serving process's RSS once warm; a draining one beside it is bounded on its own.
    let baseline = samples
        .iter()
        .find(|(n, p)| *n >= WARM_UP && p.len() == 1)
        .map(|(_, p)| p[0].1)
        .unwrap();
    let peak = samples
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(_, rss)| *rss))
        .max()
        .unwrap();
    // A process that has exited but is not reaped yet (or has just forked) has no resident
    // memory: it is not a Codex holding any.
    let most_children = samples
        .iter()
        .map(|(_, p)| p.iter().filter(|(_, rss)| *rss > 0).count())
        .max()
        .unwrap();
    report(&format!(
        "codex soak: {SOAK_TURNS} plain turns, {SOAK_CONCURRENCY} at a time; RSS of each Codex child (MiB) after turns: {}; baseline {baseline} MiB after {WARM_UP}, peak of one child {peak} MiB, growth {} MiB, at most {most_children} children",
        samples
            .iter()
            .map(|(n, p)| format!(
                "{n}:{}",
                p.iter().map(|(_, r)| r.to_string()).collect::<Vec<_>>().join("+")
            ))
            .collect::<Vec<_>>()
            .join(" "),
        peak.saturating_sub(baseline),
    ));
    let log = rig.gw.log();
    let recycling: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains("recycled")
                || l.contains("drained")
                || l.contains("process exited")
                || l.contains("process started")
        })
        .collect();
    assert!(
        peak <= baseline + RSS_BUDGET_MIB && most_children <= MAX_CHILDREN,
        "Codex memory grew by {} MiB (> {RSS_BUDGET_MIB}) or more than {MAX_CHILDREN} children lived at once over the soak: {samples:?}\n{}",
        peak.saturating_sub(baseline),
        recycling.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_turn_survives_a_recycle_of_its_codex_process() {
    let Some(bin) = codex_bin() else { return };
    let model = FakeResponses::start(|_, body| {
        if !fake::user_says(body, "read the notes") {
            return Reply::text("ok", 1);
        }
        match fake::output_for(body, "call_held") {
            None => Reply::call("call_held", "read_file", json!({"path": "/notes"})),
            Some(out) => Reply::text(&format!("notes: {}", text_of(&out)), 1),
        }
    })
    .await;
    let setup = Setup {
        backend: "recycle_after_threads = 3",
        ..Setup::default()
    };
    let rig = Rig::start(&bin, &model, setup).await;
    let pid = rig.gw.pid();
    let old = children(pid);
    assert_eq!(old.len(), 1, "one Codex process at start");
    let req = tool_request("codex", "read the notes");
    let (s, held) = rig.chat(&req).await;
    assert_eq!(
        (s, calls(&held).len()),
        (200, 1),
        "{held}\n{}",
        rig.log_tail()
    );
    // More threads reach the bound: a fresh process takes new turns; the old one drains.
    let fresh = wait_for("a replacement Codex process", async || {
        let (s, v) = rig.chat(&plain("more")).await;
        assert_eq!(s, 200, "{v}");
        let now = children(pid);
        now.iter().any(|p| !old.contains(p)).then_some(now)
    })
    .await;
    assert!(
        fresh.contains(&old[0]),
        "the old process drains its held turn first"
    );
    let (s, done) = rig
        .chat(&continuation(&req, &held, |_, _| json!("R")))
        .await;
    assert_eq!(
        (s, content(&done)),
        (200, "notes: R".into()),
        "{}",
        rig.log_tail()
    );
    wait_for("the recycled process to exit", async || {
        (!children(pid).contains(&old[0])).then_some(())
    })
    .await;
    let (s, _) = rig.chat(&plain("after")).await;
    assert_eq!(s, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn effort_reaches_the_model_and_a_changed_effort_is_refused() {
    let Some(bin) = codex_bin() else { return };
    let model = FakeResponses::start(|_, body| match fake::output_for(body, "call_e") {
        None if fake::user_says(body, "read") => {
            Reply::call("call_e", "read_file", json!({"path": "/x"}))
        }
        _ => Reply::text("done", 1),
    })
    .await;
    let rig = Rig::start(&bin, &model, Setup::default()).await;
    let mut req = tool_request("codex", "read it");
    req["reasoning_effort"] = json!("high");
    let (s, v) = rig.chat(&req).await;
    assert_eq!((s, calls(&v).len()), (200, 1), "{v}\n{}", rig.log_tail());
    assert_eq!(model.requests()[0]["reasoning"]["effort"], "high");
    let mut changed = continuation(&req, &v, |_, _| json!("R"));
    changed["reasoning_effort"] = json!("low");
    let (s, e) = rig.chat(&changed).await;
    assert_eq!(
        (s, error_code(&e)),
        (400, "continuation_mismatch".into()),
        "{e}"
    );
    let (s, done) = rig.chat(&continuation(&req, &v, |_, _| json!("R"))).await;
    assert_eq!((s, content(&done)), (200, "done".into()));
    assert_eq!(model.requests()[1]["reasoning"]["effort"], "high");
}

/// Whether the model saw the conversation as a rendered transcript.
fn transcript(body: &Value) -> bool {
    fake::user_says(body, "The conversation so far")
}

/// The assistant messages the model sees as history items.
fn assistant_texts(body: &Value) -> Vec<String> {
    body["input"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["type"] == "message" && i["role"] == "assistant")
        .map(|i| {
            i["content"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["text"].as_str())
                .collect::<String>()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_runs_on_one_codex_thread_for_its_own_principal_only() {
    let Some(bin) = codex_bin() else { return };
    let model = FakeResponses::start(|n, _| Reply::text(&format!("answer {n}"), 2)).await;
    let rig = Rig::start(&bin, &model, Setup::default()).await;
    let mut req = json!({"model": "codex", "messages": [
        {"role": "system", "content": "be brief"}, user("first question")]});
    for next in ["second question", "third question"] {
        let (s, v) = rig.chat(&req).await;
        assert_eq!(s, 200, "{v}\n{}", rig.log_tail());
        let messages = req["messages"].as_array_mut().unwrap();
        messages.push(json!({"role": "assistant", "content": content(&v)}));
        messages.push(user(next));
    }
    let (s, last) = rig.chat(&req).await;
    assert_eq!(s, 200, "{last}");
    let seen = model.requests();
    assert_eq!(seen.len(), 3);
    for (i, body) in seen.iter().enumerate().skip(1) {
        assert!(!transcript(body), "turn {} got a transcript: {body}", i + 1);
        assert_eq!(
            assistant_texts(body).len(),
            i,
            "structured history on turn {}",
            i + 1
        );
        assert_eq!(
            body["prompt_cache_key"], seen[0]["prompt_cache_key"],
            "one thread"
        );
    }
    assert_eq!(assistant_texts(&seen[2]), ["answer 0", "answer 1"]);
    assert!(fake::user_says(&seen[2], "first question"));
    assert!(fake::user_says(&seen[2], "third question"));

    // Bob sending alice's exact conversation gets a fresh thread (and the transcript).
    let (s, _) = rig.chat_as(BOB, &req).await;
    assert_eq!(s, 200);
    // So does alice with an edited history.
    let mut edited = req.clone();
    edited["messages"][2]["content"] = json!("an answer never given");
    let (s, _) = rig.chat(&edited).await;
    assert_eq!(s, 200);
    let seen = model.requests();
    assert_eq!(seen.len(), 5);
    for body in &seen[3..] {
        assert!(transcript(body), "{body}");
        assert!(assistant_texts(body).is_empty());
        assert_ne!(body["prompt_cache_key"], seen[0]["prompt_cache_key"]);
    }
    assert!(fake::user_says(&seen[4], "an answer never given"));
}
