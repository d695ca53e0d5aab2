//! Notifications with replicas on PostgreSQL: every event delivered once though both
//! replicas lease from one outbox, and an event a dying replica was sending delivered by the
//! other once its lease lapses.

use std::time::Duration;

use serde_json::{json, Value};

use super::{opts, section, test_event, Receiver};
use crate::operations::budgets::priced;
use crate::operations::cluster::replica_config;
use crate::support::*;

/// Replica `id` on `db` whose endpoint `ops` is `r`; alice may spend $2 a day on `p-echo`
/// ($1 a turn).
async fn replica(id: &str, db: &str, r: &Receiver, extra: &str) -> Gateway {
    let (id, db, section) = (id.to_string(), db.to_string(), section(r, extra));
    Gateway::start_raw(opts(), move |o, dir| {
        let text = replica_config(o, dir, &id, &db, None, None) + &section;
        priced(text, &[("alice", "{ usd_per_day = 2.0 }")])
    })
    .await
}

/// The outbox as the console lists it, once no row is pending.
async fn settled(gw: &Gateway) -> Vec<Value> {
    wait_for("every notification delivered", async || {
        let (_, v) = get(gw, ROOT, "/v1/webhooks").await;
        let rows = v["deliveries"].as_array()?.clone();
        rows.iter()
            .all(|d| d["state"] == "delivered")
            .then_some(rows)
    })
    .await
}

#[tokio::test]
async fn two_replicas_on_postgres_deliver_each_event_once() {
    let Some(r) = Receiver::start("") else {
        return;
    };
    let db = postgres::database();
    let a = replica("a", &db, &r, "").await;
    let b = replica("b", &db, &r, "").await;

    for gw in [&a, &b, &a, &b] {
        assert_eq!(test_event(gw, ROOT).await.0, 202);
    }
    // A held turn on one replica, answered there.
    let req = tool_request("tool", "x");
    let (s, held) = a.chat(ALICE, &req).await;
    assert_eq!(s, 200, "{held}");
    let next = continuation(&req, &held, |_, _| json!("done"));
    assert_eq!(a.chat(ALICE, &next).await.0, 200);
    // Alice's $2 cap: $1 spent on each replica; the second write crosses 100 % of it.
    for gw in [&a, &b] {
        let (s, v) = gw
            .chat(ALICE, &json!({"model": "p-echo", "messages": [user("hi")]}))
            .await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(get(gw, ALICE, "/v1/usage").await.0, 200);
    }
    let threshold = r.wait(&a, "budget.threshold", 1).await;
    let data = &threshold[0]["body"]["data"];
    assert_eq!(
        (data["threshold"].as_u64(), data["cap"].as_str()),
        (Some(100), Some("usd_per_day")),
        "{data}"
    );
    r.wait(&a, "webhook.test", 4).await;
    r.wait(&a, "turn.requires_action", 1).await;

    // Some rows are written after their turn answered (an execution's end goes through the
    // journal): wait until the outbox, the endpoint and both replicas' counts agree.
    let (rows, seen) = wait_for_within(
        "every row delivered once",
        WAIT,
        || format!("seen: {:?}", r.seen()),
        async || {
            let mut sent = 0;
            let mut rows = Vec::new();
            for gw in [&a, &b] {
                let (_, v) = get(gw, ROOT, "/v1/webhooks").await;
                sent += v["endpoints"][0]["sent"].as_u64()?;
                rows = v["deliveries"].as_array()?.clone();
            }
            let seen = r.seen();
            let done = rows.iter().all(|d| d["state"] == "delivered");
            (done && seen.len() == rows.len() && sent == rows.len() as u64).then_some((rows, seen))
        },
    )
    .await;
    let ids: std::collections::HashSet<&str> =
        seen.iter().filter_map(|d| d["id"].as_str()).collect();
    assert_eq!(ids.len(), seen.len(), "an event delivered twice: {seen:?}");
    for row in &rows {
        assert_eq!(row["attempts"], 1, "{row}");
    }
}

#[tokio::test]
async fn an_event_a_dead_replica_was_sending_is_delivered_by_the_other() {
    // The first attempt never gets an answer; the replica making it dies.
    let Some(r) = Receiver::start("hang") else {
        return;
    };
    let db = postgres::database();
    let mut a = replica("a", &db, &r, "timeout_seconds = 1").await;
    let (s, queued) = test_event(&a, ROOT).await;
    assert_eq!(s, 202);
    r.wait(&a, "webhook.test", 1).await;
    a.signal("KILL");
    let _ = a.child.take().map(|mut c| c.wait());

    // The other replica finds the row once the dead one's lease lapses (timeout + 5 s).
    let b = replica("b", &db, &r, "timeout_seconds = 1").await;
    let got = wait_for_within(
        "the other replica's delivery",
        Duration::from_secs(60),
        || format!("seen: {:?}\nlog: {}", r.seen(), b.log()),
        async || {
            let got: Vec<Value> = r
                .seen()
                .into_iter()
                .filter(|d| d["type"] == "webhook.test")
                .collect();
            (got.len() >= 2).then_some(got)
        },
    )
    .await;
    assert_eq!(got[1]["id"], queued["id"]);
    assert_eq!(got[1]["answered"], "200");
    // The dead replica's attempt was never recorded: the row shows the one that succeeded.
    let rows = settled(&b).await;
    assert_eq!(
        (rows.len(), rows[0]["last_status"].as_u64()),
        (1, Some(200)),
        "{rows:?}"
    );
}
