//! Engine tests, in process, against a scripted backend injected through the `Backend` trait:
//! the continuation validation order, register before exposure, the claim race, endings
//! returning pending records and sessions to zero, and expiry in paused time. Approval
//! policy tests are in `tests/approvals.rs`.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::channel::mpsc::{unbounded, UnboundedSender};
use futures::future::BoxFuture;
use serde_json::{json, Value};

use super::*;
use crate::backend::{
    BackendError, HeldCall, Hold, LegRequest, Resume, SessionStats, Turn, TurnControl, TurnEvent,
};
use crate::error::{ApiError, ErrorCode};
use crate::surface::chat;
use crate::turn::TurnInput;

mod approvals;
mod budgets;

/// What the scripted backend saw and holds.
#[derive(Default)]
struct Spy {
    /// Live turns (a session each), dropped when the engine lets go of the turn.
    live: AtomicUsize,
    interrupts: AtomicUsize,
    answers: Mutex<Vec<String>>,
    senders: Mutex<HashMap<String, UnboundedSender<TurnEvent>>>,
    /// Executions whose turn completed (dropping any other turn interrupts it).
    completed: Mutex<std::collections::HashSet<String>>,
    /// The meter of each execution's latest leg.
    meters: Mutex<HashMap<String, crate::backend::Meter>>,
}

/// An agent whose leg is chosen by the last user message: `tool` asks for one call, `two`
/// for two parallel calls, `hang` says nothing, anything else answers `echo: <text>`.
struct Scripted {
    spy: Arc<Spy>,
}

struct Control {
    spy: Arc<Spy>,
    id: String,
}

impl TurnControl for Control {
    fn answer_tool(&self, invocation: u64, text: &str, _success: bool) -> Result<(), BackendError> {
        self.spy.answers.lock().push(format!("{invocation}={text}"));
        Ok(())
    }
    fn interrupt(&self) {
        self.spy.interrupts.fetch_add(1, Ordering::SeqCst);
    }
    fn is_alive(&self) -> bool {
        true
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        // As a real agent turn: dropping an unfinished one interrupts it.
        if !self.spy.completed.lock().contains(&self.id) {
            self.interrupt();
        }
        self.spy.live.fetch_sub(1, Ordering::SeqCst);
        self.spy.senders.lock().remove(&self.id);
    }
}

impl Backend for Scripted {
    fn describe(&self) -> crate::backend::BackendInfo {
        crate::backend::BackendInfo {
            kind: "app-server",
            provider: "openai",
            holds: Holds::Turn,
        }
    }
    fn validate(&self, _input: &TurnInput) -> Result<(), BackendError> {
        Ok(())
    }
    fn start<'a>(&'a self, leg: LegRequest<'a>) -> BoxFuture<'a, Result<Turn, BackendError>> {
        Box::pin(async move {
            let (tx, rx) = unbounded();
            let last = leg.input.messages.last().map(|m| m.text.clone());
            let call = |i: u64| {
                TurnEvent::ToolCall(HeldCall {
                    invocation: i,
                    name: "read".into(),
                    arguments: format!("{{\"n\":{i}}}"),
                })
            };
            match last.as_deref() {
                Some("tool") => tx.unbounded_send(call(1)).unwrap(),
                Some("two") => {
                    tx.unbounded_send(call(1)).unwrap();
                    tx.unbounded_send(call(2)).unwrap();
                }
                Some("hang") => {}
                Some("approve") => tx.unbounded_send(ask(&self.spy)).unwrap(),
                other => {
                    self.spy
                        .completed
                        .lock()
                        .insert(leg.execution_id.to_string());
                    let text = format!("echo: {}", other.unwrap_or_default());
                    tx.unbounded_send(TurnEvent::Delta(text)).unwrap();
                    tx.unbounded_send(TurnEvent::Completed).unwrap();
                }
            }
            self.spy
                .senders
                .lock()
                .insert(leg.execution_id.to_string(), tx);
            (self.spy.meters.lock()).insert(leg.execution_id.to_string(), leg.meter.clone());
            self.spy.live.fetch_add(1, Ordering::SeqCst);
            let control = Control {
                spy: self.spy.clone(),
                id: leg.execution_id.to_string(),
            };
            Ok(Turn::new(rx, Box::new(control)))
        })
    }
    fn resume<'a>(
        &'a self,
        hold: Hold,
        r: Resume<'a>,
    ) -> BoxFuture<'a, Result<Turn, BackendError>> {
        Box::pin(async move {
            let Hold::Live { turn, invocations } = hold else {
                return Err(BackendError::Lost);
            };
            for a in &r.answers {
                turn.control
                    .answer_tool(invocations[a.call], a.text, !a.failed)?;
            }
            self.spy
                .completed
                .lock()
                .insert(r.leg.execution_id.to_string());
            if let Some(tx) = self.spy.senders.lock().get(r.leg.execution_id) {
                let _ = tx.unbounded_send(TurnEvent::Delta("done".into()));
                let _ = tx.unbounded_send(TurnEvent::Completed);
            }
            Ok(turn)
        })
    }
    fn stats(&self) -> SessionStats {
        let busy = self.spy.live.load(Ordering::SeqCst);
        SessionStats {
            busy,
            capacity: 16,
            processes_alive: 1,
            ..SessionStats::default()
        }
    }
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// A command approval the backend asks; its answer is recorded in the spy.
fn ask(spy: &Arc<Spy>) -> TurnEvent {
    let spy = spy.clone();
    TurnEvent::Approval(Box::new(crate::backend::ApprovalAsk {
        kind: crate::backend::ApprovalKind::Command,
        summary: json!({"command": "rm -rf build"}),
        action_digest: [9; 32],
        responder: crate::backend::ApprovalResponder::new(move |ok| {
            spy.answers.lock().push(format!("approval={ok}"));
        }),
        tool_use: None,
    }))
}

