//! A loaded session: its event log's live end (each event stored, then published to the
//! open streams, in order) and the state of its turn: the transcript the next turn is built
//! from, the custom tool uses it waits on, and the ids already answered or settled. Loaded
//! once per start from the store: a session a previous process left running or waiting on
//! custom tool results is settled (its held calls answer 410) with a `session.error` and
//! `session.status_idle` (`retries_exhausted`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::broadcast;

use super::agents::parse_row;
use super::spec::AgentSpec;
use super::{store_failed, wire, Managed};
use crate::auth::Principal;
use crate::error::{ApiError, ErrorCode};
use crate::store::{AppendError, ManagedRow};
use crate::turn::{Call, Message, Role};

/// An event as the streams receive it.
#[derive(Debug)]
pub struct Published {
    pub seq: i64,
    pub id: String,
    pub kind: String,
    pub json: String,
}

/// Where a session's turn is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Phase {
    #[default]
    Idle,
    Running,
    /// Held: custom tool uses wait for the client's results.
    Waiting,
}

/// A custom tool use the held turn waits on.
#[derive(Debug, Clone)]
pub(super) struct Waiting {
    pub event_id: String,
    /// The held call's continuation token (memory only).
    pub token: String,
}

#[derive(Default)]
pub(super) struct State {
    pub phase: Phase,
    pub transcript: Vec<Message>,
    pub waiting: Vec<Waiting>,
    /// The backend's own tool uses that wait on a `user.tool_confirmation`.
    pub confirming: Vec<super::confirm::Confirming>,
    /// The running turn's `agent.tool_use` event ids by their use, until its
    /// `agent.tool_result`.
    pub tool_uses: HashMap<crate::backend::ToolUseKey, String>,
    /// Results of the waiting uses received so far, by event id.
    pub results: HashMap<String, Message>,
    pub answered: HashSet<String>,
    /// Uses whose held turn ended without their result (expired, interrupted, lost).
    pub settled: HashSet<String>,
    /// User messages sent while a turn ran: the next turn's.
    pub queued: VecDeque<Message>,
    /// Interrupts the running leg.
    pub interrupt: Option<tokio_util::sync::CancellationToken>,
    /// The latest turn's execution: its backend thread may be kept for the next turn.
    pub execution: Option<String>,
    /// What the session has spent (nano-USD): what its turns before the latest one spent
    /// (`base`) and what the latest one's execution has spent so far.
    pub spent: u64,
    pub base: u64,
    pub execution_spent: crate::engine::Spent,
}

impl State {
    /// The session's spend, the running execution's included.
    pub fn spent(&mut self) -> u64 {
        let running = self.execution_spent.as_ref();
        let running = running.map_or(0, |s| s.load(std::sync::atomic::Ordering::Relaxed));
        self.spent = self.spent.max(self.base.saturating_add(running));
        self.spent
    }
}

pub struct Live {
    pub id: String,
    pub principal: String,
    /// The caller whose turn runs (the latest authenticated sender).
    pub(super) who: parking_lot::Mutex<Principal>,
    pub(super) agent: AgentSpec,
    /// The session's working folder: its agent's, on every backend kind that has one.
    pub(super) folder: std::path::PathBuf,
    row: parking_lot::Mutex<ManagedRow>,
    pub(super) state: parking_lot::Mutex<State>,
    /// One send at a time: validation, the log and the turn's start in order. Held across
    /// store calls and the engine's claim on purpose.
    pub(super) gate: tokio::sync::Mutex<()>,
    /// Appends in log order, each published as stored.
    log: tokio::sync::Mutex<()>,
    tx: broadcast::Sender<Arc<Published>>,
}

/// The principal's stored events would exceed its bound of `max` bytes: 429.
fn full(max: u64) -> ApiError {
    ApiError::new(
        ErrorCode::CapacityExhausted,
        format!("Your sessions' stored events would exceed {max} bytes; delete sessions first."),
    )
}

/// Events read back per store call while loading.
const LOAD_PAGE: usize = 500;

