//! The per-execution spend cap on a running leg: the report that crosses it lets the leg go
//! on; the next model request's report stops the execution and interrupts its turn.

use super::*;
use crate::turn::Usage;

#[tokio::test]
async fn the_report_after_the_crossing_one_stops_the_leg() {
    let config = CONFIG
        .replace(
            "key_sha256 = \"KEY_A\"\n",
            "key_sha256 = \"KEY_A\"\nbudget = { usd_per_execution = 1.5 }\n",
        )
        .replace(
            "backend = \"fake\"\n",
            "backend = \"fake\"\nprice = { input_per_mtok = 100000.0 }\n",
        );
    let f = fixture_with(&config).await;
    let mut leg = begin(&f, "hang").await;
    let tx = f.spy.senders.lock()[&*leg.execution_id].clone();
    let meter = f.spy.meters.lock()[&*leg.execution_id].clone();
    // $1 a request, reported as a backend does: the meter first, then the event.
    let request = || {
        let u = Usage {
            prompt_tokens: 10,
            total_tokens: 10,
            ..Usage::default()
        };
        meter(u);
        tx.unbounded_send(TurnEvent::Usage(u)).unwrap();
    };
    // Each request streams some text after its report: once it is out, the leg has read
    // the report before it.
    for text in ["first", "crossed at $2, still going"] {
        request();
        tx.unbounded_send(TurnEvent::Delta(text.into())).unwrap();
        let Some(LegEvent::Delta(d)) = leg.events.recv().await else {
            panic!("the leg stopped before its next request")
        };
        assert_eq!(d, text);
    }
    request();
    let e = finish(leg).await.unwrap_err();
    assert_eq!(code(e), ErrorCode::BudgetExceeded);
    settle_idle(&f).await;
    assert_eq!(f.spy.interrupts.load(Ordering::SeqCst), 1);
    let text = f.engine.metrics().render(&Default::default(), false);
    assert!(text.contains("turnstile_executions_ended_total{reason=\"budget_exceeded\"} 1"));
    assert!(
        text.contains("turnstile_spend_usd_total{model=\"m\"} 3"),
        "{text}"
    );
    // A fresh turn is not gated by the per-execution cap.
    assert_eq!(finish(begin(&f, "hi").await).await.unwrap().0, "echo: hi");
}
