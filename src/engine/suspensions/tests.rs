//! The suspensions component alone, over a SQLite store: a batch registered and recorded,
//! claimed, put back, spent, refused over its bounds, and found again after a restart.

use std::time::Duration;

use super::*;
use crate::continuation::{Digests, Limits};
use crate::store::StoreLocation;
use crate::turn::SurfaceId;

const TOKEN: [u8; 32] = [5; 32];

async fn open(dir: &tempfile::TempDir, max_pending: usize) -> Suspensions {
    let path = dir.path().join("turnstile.db");
    let store = Arc::new(
        Store::connect(&StoreLocation::Sqlite(&path), "")
            .await
            .unwrap(),
    );
    let limits = Limits {
        max_pending,
        max_pending_per_client: max_pending,
        max_kept_bytes_per_client: 1 << 20,
        tombstones_per_client: 16,
    };
    let tombstones = store.tombstones().await.unwrap();
    let registry = Registry::new(
        limits,
        tombstones
            .into_iter()
            .map(|t| (t.digest, t.principal, Reason::parse(&t.reason))),
    );
    let journal = Journal::start(store.clone(), true);
    Suspensions::open(store, registry, journal).await.unwrap()
}

/// A stateless upstream's suspension of `alice` behind one token (its call id `call_1`).
fn durable(execution: &str) -> Batch<Suspended> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let meta = ExecutionMeta {
        id: execution.into(),
        principal: "alice".into(),
        membership: None,
        model: "m".into(),
        surface: SurfaceId::Chat,
        created: 0,
        spent: None,
        cap: None,
        approvals: None,
        trace: Default::default(),
    };
    Batch {
        tokens: vec![TOKEN],
        digests: Digests {
            tools: [1; 32],
            tool_choice: [2; 32],
            prefix: [3; 32],
            echo: [4; 32],
        },
        parked: Suspended {
            meta,
            holds: Holds::Nothing,
            deadline,
            rounds: 1,
            hold: Hold::Ids(vec!["call_1".into()]),
            backlog: Vec::new(),
            slot: None,
            history: None,
            suspended_at: 0,
            tools: Box::new(["f".into()]),
            held: Default::default(),
        },
    }
}

fn pending(s: &Suspensions) -> u64 {
    match s.lookup("alice", &[TOKEN]) {
        Lookup::Pending(v) => v.batch,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_claimed_batch_goes_back_as_it_was_until_it_is_spent() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir, 8).await;
    s.started_now(&durable("exe-1").parked.meta).await.unwrap();
    assert!(s.suspend(durable("exe-1")).await.is_ok());
    assert_eq!(s.lookup("bob", &[TOKEN]), Lookup::NotFound);
    let Taken::Claimed(head, parked) = s.take(pending(&s)).await.unwrap() else {
        panic!("a stateless batch is claimed")
    };
    // Taken: a racing second claim is answered as already resolved.
    assert_eq!(
        s.lookup("alice", &[TOKEN]),
        Lookup::Settled(Reason::Resolved)
    );
    // The forward failed: it goes back, claimable again.
    s.reinstate(head.join(parked)).await;
    let Taken::Claimed(head, _) = s.take(pending(&s)).await.unwrap() else {
        panic!()
    };
    assert_eq!(s.spend(&head, Reason::Resolved).await, Some(true));
    assert_eq!(
        s.lookup("alice", &[TOKEN]),
        Lookup::Settled(Reason::Resolved)
    );
    // After a restart the spent token is still answered as resolved.
    drop(s);
    let s = open(&dir, 8).await;
    assert_eq!(
        s.lookup("alice", &[TOKEN]),
        Lookup::Settled(Reason::Resolved)
    );
}

#[tokio::test]
async fn a_recorded_batch_is_found_again_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir, 8).await;
    s.started_now(&durable("exe-2").parked.meta).await.unwrap();
    assert!(s.suspend(durable("exe-2")).await.is_ok());
    drop(s);
    let s = open(&dir, 8).await;
    assert_eq!(s.counts().0, 1);
    let Taken::Claimed(head, _) = s.take(pending(&s)).await.unwrap() else {
        panic!()
    };
    assert_eq!(&*head.execution_id, "exe-2");
}

#[tokio::test]
async fn over_its_bounds_a_batch_is_refused_and_nothing_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir, 0).await;
    assert!(matches!(
        s.suspend(durable("exe-3")).await,
        Err(Refusal::Capacity(_))
    ));
    drop(s);
    let s = open(&dir, 8).await;
    assert_eq!(s.counts(), (0, 0, 0));
}
