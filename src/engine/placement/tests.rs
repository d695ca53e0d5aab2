//! Placement without a database server: replicas over one SQLite file, each with its own
//! store connection (its own owner id), as they would share a PostgreSQL database.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::continuation::Digests;
use crate::store::{StoreLocation, SuspensionRecord};
use crate::turn::SurfaceId;

const KEY: &str = "a-shared-key-of-the-cluster";

async fn store(dir: &tempfile::TempDir, owner: &str) -> Arc<Store> {
    let path = dir.path().join("turnstile.db");
    Arc::new(
        Store::connect(&StoreLocation::Sqlite(&path), owner)
            .await
            .unwrap(),
    )
}

/// A replica `id` over the shared file, with a lease of `lease`.
async fn replica(dir: &tempfile::TempDir, id: &str, lease: Duration) -> (Placement, Arc<Store>) {
    let store = store(dir, id).await;
    let approvals = Arc::new(Approvals::new(store.clone()).await.unwrap());
    let membership = Membership::with_key(id, lease, KEY.to_string());
    let p = Placement::new(Some(membership), store.clone(), approvals, Arc::default());
    (p, store)
}

async fn join(p: &Placement, url: &str) {
    let Placement::Replica(c) = p else { panic!() };
    c.join(url.into(), &TaskTracker::new(), &CancellationToken::new())
        .await
        .unwrap();
}

/// A held (agent) suspension of `principal` recorded by `store`'s replica.
async fn held(
    store: &Store,
    execution: &str,
    principal: &str,
    token: [u8; 32],
    ids: Option<&[String]>,
) {
    store
        .execution_started(execution, principal, "m")
        .await
        .unwrap();
    let digests = Digests {
        tools: [1; 32],
        tool_choice: [2; 32],
        prefix: [3; 32],
        echo: [4; 32],
    };
    let record = SuspensionRecord {
        execution_id: execution,
        principal,
        model: "m",
        surface: SurfaceId::Chat,
        deadline_ms: now_unix_ms() + 60_000,
        digests: &digests,
        tokens: &[token],
        ids,
        rounds: 1,
        created_at: 0,
        spend: 0,
    };
    store.suspension_recorded(&record).await.unwrap();
}

fn who(id: &str) -> Principal {
    Principal::new(id, false)
}

/// A continuation answering `token`, by reference (the owner checks the conversation) or not.
fn answering(token: [u8; 32], bound: bool) -> (TurnInput, Continuation) {
    let body = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
    let (input, _) = crate::surface::chat::parse(body.to_string().into(), Instant::now()).unwrap();
    let c = Continuation {
        assistant: 0,
        tokens: vec![token],
        results: vec![(token, 0)],
        prefix: [0; 32],
        echo: [0; 32],
        bound: bound.then(|| "exe-1".to_string()),
    };
    (input, c)
}

#[tokio::test]
async fn a_single_gateway_holds_everything_itself() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir, "").await;
    let approvals = Arc::new(Approvals::new(store.clone()).await.unwrap());
    let p = Placement::new(None, store, approvals, Arc::default());
    assert!(p.admits_fresh() && p.may_claim_held());
    assert_eq!(
        (p.replica_id(), p.lease_ready(), p.key()),
        (None, None, None)
    );
    assert!(!p.key_matches(KEY.as_bytes()));
    let (input, c) = answering([7; 32], false);
    let found = p.find(&who("alice"), &input, &c, false, 1 << 20).await;
    assert_eq!(found.unwrap_err(), ContinuationError::NotFound);
}

#[tokio::test(start_paused = true)]
async fn a_replica_vouches_for_its_turns_only_while_its_lease_is_renewed() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = replica(&dir, "a", Duration::from_secs(30)).await;
    assert!(!a.admits_fresh() && !a.may_claim_held(), "no lease yet");
    join(&a, "http://a").await;
    assert!(a.admits_fresh() && a.may_claim_held());
    assert_eq!(a.lease_ready(), Some(true));
    assert!(a.key_matches(KEY.as_bytes()) && !a.key_matches(b"another-key-of-the-cluster"));
    tokio::time::advance(Duration::from_secs(31)).await;
    assert!(
        !a.admits_fresh() && !a.may_claim_held(),
        "the lease lapsed unrenewed"
    );
    let Placement::Replica(c) = &a else { panic!() };
    let mut fenced = false;
    c.renew(async || fenced = true).await;
    assert!(!fenced, "its epoch is still its own");
    assert!(a.admits_fresh() && a.may_claim_held());
}