const CONFIG: &str = r#"
[store]
path = "t.db"
[[clients]]
id = "alice"
key_sha256 = "KEY_A"
[[clients]]
id = "bob"
key_sha256 = "KEY_B"
[[models]]
id = "m"
backend = "fake"
approvals = { command = "ask" }
[approvals]
ttl_seconds = 30
[backends.fake]
kind = "app-server"
command = ["unused"]
[continuations]
execution_ttl_seconds = 60
batch_debounce_ms = 5
max_pending_per_client = 4
"#;

struct Fixture {
    engine: Engine,
    spy: Arc<Spy>,
    dir: tempfile::TempDir,
}

async fn fixture_with(config: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let text = config
        .replace("KEY_A", &crate::auth::hash_key("sk-a"))
        .replace("KEY_B", &crate::auth::hash_key("sk-b"));
    let cfg = crate::config::from_toml_str(&text, dir.path()).unwrap();
    let spy = Arc::new(Spy::default());
    let mut backends: BTreeMap<String, Arc<dyn Backend>> = BTreeMap::new();
    backends.insert("fake".into(), Arc::new(Scripted { spy: spy.clone() }));
    let engine = Engine::with_backends(cfg, None, backends).await.unwrap();
    Fixture { engine, spy, dir }
}

async fn fixture() -> Fixture {
    fixture_with(CONFIG).await
}

fn who(id: &str) -> Principal {
    Principal::new(id, false)
}

fn input(messages: Value) -> TurnInput {
    let body = json!({"model": "m", "messages": messages, "tools": [
        {"type": "function", "function": {"name": "read", "parameters": {}}}]});
    chat::parse(Bytes::from(body.to_string()), Instant::now())
        .unwrap()
        .0
}

/// Drains a leg: its text and its exposed calls, or its error.
async fn finish(mut leg: Leg) -> Result<(String, Vec<crate::turn::ExposedCall>), EngineError> {
    let mut text = String::new();
    while let Some(ev) = leg.events.recv().await {
        match ev {
            LegEvent::Delta(d) => text.push_str(&d),
            LegEvent::End { calls, .. } => return Ok((text, calls)),
            LegEvent::Error(e) => return Err(e),
            LegEvent::Relayed(_)
            | LegEvent::Approval(_)
            | LegEvent::Truncated
            | LegEvent::ToolEnded(_) => {}
            LegEvent::Reasoning(_) => {}
        }
    }
    Err(EngineError::TurnFailed)
}

