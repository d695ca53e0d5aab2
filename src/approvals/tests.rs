use super::*;
use crate::backend::ApprovalKind;
use std::sync::atomic::{AtomicUsize, Ordering};

fn ask(answers: Arc<Mutex<Vec<bool>>>) -> ApprovalAsk {
    asking(ApprovalResponder::new(move |a| answers.lock().push(a)))
}

/// A command approval answered through `responder`.
fn asking(responder: ApprovalResponder) -> ApprovalAsk {
    ApprovalAsk {
        kind: ApprovalKind::Command,
        summary: json!({"command": "rm -rf build"}),
        action_digest: [7; 32],
        responder,
        tool_use: None,
    }
}

fn who(id: &str, approver: bool) -> Principal {
    Principal::new(id, approver)
}

#[tokio::test]
async fn decide_once_and_visibility() {
    let a = Approvals::new(Arc::new(Store::open_in_memory().await.unwrap()))
        .await
        .unwrap();
    let answers = Arc::new(Mutex::new(Vec::new()));
    let r = a
        .create(
            "alice",
            "exe-1",
            "m",
            ask(answers.clone()),
            Duration::from_secs(60),
            &Default::default(),
        )
        .await
        .unwrap();
    assert!(r.id.starts_with("apr-") && r.id.len() == 36);
    assert_eq!(a.pending_count(), 1);
    assert!(a.get(&r.id, &who("bob", false)).await.is_none());
    assert!(a.get(&r.id, &who("carol", true)).await.is_some());
    assert!(matches!(
        a.decide(&r.id, true, None, &who("bob", false)).await,
        Err(DecideError::NotFound)
    ));
    let settled = a
        .decide(&r.id, true, Some("fine"), &who("alice", false))
        .await
        .unwrap();
    assert_eq!(
        (settled.state.as_str(), settled.reason.as_deref()),
        ("approved", Some("human"))
    );
    assert_eq!(settled.decision_reason.as_deref(), Some("fine"));
    match a
        .decide(&r.id, false, Some("late"), &who("alice", false))
        .await
    {
        Err(DecideError::AlreadyDecided(r)) => assert_eq!(r.state, "approved"),
        other => panic!("{other:?}"),
    }
    assert_eq!(*answers.lock(), [true]);
}

#[tokio::test]
async fn cancel_and_expire_deny_once() {
    let a = Approvals::new(Arc::new(Store::open_in_memory().await.unwrap()))
        .await
        .unwrap();
    let answers = Arc::new(Mutex::new(Vec::new()));
    let r1 = a
        .create(
            "alice",
            "exe-1",
            "m",
            ask(answers.clone()),
            Duration::from_secs(60),
            &Default::default(),
        )
        .await
        .unwrap();
    let r2 = a
        .create(
            "alice",
            "exe-1",
            "m",
            ask(answers.clone()),
            Duration::from_secs(60),
            &Default::default(),
        )
        .await
        .unwrap();
    let r3 = a
        .create(
            "alice",
            "exe-2",
            "m",
            ask(answers.clone()),
            Duration::from_secs(0),
            &Default::default(),
        )
        .await
        .unwrap();
    assert_eq!(a.cancel_execution("exe-1").await, 2);
    assert_eq!(a.expire_due(Instant::now()).await, 1);
    assert_eq!(*answers.lock(), [false, false, false]);
    let me = who("alice", false);
    assert_eq!(
        a.get(&r1.id, &me).await.unwrap().reason.as_deref(),
        Some("cancelled")
    );
    assert_eq!(a.get(&r2.id, &me).await.unwrap().state, "denied");
    assert_eq!(
        a.get(&r3.id, &me).await.unwrap().reason.as_deref(),
        Some("expired")
    );
    assert_eq!(
        a.list(Some(ApprovalState::Denied), None, &me)
            .await
            .unwrap()
            .len(),
        3
    );
    assert_eq!(
        a.list(Some(ApprovalState::Denied), None, &who("bob", false))
            .await
            .unwrap()
            .len(),
        0
    );
}

#[tokio::test]
async fn restart_orphans_pending() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let id = {
        let a = Approvals::new(Arc::new(Store::open(&path).await.unwrap()))
            .await
            .unwrap();
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        let ask = ApprovalAsk {
            kind: ApprovalKind::FileChange,
            summary: json!({}),
            action_digest: [1; 32],
            responder: ApprovalResponder::new(move |_| {
                c.fetch_add(1, Ordering::SeqCst);
            }),
            tool_use: None,
        };
        let r = a
            .create(
                "alice",
                "exe-1",
                "m",
                ask,
                Duration::from_secs(60),
                &Default::default(),
            )
            .await
            .unwrap();
        std::mem::forget(a);
        r.id
    };
    let a = Approvals::new(Arc::new(Store::open(&path).await.unwrap()))
        .await
        .unwrap();
    let r = a.get(&id, &who("alice", false)).await.unwrap();
    assert_eq!(
        (r.state.as_str(), r.reason.as_deref()),
        ("denied", Some("orphaned"))
    );
    assert!(matches!(
        a.decide(&id, true, None, &who("alice", false)).await,
        Err(DecideError::AlreadyDecided(_))
    ));
}

/// A decision's reason is recorded; it reaches the backend only when the decider wrote it for
/// the model (`decide_telling`), and only with a denial.
#[tokio::test]
async fn only_a_told_denials_reason_reaches_the_backend() {
    let a = Approvals::new(Arc::new(Store::open_in_memory().await.unwrap()))
        .await
        .unwrap();
    let heard = Arc::new(Mutex::new(Vec::new()));
    let mut ids = Vec::new();
    for _ in 0..3 {
        let heard = heard.clone();
        let ask = asking(ApprovalResponder::with_reason(move |ok, why| {
            heard.lock().push((ok, why))
        }));
        let r = a
            .create(
                "alice",
                "exe-1",
                "m",
                ask,
                Duration::from_secs(60),
                &Default::default(),
            )
            .await
            .unwrap();
        ids.push(r.id);
    }
    let alice = who("alice", false);
    a.decide(&ids[0], false, Some("console"), &alice)
        .await
        .unwrap();
    a.decide_telling(&ids[1], false, Some("not now"), &alice, true)
        .await
        .unwrap();
    let r = a
        .decide_telling(&ids[2], true, Some("ok"), &alice, true)
        .await
        .unwrap();
    assert_eq!(r.decision_reason.as_deref(), Some("ok"));
    assert_eq!(
        *heard.lock(),
        [
            (false, None),
            (false, Some("not now".to_string())),
            (true, None)
        ]
    );
}