impl Live {
    pub(super) async fn load(
        m: &Managed,
        who: &Principal,
        row: ManagedRow,
    ) -> Result<Live, ApiError> {
        let session = parse_row(&row)?;
        let agent = AgentSpec::of(&session["agent"]);
        let mut state = State {
            spent: super::budget::spent(&session),
            ..State::default()
        };
        if let Some(system) = &agent.system {
            state.transcript.push(message(Role::System, system));
        }
        let store = m.engine().store();
        let mut after = None;
        loop {
            let rows = store
                .events_list(&row.id, after, LOAD_PAGE, false)
                .await
                .map_err(store_failed)?;
            for r in &rows {
                if let Ok(event) = serde_json::from_str::<Value>(&r.body) {
                    replay(&mut state, &event);
                }
            }
            match rows.last() {
                Some(last) if rows.len() == LOAD_PAGE => after = Some(last.seq),
                _ => break,
            }
        }
        // Uses with no result: their held turn went with the process that held it.
        let unanswered: Vec<String> = state.waiting.drain(..).map(|w| w.event_id).collect();
        let lost = session["status"] != "idle" || !unanswered.is_empty();
        state.settled.extend(unanswered);
        let (tx, _) = broadcast::channel(1024);
        let env = session["environment_id"].as_str().unwrap_or_default();
        let folder = super::environments::folder(m, env).join(&row.id);
        // Made again where it is missing (another replica's disk, or removed by hand).
        if let Err(e) = std::fs::create_dir_all(&folder) {
            tracing::error!(error = %e, "a session's working folder could not be made");
        }
        let live = Live {
            id: row.id.clone(),
            principal: who.id.to_string(),
            who: parking_lot::Mutex::new(who.clone()),
            agent,
            folder: std::path::absolute(&folder).unwrap_or(folder),
            row: parking_lot::Mutex::new(row),
            state: parking_lot::Mutex::new(state),
            gate: tokio::sync::Mutex::new(()),
            log: tokio::sync::Mutex::new(()),
            tx,
        };
        if lost {
            tracing::warn!(session = %live.id, "a session's turn was lost with the process that ran it");
            let events = vec![
                event(
                    "session.error",
                    json!({"error": {
                        "type": "unknown_error",
                        "message": "The session's turn was lost: the gateway restarted while it ran or was held.",
                        "retry_status": {"type": "terminal"},
                    }}),
                ),
                idle(json!({"type": "retries_exhausted"})),
            ];
            live.rewrite(m, |s| {
                s["status"] = json!("idle");
                Ok(())
            })
            .await?;
            live.append(m, events).await?;
        }
        Ok(live)
    }

    /// Whether a turn runs or is held.
    pub fn busy(&self) -> bool {
        self.state.lock().phase == Phase::Running
    }

