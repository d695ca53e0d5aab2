//! Unit tests of the registry: bounds, lookups, the atomic claim, expiry, tombstones.

use super::*;
use std::time::Duration;

struct Fake {
    principal: Arc<str>,
    execution_id: Arc<str>,
    model: Arc<str>,
    deadline: Instant,
    alive: bool,
    kept: usize,
}

impl Parked for Fake {
    fn principal(&self) -> &Arc<str> {
        &self.principal
    }
    fn execution_id(&self) -> &Arc<str> {
        &self.execution_id
    }
    fn model(&self) -> &Arc<str> {
        &self.model
    }
    fn surface(&self) -> crate::turn::SurfaceId {
        crate::turn::SurfaceId::Chat
    }
    fn deadline(&self) -> Instant {
        self.deadline
    }
    fn is_alive(&self) -> bool {
        self.alive
    }
    fn is_durable(&self) -> bool {
        false
    }
    fn kept_bytes(&self) -> usize {
        self.kept
    }
}

fn reg(max: usize, per: usize, ring: usize) -> Registry<Fake> {
    Registry::new(
        Limits {
            max_pending: max,
            max_pending_per_client: per,
            max_kept_bytes_per_client: usize::MAX,
            tombstones_per_client: ring,
        },
        [],
    )
}

fn digests() -> Digests {
    Digests {
        tools: [1; 32],
        tool_choice: [2; 32],
        prefix: [3; 32],
        echo: [4; 32],
    }
}

fn batch(principal: &str, tokens: Vec<[u8; 32]>, deadline: Instant) -> Batch<Fake> {
    Batch {
        tokens,
        digests: digests(),
        parked: Fake {
            principal: principal.into(),
            execution_id: "exe-1".into(),
            model: "m".into(),
            deadline,
            alive: true,
            kept: 0,
        },
    }
}

fn later() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

#[test]
fn kept_conversations_are_bounded_per_principal_in_bytes() {
    let r = Registry::new(
        Limits {
            max_pending: 10,
            max_pending_per_client: 10,
            max_kept_bytes_per_client: 100,
            tombstones_per_client: 10,
        },
        [],
    );
    let keeping = |p: &str, t: u8, kept: usize| {
        let mut b = batch(p, vec![[t; 32]], later());
        b.parked.kept = kept;
        b
    };
    let first = r.register(keeping("alice", 1, 60)).ok().unwrap();
    assert!(
        r.register(keeping("alice", 2, 41)).is_err(),
        "60 + 41 bytes over a budget of 100"
    );
    assert!(
        r.register(keeping("bob", 3, 100)).is_ok(),
        "bob has his own budget"
    );
    assert!(r.register(keeping("alice", 4, 40)).is_ok(), "60 + 40 fits");
    // Taking a batch gives its bytes back; putting it back (its place was never given up)
    // counts them again.
    let taken = r.take(first).unwrap();
    assert!(r.register(keeping("alice", 5, 60)).is_ok());
    assert_eq!(r.inner.lock().kept.get("alice"), Some(&100));
    r.reinstate(taken);
    assert_eq!(r.inner.lock().kept.get("alice"), Some(&160));
}

#[test]
fn lookup_is_principal_scoped() {
    let r = reg(10, 10, 10);
    assert!(r
        .register(batch("alice", vec![[7; 32], [8; 32]], later()))
        .is_ok());
    assert_eq!(r.pending_count(), 2);
    assert!(matches!(
        r.lookup("alice", &[[7; 32], [8; 32]]),
        Lookup::Pending(_)
    ));
    assert_eq!(r.lookup("bob", &[[7; 32], [8; 32]]), Lookup::NotFound);
    assert_eq!(r.lookup("alice", &[[9; 32]]), Lookup::NotFound);
    assert_eq!(r.lookup("alice", &[[7; 32]]), Lookup::Partial);
}

#[test]
fn claim_is_once_and_tombstones_are_principal_bound() {
    let r = reg(10, 10, 10);
    let id = r
        .register(batch("alice", vec![[7; 32]], later()))
        .ok()
        .unwrap();
    let Lookup::Pending(v) = r.lookup("alice", &[[7; 32]]) else {
        panic!()
    };
    assert_eq!(v.batch, id);
    assert!(r.settle(v.batch, Reason::Resolved).is_some());
    assert!(r.settle(v.batch, Reason::Resolved).is_none());
    assert_eq!(r.pending_count(), 0);
    assert_eq!(
        r.lookup("alice", &[[7; 32]]),
        Lookup::Settled(Reason::Resolved)
    );
    assert_eq!(r.lookup("bob", &[[7; 32]]), Lookup::NotFound);
}

#[test]
fn bounds_refuse_and_hand_the_batch_back() {
    let r = reg(3, 2, 10);
    assert!(r
        .register(batch("alice", vec![[1; 32], [2; 32]], later()))
        .is_ok());
    assert!(r.register(batch("alice", vec![[3; 32]], later())).is_err());
    assert!(r.register(batch("bob", vec![[4; 32]], later())).is_ok());
    assert!(r.register(batch("carol", vec![[5; 32]], later())).is_err());
    assert_eq!(r.pending_count(), 3);
}

#[test]
fn withdrawn_batches_leave_no_tombstone() {
    let r = reg(10, 10, 10);
    let id = r
        .register(batch("alice", vec![[1; 32]], later()))
        .ok()
        .unwrap();
    assert!(r.withdraw(id).is_some());
    assert_eq!((r.pending_count(), r.tombstone_count()), (0, 0));
    assert_eq!(r.next_deadline(), None);
    assert_eq!(r.lookup("alice", &[[1; 32]]), Lookup::NotFound);
}

