//! The threads component alone: which kept thread a fresh request continues, and what is
//! refused or put back.

use std::time::Duration;

use super::*;
use crate::backend::{Idle, IdleThread};
use crate::surface::chat;

struct Thread;
impl IdleThread for Thread {
    fn usable(&self) -> bool {
        true
    }
}

fn config(enabled: bool) -> Config {
    let text = format!("[store]\npath = \"t.db\"\n[continuity]\nenabled = {enabled}\n");
    crate::config::from_toml_str(&text, std::path::Path::new("/tmp")).unwrap()
}

fn turn(messages: serde_json::Value) -> TurnInput {
    let body = serde_json::json!({"model": "m", "messages": messages});
    let mut input = chat::parse(body.to_string().into(), tokio::time::Instant::now())
        .unwrap()
        .0;
    input.digest_messages();
    input
}

/// Keeps a thread for `messages` (the conversation as the client will send it back), as
/// `principal`'s execution `exe-1` of model `m`.
fn keep(threads: &Threads, cfg: &Config, principal: &str, messages: serde_json::Value) {
    let input = turn(messages);
    let entry = Entry::new(
        digest_of_digests(&input.message_digests),
        Binding::new(principal, "m", input.surface, &input.fingerprint),
        "exe-1".into(),
        input.message_digests.clone(),
        Idle(Box::new(Thread)),
        Instant::now() + Duration::from_secs(60),
    );
    threads.keep_entry(cfg, entry);
}

fn so_far() -> serde_json::Value {
    serde_json::json!([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
}

fn next() -> serde_json::Value {
    let mut m = so_far();
    m.as_array_mut()
        .unwrap()
        .push(serde_json::json!({"role": "user", "content": "c"}));
    m
}

#[test]
fn a_follow_up_continues_its_own_kept_conversation_only() {
    let (threads, cfg) = (Threads::new(Arc::default()), config(true));
    keep(&threads, &cfg, "alice", so_far());
    assert_eq!(threads.len(), 1);
    // Someone else's identical conversation runs fresh, and leaves the thread kept.
    let found = threads.kept(&cfg, "bob", "m", Holds::Turn, &mut turn(next()));
    assert!(found.unwrap().is_none());
    let found = threads.kept(&cfg, "alice", "m", Holds::Turn, &mut turn(next()));
    assert_eq!(found.unwrap().map(|k| k.from), Some(2));
    assert_eq!(threads.len(), 0, "taken");
}

#[test]
fn nothing_continues_when_continuity_is_off_or_the_backend_holds_nothing() {
    let threads = Threads::new(Arc::default());
    let on = config(true);
    keep(&threads, &on, "alice", so_far());
    let off = config(false);
    let found = threads.kept(&off, "alice", "m", Holds::Turn, &mut turn(next()));
    assert!(found.unwrap().is_none());
    let found = threads.kept(&on, "alice", "m", Holds::Nothing, &mut turn(next()));
    assert!(found.unwrap().is_none());
    assert_eq!(threads.len(), 1);
}

#[test]
fn a_reference_must_find_its_thread_and_a_refused_one_is_put_back() {
    let (threads, cfg) = (Threads::new(Arc::default()), config(true));
    keep(&threads, &cfg, "alice", so_far());
    let by_reference = |messages: serde_json::Value| {
        let mut input = turn(messages);
        input.follows = Some("exe-1".into());
        input
    };
    let unknown = threads.kept(&cfg, "bob", "m", Holds::Turn, &mut by_reference(next()));
    assert!(matches!(
        unknown,
        Err(EngineError::Continuation(
            ContinuationError::ResponseNotFound
        ))
    ));
    // Only new user messages may follow a completed response; the thread stays kept.
    let answered = threads.kept(&cfg, "alice", "m", Holds::Turn, &mut by_reference(so_far()));
    assert!(matches!(answered, Err(EngineError::Backend(_))));
    assert_eq!(threads.len(), 1);
    let mut input = by_reference(serde_json::json!([{"role": "user", "content": "c"}]));
    let found = threads.kept(&cfg, "alice", "m", Holds::Turn, &mut input);
    assert_eq!(found.unwrap().map(|k| k.from), Some(0));
    // Its input now continues the kept conversation's digests.
    assert_eq!(input.message_digests.len(), 3);
}