    /// A receiver of the events published from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Published>> {
        self.tx.subscribe()
    }

    /// Stores events in order (within the principal's bound: 429 beyond it), then publishes
    /// them.
    pub(super) async fn append(
        &self,
        m: &Managed,
        events: Vec<Value>,
    ) -> Result<Vec<Value>, ApiError> {
        let order = self.order().await;
        self.append_ordered(m, events, &order).await
    }

    /// Holds the log's order: every other append waits until the guard is dropped (append
    /// meanwhile with [`Live::append_ordered`]). For what must be logged before anything it
    /// sets off, such as a confirmation before the tool use it lets run.
    pub(super) async fn order(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.log.lock().await
    }

    /// [`Live::append`], with the log's order held.
    pub(super) async fn append_ordered(
        &self,
        m: &Managed,
        events: Vec<Value>,
        _order: &tokio::sync::MutexGuard<'_, ()>,
    ) -> Result<Vec<Value>, ApiError> {
        let bodies: Vec<(String, String)> = events
            .iter()
            .map(|e| {
                (
                    e["id"].as_str().unwrap_or_default().to_string(),
                    e.to_string(),
                )
            })
            .collect();
        let pairs: Vec<(&str, &str)> = bodies
            .iter()
            .map(|(i, b)| (i.as_str(), b.as_str()))
            .collect();
        let max = m
            .engine()
            .config()
            .managed_agents
            .max_event_bytes_per_client;
        let seqs = m
            .engine()
            .store()
            .events_append(&self.id, &self.principal, &pairs, max)
            .await;
        let seqs = match seqs {
            Ok(s) => s,
            Err(AppendError::Full(max)) => return Err(full(max)),
            Err(AppendError::Store(e)) => return Err(store_failed(e)),
        };
        for ((seq, (id, json)), e) in seqs.into_iter().zip(bodies).zip(&events) {
            let kind = e["type"].as_str().unwrap_or_default().to_string();
            let _ = self.tx.send(Arc::new(Published {
                seq,
                id,
                kind,
                json,
            }));
        }
        Ok(events)
    }

    /// Whether `events` fit in what is left of the principal's bound, checked before a
    /// continuation is claimed so that one refused for its size consumes nothing (429, as
    /// [`Live::append`] refuses).
    pub(super) async fn room_for(&self, m: &Managed, events: &[Value]) -> Result<(), ApiError> {
        let max = m
            .engine()
            .config()
            .managed_agents
            .max_event_bytes_per_client;
        let bytes: u64 = events.iter().map(|e| e.to_string().len() as u64).sum();
        let stored = (m.engine().store().event_bytes(&self.principal))
            .await
            .map_err(store_failed)?;
        match stored.saturating_add(bytes) <= max {
            true => Ok(()),
            false => Err(full(max)),
        }
    }

    /// Rewrites the session's object (status, usage, title) and stores it; returns it.
    pub(super) async fn rewrite(
        &self,
        m: &Managed,
        f: impl FnOnce(&mut Value) -> Result<(), ApiError>,
    ) -> Result<Value, ApiError> {
        let row = {
            let mut row = self.row.lock();
            let mut session: Value = parse_row(&row)?;
            f(&mut session)?;
            session["updated_at"] = json!(wire::now().0);
            row.archived = !session["archived_at"].is_null();
            row.body = session.to_string();
            row.clone()
        };
        let store = m.engine().store();
        store
            .managed_update(super::sessions::KIND, &self.principal, &row, true)
            .await
            .map_err(store_failed)?;
        parse_row(&row)
    }

    /// The session's object as last written here.
    pub(super) fn object(&self) -> Result<Value, ApiError> {
        parse_row(&self.row.lock())
    }

    /// A deleted session: its running leg is interrupted (a held turn is settled by the
    /// engine when its tokens are withdrawn: see `runner::withdraw`).
    pub(super) async fn end(&self, m: &Managed) {
        let (interrupt, tokens) = {
            let mut s = self.state.lock();
            let tokens: Vec<String> = s.waiting.drain(..).map(|w| w.token).collect();
            s.phase = Phase::Idle;
            (s.interrupt.take(), tokens)
        };
        if let Some(i) = interrupt {
            i.cancel();
        }
        if !tokens.is_empty() {
            super::runner::withdraw(m, &self.principal, &tokens);
        }
        self.release_thread(m);
    }

    /// What is left of the session's budget (nano-USD; `None` without one) and what it has
    /// spent.
    pub(super) fn budget_left(&self) -> (Option<u64>, u64) {
        let ceiling = self.object().ok().and_then(|s| super::budget::ceiling(&s));
        let spent = self.state.lock().spent();
        (ceiling.map(|c| c.saturating_sub(spent)), spent)
    }

    /// Releases the backend thread kept for the session's next turn, if any.
    pub(super) fn release_thread(&self, m: &Managed) {
        if let Some(execution) = self.state.lock().execution.take() {
            m.engine().release_thread(&self.principal, &execution);
        }
    }
}

/// A new event of `kind` with the gateway's id and time.
pub(super) fn event(kind: &str, fields: Value) -> Value {
    let mut e = json!({"type": kind, "id": wire::new_id("sevt_"), "processed_at": wire::now().0});
    if let (Some(e), Value::Object(fields)) = (e.as_object_mut(), fields) {
        e.extend(fields);
    }
    e
}

/// `session.status_idle` with its stop reason.
pub(super) fn idle(stop_reason: Value) -> Value {
    event("session.status_idle", json!({"stop_reason": stop_reason}))
}

pub(super) fn message(role: Role, text: &str) -> Message {
    Message::text(role, text)
}

/// The text of a content list (text blocks joined; other blocks are not text).
pub(super) fn text_of(content: &Value) -> String {
    let blocks = content.as_array().map(Vec::as_slice).unwrap_or_default();
    blocks
        .iter()
        .filter_map(|b| b["text"].as_str())
        .collect::<Vec<_>>()
        .join("")
}