#[test]
fn deadline_index_expires_in_order_and_ring_evicts() {
    let r = reg(10, 10, 2);
    let now = Instant::now();
    let soon = now + Duration::from_secs(1);
    assert!(r.register(batch("alice", vec![[2; 32]], later())).is_ok());
    assert!(r.register(batch("alice", vec![[1; 32]], soon)).is_ok());
    assert_eq!(r.next_deadline(), Some(soon));
    assert!(r.take_expired(now).is_empty());
    let expired = r.take_expired(soon);
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].tokens, [[1; 32]]);
    assert_eq!(
        r.lookup("alice", &[[1; 32]]),
        Lookup::Settled(Reason::Expired)
    );
    assert_eq!(r.next_deadline().map(|d| d > soon), Some(true));
    // Ring of 2: the oldest tombstone is evicted and reads as unknown.
    for id in r.held_batches() {
        r.settle(id, Reason::Lost);
    }
    let id = r
        .register(batch("alice", vec![[3; 32]], later()))
        .ok()
        .unwrap();
    let settled = r.settle(id, Reason::Resolved).unwrap();
    assert_eq!(settled.evicted, [[1; 32]]);
    assert_eq!(r.lookup("alice", &[[1; 32]]), Lookup::NotFound);
    assert_eq!(r.tombstone_count(), 2);
}

#[test]
fn dead_turns_are_taken_on_demand() {
    let r = reg(10, 10, 10);
    let mut b = batch("alice", vec![[1; 32]], later());
    b.parked.alive = false;
    assert!(r.register(b).is_ok());
    assert!(r.register(batch("alice", vec![[2; 32]], later())).is_ok());
    let dead = r.take_dead();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].reason, Reason::Lost);
    assert_eq!(r.pending_count(), 1);
}

#[test]
fn a_taken_batch_reads_resolved_until_committed_or_reinstated() {
    let r = reg(10, 10, 10);
    let deadline = later();
    let id = r
        .register(batch("alice", vec![[7; 32]], deadline))
        .ok()
        .unwrap();
    let b = r.take(id).expect("taken");
    assert!(r.take(id).is_none(), "exactly one taker");
    assert_eq!(
        r.lookup("alice", &[[7; 32]]),
        Lookup::Settled(Reason::Resolved)
    );
    assert_eq!(r.lookup("bob", &[[7; 32]]), Lookup::NotFound);
    assert_eq!(r.pending_count(), 0);
    // The forward failed: back as it was.
    r.reinstate(b);
    let Lookup::Pending(v) = r.lookup("alice", &[[7; 32]]) else {
        panic!("pending again")
    };
    assert_eq!(v.deadline, deadline);
    assert_eq!(r.next_deadline(), Some(deadline));
    // The forward succeeded: spent.
    let b = r.take(v.batch).expect("taken again");
    assert!(r.commit("alice", &b.tokens, Reason::Resolved).is_empty());
    assert_eq!(
        r.lookup("alice", &[[7; 32]]),
        Lookup::Settled(Reason::Resolved)
    );
    assert_eq!(r.tombstone_count(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_record_from_another_replica_goes_in_once_and_a_claim_lost_elsewhere_leaves_nothing() {
    let r = reg(10, 10, 10);
    let later = Instant::now() + Duration::from_secs(60);
    assert!(r.restore_absent(batch("alice", vec![[1; 32], [2; 32]], later)));
    // A racing request found the same record: it is not put in twice.
    assert!(!r.restore_absent(batch("alice", vec![[1; 32], [2; 32]], later)));
    assert_eq!(r.pending_count(), 2);
    let Lookup::Pending(v) = r.lookup("alice", &[[1; 32], [2; 32]]) else {
        panic!("not pending")
    };
    let taken = r.take(v.batch).expect("claim");
    // In flight, it reads as resolved; forgotten (another replica won), it is unknown here.
    assert_eq!(
        r.lookup("alice", &[[1; 32]]),
        Lookup::Settled(Reason::Resolved)
    );
    assert!(!r.restore_absent(batch("alice", vec![[1; 32]], later)));
    r.forget(&taken.tokens);
    assert_eq!(r.lookup("alice", &[[1; 32]]), Lookup::NotFound);
    assert_eq!((r.pending_count(), r.tombstone_count()), (0, 0));
}

#[test]
fn bytes_kept_beside_the_batches_share_their_bound() {
    let r = Registry::new(
        Limits {
            max_pending: 10,
            max_pending_per_client: 10,
            max_kept_bytes_per_client: 100,
            tombstones_per_client: 10,
        },
        [],
    );
    let mut keeping = batch("alice", vec![[1; 32]], later());
    keeping.parked.kept = 30;
    let id = r.register(keeping).ok().unwrap();
    assert!(r.rekeep("alice", 0, 60));
    assert!(!r.rekeep("alice", 60, 71), "30 + 71 > 100");
    assert!(r.rekeep("bob", 0, 100), "bob's own bound");
    assert!(r.withdraw(id).is_some());
    assert!(
        r.rekeep("alice", 60, 100),
        "grown in place once the batch went"
    );
    assert!(r.rekeep("alice", 100, 0));
    assert!(r.rekeep("alice", 0, 100), "released");
}
