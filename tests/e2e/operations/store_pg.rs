//! The PostgreSQL store's pool across a database restart: the connections the restart closed
//! are replaced on the next call, with no restart of the gateway.

use serde_json::json;

use crate::support::postgres;
use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_database_restart_the_next_call_reconnects() {
    let pg = postgres::Server::start();
    let db = pg.database();
    let gw = Gateway::start_raw(Opts::default(), move |o, dir| {
        let mut s = config_text(o, dir).replace("[store]\npath = \"turnstile.db\"\n", "");
        s.push_str(&postgres::store_section(&db));
        s.push_str("pool_size = 2\n");
        s
    })
    .await;
    let req = tool_request("tool", "read the notes");
    let (status, resp) = gw.chat(ALICE, &req).await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(calls(&resp).len(), 1, "{resp}");

    pg.restart();

    // The first call after the restart: the store answers a write.
    let (status, ready) = get(&gw, ROOT, "/readyz").await;
    assert_eq!(
        (status, &ready["checks"]["store"]["status"]),
        (200, &json!("ok")),
        "{ready}\n{}",
        gw.log()
    );
    // The held turn is answered once, and a new one is recorded.
    let next = continuation(&req, &resp, |_, _| json!("notes: 42"));
    let (status, v) = gw.chat(ALICE, &next).await;
    assert_eq!(status, 200, "{v}");
    assert!(content(&v).contains("notes: 42"), "{v}");
    let (status, again) = gw.chat(ALICE, &next).await;
    assert_eq!(status, 409, "{again}");
    let (status, resp) = gw.chat(ALICE, &tool_request("tool", "once more")).await;
    assert_eq!(status, 200, "{resp}\n{}", gw.log());
    assert_eq!(calls(&resp).len(), 1, "{resp}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_journal_writer_records_every_start_and_end_in_order() {
    let db = postgres::database();
    let url = db.clone();
    let gw = Gateway::start_raw(Opts::default(), move |o, dir| {
        let mut s = config_text(o, dir).replace("[store]\npath = \"turnstile.db\"\n", "");
        s.push_str(&postgres::store_section(&url));
        s
    })
    .await;
    // A plain turn (started and ended in one batch) and a tool round trip (its end in a
    // later batch than its start).
    let (status, v) = gw
        .chat(ALICE, &json!({"model": "echo", "messages": [user("hi")]}))
        .await;
    assert_eq!(status, 200, "{v}");
    let req = tool_request("tool", "read the notes");
    let (status, resp) = gw.chat(ALICE, &req).await;
    assert_eq!(status, 200, "{resp}");
    let next = continuation(&req, &resp, |_, _| json!("notes: 42"));
    let (status, v) = gw.chat(ALICE, &next).await;
    assert_eq!(status, 200, "{v}");
    let live = "SELECT count(*) FROM executions WHERE state = 'live'";
    wait_for("both executions to be journaled as ended", async || {
        let ended = postgres::psql(&db, "SELECT count(*) FROM executions WHERE state = 'ended'");
        (ended == "2" && postgres::psql(&db, live) == "0").then_some(())
    })
    .await;
    let reasons = postgres::psql(
        &db,
        "SELECT string_agg(reason, ',' ORDER BY reason) FROM executions WHERE ended_at IS NOT NULL",
    );
    assert_eq!(reasons, "completed,completed");
    // Each execution's journal begins with its start and ends with its end.
    let events = postgres::psql(
        &db,
        "SELECT string_agg(event, ',' ORDER BY seq) FROM journal GROUP BY execution_id ORDER BY 1",
    );
    assert_eq!(
        events,
        "execution_started,execution_ended\n\
         execution_started,tokens_registered,tokens_settled,execution_ended",
        "{events}"
    );
}