/// Rebuilds the state from one stored event, in order.
fn replay(s: &mut State, e: &Value) {
    let id = e["id"].as_str().unwrap_or_default().to_string();
    match e["type"].as_str().unwrap_or_default() {
        "user.message" => s
            .transcript
            .push(message(Role::User, &text_of(&e["content"]))),
        "agent.message" => s
            .transcript
            .push(message(Role::Assistant, &text_of(&e["content"]))),
        "agent.custom_tool_use" => {
            let call = Call {
                id: id.clone(),
                name: e["name"].as_str().unwrap_or_default().to_string(),
                arguments: e["input"].to_string(),
            };
            // A leg's uses join its message (or stand as one without text).
            match s.transcript.last_mut() {
                Some(m)
                    if m.role == Role::Assistant && s.waiting.iter().all(|w| w.event_id != id) =>
                {
                    m.tool_calls.push(call)
                }
                _ => {
                    let mut m = message(Role::Assistant, "");
                    m.tool_calls.push(call);
                    s.transcript.push(m);
                }
            }
            s.waiting.push(Waiting {
                event_id: id,
                token: String::new(),
            });
        }
        "user.custom_tool_result" => {
            let use_id = e["custom_tool_use_id"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let mut m = message(Role::Tool, &text_of(&e["content"]));
            m.tool_call_id = Some(use_id.clone());
            m.is_error = e["is_error"] == true;
            s.transcript.push(m);
            s.waiting.retain(|w| w.event_id != use_id);
            s.answered.insert(use_id);
        }
        "session.status_idle" if e["stop_reason"]["type"] != "requires_action" => {
            // The turn ended: whatever it waited on is settled.
            let left: Vec<String> = s.waiting.drain(..).map(|w| w.event_id).collect();
            s.settled.extend(left);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> State {
        State::default()
    }

    fn text(kind: &str, id: &str, t: &str) -> Value {
        json!({"type": kind, "id": id, "content": [{"type": "text", "text": t}]})
    }

    #[test]
    fn replay_rebuilds_the_transcript_and_what_waits() {
        let mut s = state();
        let log = [
            text("user.message", "e1", "read two"),
            text("agent.message", "e2", "Reading."),
            json!({"type": "agent.custom_tool_use", "id": "u1", "name": "read", "input": {"p": 1}}),
            json!({"type": "agent.custom_tool_use", "id": "u2", "name": "read", "input": {"p": 2}}),
            json!({"type": "session.status_idle", "id": "e3", "stop_reason": {"type": "requires_action"}}),
            json!({"type": "user.custom_tool_result", "id": "e4", "custom_tool_use_id": "u1",
                   "content": [{"type": "text", "text": "one"}], "is_error": true}),
        ];
        for e in &log {
            replay(&mut s, e);
        }
        let roles: Vec<Role> = s.transcript.iter().map(|m| m.role.clone()).collect();
        assert_eq!(roles, [Role::User, Role::Assistant, Role::Tool]);
        // Both uses of the leg join its message; the answered one is a result.
        let calls: Vec<&str> = s.transcript[1]
            .tool_calls
            .iter()
            .map(|c| c.id.as_str())
            .collect();
        assert_eq!(calls, ["u1", "u2"]);
        assert_eq!(s.transcript[1].tool_calls[1].arguments, r#"{"p":2}"#);
        assert!(s.transcript[2].is_error && s.transcript[2].tool_call_id.as_deref() == Some("u1"));
        assert!(s.answered.contains("u1"));
        assert_eq!(
            s.waiting
                .iter()
                .map(|w| w.event_id.as_str())
                .collect::<Vec<_>>(),
            ["u2"]
        );
        // The turn's end (an interrupt, a failure) settles what still waits.
        replay(
            &mut s,
            &json!({"type": "session.status_idle", "id": "e5", "stop_reason": {"type": "end_turn"}}),
        );
        assert!(s.waiting.is_empty() && s.settled.contains("u2") && !s.settled.contains("u1"));
    }

    #[test]
    fn a_use_without_text_stands_as_its_own_assistant_message() {
        let mut s = state();
        replay(&mut s, &text("user.message", "e1", "go"));
        replay(
            &mut s,
            &json!({"type": "agent.custom_tool_use", "id": "u1", "name": "t", "input": {}}),
        );
        assert_eq!(s.transcript.len(), 2);
        assert_eq!(
            (s.transcript[1].role.clone(), s.transcript[1].text.as_str()),
            (Role::Assistant, "")
        );
        assert_eq!(s.transcript[1].tool_calls.len(), 1);
    }
}