/// The conversation that answers `calls` (suspended after `user`) with `results`.
fn answering(user: &str, calls: &[crate::turn::ExposedCall], results: &[(&str, &str)]) -> Value {
    let tool_calls: Vec<Value> = calls
        .iter()
        .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
        .collect();
    let mut m = vec![
        json!({"role": "user", "content": user}),
        json!({"role": "assistant", "content": null, "tool_calls": tool_calls}),
    ];
    for (id, text) in results {
        m.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
    }
    Value::Array(m)
}

/// A fresh turn of alice's with one user message.
async fn begin(f: &Fixture, user: &str) -> Leg {
    let first = input(json!([{"role": "user", "content": user}]));
    f.engine.execute(&who("alice"), first).await.unwrap()
}

async fn suspended(f: &Fixture, user: &str) -> Vec<crate::turn::ExposedCall> {
    finish(begin(f, user).await).await.unwrap().1
}

fn code(e: EngineError) -> ErrorCode {
    ApiError::from(e).code
}

async fn settle_idle(f: &Fixture) {
    // Endings run on the leg task after its last event; wait (bounded) until they are done.
    for _ in 0..200 {
        if f.spy.live.load(Ordering::SeqCst) == 0 && f.engine.inner.suspensions.pending_count() == 0
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!(
        "not idle: {} live turns, {} pending",
        f.spy.live.load(Ordering::SeqCst),
        f.engine.inner.suspensions.pending_count()
    );
}

#[tokio::test]
async fn plain_turn_ends_completed_and_frees_the_session() {
    let f = fixture().await;
    let leg = begin(&f, "hi").await;
    let id = leg.execution_id.clone();
    assert_eq!(finish(leg).await.unwrap().0, "echo: hi");
    settle_idle(&f).await;
    f.engine.inner.suspensions.flush().await;
    let events = f.engine.inner.store.journal_events(&id).await.unwrap();
    assert_eq!(events, ["execution_started", "execution_ended"]);
}

#[tokio::test]
async fn tokens_are_registered_and_recorded_before_they_are_exposed() {
    let f = fixture().await;
    let calls = suspended(&f, "two").await;
    assert_eq!(calls.len(), 2);
    // The leg has ended with the calls: by now both are pending in memory and in the store.
    assert_eq!(f.engine.inner.suspensions.pending_count(), 2);
    let rows: i64 = rusqlite::Connection::open(f.dir.path().join("t.db"))
        .unwrap()
        .query_row("SELECT COUNT(*) FROM pending_tokens", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 2);
    assert!(calls
        .iter()
        .all(|c| crate::continuation::token::is_token_shape(&c.id)));
}

#[tokio::test]
async fn a_continuation_answers_the_held_calls_once() {
    let f = fixture().await;
    let calls = suspended(&f, "two").await;
    let results = [(calls[1].id.as_str(), "B"), (calls[0].id.as_str(), "A")];
    let next = input(answering("two", &calls, &results));
    let leg = f.engine.execute(&who("alice"), next.clone()).await.unwrap();
    assert_eq!(finish(leg).await.unwrap().0, "done");
    // Each call gets its own result, in the order the calls were made.
    assert_eq!(*f.spy.answers.lock(), ["1=A", "2=B"]);
    let replay = f.engine.execute(&who("alice"), next).await.err().unwrap();
    assert_eq!(code(replay), ErrorCode::ContinuationAlreadyResolved);
    settle_idle(&f).await;
}

#[tokio::test]
async fn validation_order_first_failure_wins() {
    let f = fixture().await;
    let calls = suspended(&f, "tool").await;
    let id = calls[0].id.as_str();
    let good = answering("tool", &calls, &[(id, "R")]);

    // Another principal: 404, even though the body also drifts.
    let mut drift = good.clone();
    drift[0]["content"] = json!("changed");
    let e = f
        .engine
        .execute(&who("bob"), input(drift.clone()))
        .await
        .err()
        .unwrap();
    assert_eq!(code(e), ErrorCode::ContinuationNotFound);
    // Drift: 400, and nothing was consumed.
    let e = f
        .engine
        .execute(&who("alice"), input(drift))
        .await
        .err()
        .unwrap();
    assert_eq!(code(e), ErrorCode::ContinuationMismatch);
    let mut missing = good.clone();
    missing.as_array_mut().unwrap().pop();
    missing
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "tool", "tool_call_id": id, "content": "R"}));
    missing
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "tool", "tool_call_id": id, "content": "R"}));
    let e = f
        .engine
        .execute(&who("alice"), input(missing))
        .await
        .err()
        .unwrap();
    assert_eq!(code(e), ErrorCode::ContinuationMismatch);
    assert_eq!(f.engine.inner.suspensions.pending_count(), 1);

    // Revoked grant beats the claim: 403, the held turn is interrupted.
    let revoked = CONFIG.replace(
        "[[clients]]\nid = \"alice\"\nkey_sha256 = \"KEY_A\"",
        "[[clients]]\nid = \"alice\"\nkey_sha256 = \"KEY_A\"\nmodels = []",
    );
    let text = revoked
        .replace("KEY_A", &crate::auth::hash_key("sk-a"))
        .replace("KEY_B", &crate::auth::hash_key("sk-b"));
    let cfg = crate::config::from_toml_str(&text, f.dir.path()).unwrap();
    *f.engine.inner.config.write() = Arc::new(cfg);
    let e = f
        .engine
        .execute(&who("alice"), input(good.clone()))
        .await
        .err()
        .unwrap();
    assert_eq!(code(e), ErrorCode::UnauthorizedTarget);
    // Settled now: the replay reads the tombstone.
    let e = f
        .engine
        .execute(&who("alice"), input(good))
        .await
        .err()
        .unwrap();
    assert_eq!(code(e), ErrorCode::UnauthorizedTarget);
    settle_idle(&f).await;
    assert!(f.spy.interrupts.load(Ordering::SeqCst) >= 1);
}

