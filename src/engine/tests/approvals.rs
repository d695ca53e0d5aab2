//! The approval policy on a running leg: a pending approval expires at its TTL, and the
//! principal's grant is re-derived from the current config at each side effect.

use super::*;

#[tokio::test(start_paused = true)]
async fn an_approval_past_its_ttl_is_denied_expired_in_paused_time() {
    let f = fixture().await;
    let mut leg = begin(&f, "approve").await;
    let Some(LegEvent::Approval(n)) = leg.events.recv().await else {
        panic!("no approval notice")
    };
    let id = n.approval_id.clone().expect("a pending approval");
    assert!(n.text().unwrap().contains(&id), "{n:?}");
    assert_eq!(f.engine.approvals().pending_count(), 1);
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert_eq!(f.engine.approvals().pending_count(), 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(f.engine.approvals().pending_count(), 0);
    assert_eq!(*f.spy.answers.lock(), ["approval=false"]);
    let r = f.engine.approvals().get(&id, &who("alice")).await.unwrap();
    assert_eq!(
        (r.state.as_str(), r.reason.as_deref()),
        ("denied", Some("expired"))
    );
}

#[tokio::test]
async fn a_side_effect_of_a_revoked_principal_is_denied_without_a_notice() {
    let f = fixture().await;
    let mut leg = begin(&f, "hang").await;
    // A reload removes alice's entry while her turn runs.
    let without = CONFIG
        .replace("[[clients]]\nid = \"alice\"\nkey_sha256 = \"KEY_A\"\n", "")
        .replace("KEY_B", &crate::auth::hash_key("sk-b"));
    let cfg = crate::config::from_toml_str(&without, f.dir.path()).unwrap();
    assert!(cfg.grant("alice", &[]).is_none());
    *f.engine.inner.config.write() = Arc::new(cfg);
    let tx = f.spy.senders.lock()[&*leg.execution_id].clone();
    tx.unbounded_send(ask(&f.spy)).unwrap();
    tx.unbounded_send(TurnEvent::Completed).unwrap();
    while let Some(ev) = leg.events.recv().await {
        assert!(
            !matches!(ev, LegEvent::Approval(_)),
            "a notice for a revoked principal"
        );
    }
    assert_eq!(*f.spy.answers.lock(), ["approval=false"]);
    assert_eq!(f.engine.approvals().pending_count(), 0);
}