#[tokio::test]
async fn a_held_turn_of_a_live_replica_is_forwarded_after_the_checks_here() {
    let dir = tempfile::tempdir().unwrap();
    let (a, store_a) = replica(&dir, "a", Duration::from_secs(30)).await;
    let (b, _) = replica(&dir, "b", Duration::from_secs(30)).await;
    join(&a, "http://a").await;
    join(&b, "http://b").await;
    held(&store_a, "exe-1", "alice", [7; 32], None).await;
    let (input, by_ref) = answering([7; 32], true);
    let owner = Owner {
        replica_id: "a".into(),
        url: "http://a".into(),
    };
    let found = b.find(&who("alice"), &input, &by_ref, false, 1 << 20).await;
    assert_eq!(found.unwrap_err(), ContinuationError::Elsewhere(owner));
    // Another principal's token is unknown; a request the owner sent back is not sent on.
    let found = b.find(&who("bob"), &input, &by_ref, false, 1 << 20).await;
    assert_eq!(found.unwrap_err(), ContinuationError::NotFound);
    let found = b.find(&who("alice"), &input, &by_ref, true, 1 << 20).await;
    assert_eq!(found.unwrap_err(), ContinuationError::Settled(Reason::Lost));
    // The whole conversation again is checked here first: drift is refused before a hop.
    let (input, whole) = answering([7; 32], false);
    let found = b.find(&who("alice"), &input, &whole, false, 1 << 20).await;
    assert!(matches!(found, Err(ContinuationError::Mismatch(_))));
}

#[tokio::test]
async fn a_stateless_record_is_taken_in_by_any_replica() {
    let dir = tempfile::tempdir().unwrap();
    let (a, store_a) = replica(&dir, "a", Duration::from_secs(30)).await;
    let (b, _) = replica(&dir, "b", Duration::from_secs(30)).await;
    join(&a, "http://a").await;
    join(&b, "http://b").await;
    held(
        &store_a,
        "exe-2",
        "alice",
        [8; 32],
        Some(&["call_1".to_string()]),
    )
    .await;
    let (input, c) = answering([8; 32], false);
    let found = b
        .find(&who("alice"), &input, &c, false, 1 << 20)
        .await
        .unwrap();
    assert_eq!(
        (found.execution_id.as_str(), found.ids.as_slice()),
        ("exe-2", &["call_1".to_string()][..])
    );
    let found = b.find(&who("bob"), &input, &c, false, 1 << 20).await;
    assert_eq!(found.unwrap_err(), ContinuationError::NotFound);
}

#[tokio::test]
async fn a_lapsed_replica_is_settled_and_its_held_turns_answer_lost() {
    let dir = tempfile::tempdir().unwrap();
    // A lease of nothing lapses at once.
    let (a, store_a) = replica(&dir, "a", Duration::ZERO).await;
    let (b, _) = replica(&dir, "b", Duration::from_secs(30)).await;
    join(&a, "http://a").await;
    held(&store_a, "exe-3", "alice", [9; 32], None).await;
    join(&b, "http://b").await;
    let Placement::Replica(cluster) = &b else {
        panic!()
    };
    assert_eq!(
        cluster
            .metrics
            .cluster
            .replicas_settled
            .load(Ordering::Relaxed),
        1,
        "b's first survey settled a"
    );
    let (input, c) = answering([9; 32], true);
    let found = b.find(&who("alice"), &input, &c, false, 1 << 20).await;
    assert_eq!(found.unwrap_err(), ContinuationError::Settled(Reason::Lost));
    let found = b.find(&who("bob"), &input, &c, false, 1 << 20).await;
    assert_eq!(found.unwrap_err(), ContinuationError::NotFound);
}