#[tokio::test]
async fn concurrent_claims_have_one_winner() {
    let f = fixture().await;
    let calls = suspended(&f, "tool").await;
    let next = input(answering("tool", &calls, &[(calls[0].id.as_str(), "R")]));
    let racers = (0..4).map(|_| {
        let engine = f.engine.clone();
        let next = next.clone();
        tokio::spawn(async move { engine.execute(&who("alice"), next).await.map(|_| ()) })
    });
    let results = futures::future::join_all(racers).await;
    let won = results.iter().filter(|r| matches!(r, Ok(Ok(())))).count();
    let lost = results
        .into_iter()
        .filter_map(|r| r.unwrap().err())
        .map(code)
        .collect::<Vec<_>>();
    assert_eq!(won, 1);
    assert_eq!(lost, [ErrorCode::ContinuationAlreadyResolved; 3]);
    assert_eq!(f.spy.answers.lock().len(), 1);
    settle_idle(&f).await;
}

#[tokio::test]
async fn client_disconnect_and_shutdown_end_everything() {
    let f = fixture().await;
    let leg = begin(&f, "hang").await;
    drop(leg);
    settle_idle(&f).await;
    assert_eq!(f.spy.interrupts.load(Ordering::SeqCst), 1);

    let calls = suspended(&f, "tool").await;
    assert_eq!(f.spy.live.load(Ordering::SeqCst), 1);
    f.engine.shutdown().await;
    settle_idle(&f).await;
    let next = input(answering("tool", &calls, &[(calls[0].id.as_str(), "R")]));
    let e = f.engine.execute(&who("alice"), next).await.err().unwrap();
    assert_eq!(code(e), ErrorCode::ShuttingDown);
    assert_eq!(ApiError::from(EngineError::ShuttingDown).status(), 503);
}

#[tokio::test(start_paused = true)]
async fn expiry_settles_in_paused_time() {
    let f = fixture().await;
    let calls = suspended(&f, "tool").await;
    assert_eq!(f.engine.inner.suspensions.pending_count(), 1);
    tokio::time::sleep(Duration::from_secs(59)).await;
    assert_eq!(f.engine.inner.suspensions.pending_count(), 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    settle_idle(&f).await;
    let next = input(answering("tool", &calls, &[(calls[0].id.as_str(), "R")]));
    let e = f.engine.execute(&who("alice"), next).await.err().unwrap();
    assert_eq!(code(e), ErrorCode::ContinuationExpired);
    assert_eq!(f.spy.interrupts.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_running_leg_past_its_deadline_ends_expired() {
    let f = fixture().await;
    let leg = begin(&f, "hang").await;
    let e = finish(leg).await.err().unwrap();
    assert_eq!(e, EngineError::Deadline);
    settle_idle(&f).await;
}

#[tokio::test]
async fn the_pending_bound_refuses_without_exposing() {
    let f = fixture().await;
    for _ in 0..2 {
        assert_eq!(suspended(&f, "two").await.len(), 2);
    }
    let leg = begin(&f, "tool").await;
    assert_eq!(
        finish(leg).await.err(),
        Some(EngineError::SuspensionCapacity)
    );
    assert_eq!(f.engine.inner.suspensions.pending_count(), 4);
}

#[tokio::test]
async fn check_is_pure_and_ordered() {
    use crate::continuation::{Digests, PendingView};
    let t = |b: u8| crate::digest::sha256(&[b]);
    let mut view = PendingView {
        alive: true,
        batch: 1,
        execution_id: "exe-1".into(),
        model: "m".into(),
        surface: crate::turn::SurfaceId::Chat,
        deadline: Instant::now(),
        digests: Digests {
            tools: [0; 32],
            tool_choice: [0; 32],
            prefix: [0; 32],
            echo: [0; 32],
        },
        tokens: vec![t(1), t(2)],
        by_reference: false,
        durable: false,
        spent: 0,
        cap: None,
    };
    let mut inp = input(json!([{"role": "user", "content": "x"}]));
    let mut c = crate::turn::Continuation {
        assistant: 0,
        tokens: vec![t(1), t(2)],
        results: vec![(t(2), 0), (t(1), 0)],
        prefix: [0; 32],
        echo: [0; 32],
        bound: None,
    };
    view.digests.tools = inp.fingerprint.tools;
    view.digests.tool_choice = inp.fingerprint.tool_choice;
    let placement = resume::check(&view, &inp, &c, 100).unwrap();
    assert_eq!(
        (placement.results, placement.calls),
        (vec![1, 0], vec![0, 1])
    );
    c.results[0].0 = t(1);
    assert!(matches!(
        resume::check(&view, &inp, &c, 100),
        Err(ContinuationError::Mismatch(m)) if m.contains("more than once")
    ));
    c.results[0].0 = t(2);
    assert!(matches!(
        resume::check(&view, &inp, &c, 0),
        Err(ContinuationError::Mismatch(m)) if m.contains("exceeds")
    ));
    inp.model = "other".into();
    assert!(matches!(
        resume::check(&view, &inp, &c, 100),
        Err(ContinuationError::Mismatch(m)) if m.contains("model")
    ));
}

#[tokio::test]
async fn the_activity_view_shows_a_principal_its_own_and_an_approver_all() {
    let f = fixture().await;
    let calls = suspended(&f, "two").await;
    let mine = f.engine.suspended_for(&who("alice"));
    assert_eq!(mine.len(), 1);
    let s = &mine[0];
    assert_eq!(
        (s.client.as_str(), s.hold, s.calls, s.round),
        ("alice", "held", 2, 1)
    );
    let names: Vec<String> = calls.iter().map(|c| c.name.clone()).collect();
    assert_eq!(s.tools, names);
    assert!(s.suspended_at.is_some() && s.deadline_at >= s.created_at + 59);
    // No token, digest or backend id in what the view shows.
    let shown = serde_json::to_string(&mine).unwrap();
    assert!(calls.iter().all(|c| !shown.contains(&c.id)));
    assert!(f.engine.suspended_for(&who("bob")).is_empty());
    let approver = Principal::new("bob", true);
    assert_eq!(f.engine.suspended_for(&approver).len(), 1);
    let backends = f.engine.backends_for(&approver);
    assert_eq!(backends.len(), 1);
    assert_eq!(
        (
            backends[0].name.as_str(),
            backends[0].kind,
            backends[0].status
        ),
        ("fake", "app-server", "ok")
    );
    assert_eq!(backends[0].models, ["m"]);
    assert!(f.engine.threads_for(&who("bob")).is_empty());
}
