//! Connection hygiene on the public listener: a request head or body trickled in is dropped
//! at its read timeout without starving other clients, open connections are capped (more
//! wait in the listen backlog), and a shutdown drains open responses within its bound.

use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::*;

fn addr(gw: &Gateway) -> String {
    gw.url.trim_start_matches("http://").to_string()
}

/// Writes `head` and then one byte of `trickle` every 100 ms, until the peer closes.
/// Returns what the peer answered (empty when it just closed) once it did.
async fn trickle(addr: String, head: String, trickle: &'static [u8]) -> String {
    let mut s = TcpStream::connect(&addr).await.expect("connect");
    s.write_all(head.as_bytes()).await.expect("head");
    let (mut r, mut w) = s.into_split();
    let writer = tokio::spawn(async move {
        for b in trickle.iter().cycle() {
            if w.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut answer = Vec::new();
    // The server closes (or answers and closes) within a few read timeouts.
    let read = tokio::time::timeout(WAIT, r.read_to_end(&mut answer)).await;
    writer.abort();
    assert!(read.is_ok(), "a slow socket was never dropped");
    String::from_utf8_lossy(&answer).to_string()
}

fn slow_opts() -> Opts {
    Opts {
        server:
            "header_read_timeout_seconds = 1\nbody_read_timeout_seconds = 1\nmax_connections = 64",
        ..Opts::default()
    }
}

#[tokio::test]
async fn slow_loris_heads_and_bodies_are_dropped_without_starving_others() {
    let gw = Gateway::start_with(slow_opts()).await;
    let a = addr(&gw);
    // 24 sockets trickle a request head, 8 a body that never completes.
    let mut slow = Vec::new();
    for _ in 0..24 {
        let head = format!("POST /v1/chat/completions HTTP/1.1\r\nhost: {a}\r\n");
        slow.push(tokio::spawn(trickle(a.clone(), head, b"x-slow: yes\r\n")));
    }
    for _ in 0..8 {
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: {a}\r\nauthorization: Bearer {ALICE}\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{{"
        );
        slow.push(tokio::spawn(trickle(a.clone(), head, b" ")));
    }
    // Meanwhile real traffic is served.
    for i in 0..20 {
        let (s, v) = gw
            .chat(
                ALICE,
                &json!({"model": "echo", "messages": [user(&format!("m{i}"))]}),
            )
            .await;
        assert_eq!(s, 200, "{v}");
    }
    let answers = futures::future::join_all(slow).await;
    let answers: Vec<String> = answers.into_iter().map(|a| a.unwrap()).collect();
    // A trickled head is closed; a trickled body gets 408 request_timeout.
    assert!(answers[..24].iter().all(|a| !a.starts_with("HTTP/1.1 200")));
    for a in &answers[24..] {
        assert!(a.starts_with("HTTP/1.1 408"), "{a}");
        assert!(a.contains("request_timeout"), "{a}");
    }
    let (s, _) = gw
        .chat(
            ALICE,
            &json!({"model": "echo", "messages": [user("after")]}),
        )
        .await;
    assert_eq!(s, 200);
}

#[tokio::test]
async fn connections_over_the_cap_wait_until_one_closes() {
    let gw = Gateway::start_with(Opts {
        server: "header_read_timeout_seconds = 1\nmax_connections = 2",
        ..Opts::default()
    })
    .await;
    let a = addr(&gw);
    // Two idle sockets take both places.
    let mut idle = Vec::new();
    for _ in 0..2 {
        idle.push(TcpStream::connect(&a).await.unwrap());
    }
    // Give the server the chance to accept both before the real request queues behind them.
    let probe = gw.http.get(format!("{}/healthz", gw.url));
    let resp = probe
        .send()
        .await
        .expect("served once an idle socket is dropped");
    assert_eq!(resp.status(), 200);
    // The request could only be served after the header timeout dropped an idle socket.
    let mut closed = 0;
    for s in &mut idle {
        let mut buf = [0u8; 1];
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(1), s.read(&mut buf)).await {
            closed += 1;
        }
    }
    assert!(closed >= 1, "served while both places were taken");
}

#[tokio::test]
async fn shutdown_drains_open_responses_within_its_bound() {
    let mut gw = Gateway::start_with(Opts {
        server: "shutdown_drain_seconds = 1",
        ..Opts::default()
    })
    .await;
    // A request whose body is still arriving (its read timeout is 30 s): the shutdown
    // cannot finish it.
    let a = addr(&gw);
    let mut open = TcpStream::connect(&a).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {a}\r\nauthorization: Bearer {ALICE}\r\ncontent-length: 1000\r\n\r\n{{"
    );
    open.write_all(head.as_bytes()).await.unwrap();
    // Once a real request has been served after it, the slow one is being read.
    let (s, _) = gw
        .chat(ALICE, &json!({"model": "echo", "messages": [user("x")]}))
        .await;
    assert_eq!(s, 200);
    // `stop` waits 20 s before it kills: a clean exit means the 1 s drain bound ended it.
    let code = gw.stop().await;
    assert_eq!(code, Some(0), "{}", gw.log());
    assert!(
        gw.log().contains("outlived the shutdown drain"),
        "{}",
        gw.log()
    );
    drop(open);
}

/// Reads one response head (up to the blank line) from a raw socket.
async fn read_head(s: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match tokio::time::timeout(WAIT, s.read(&mut byte)).await {
            Ok(Ok(1)) => head.push(byte[0]),
            other => panic!("no response head: {other:?}, so far {head:?}"),
        }
    }
    String::from_utf8_lossy(&head).to_lowercase()
}

#[tokio::test]
async fn bodies_are_not_read_before_authentication() {
    let gw = Gateway::start().await;
    let a = addr(&gw);
    let max = gw.opts.max_body_bytes;
    for (route, credential, len) in [
        (
            "/v1/chat/completions",
            "authorization: Bearer sk-not-a-key\r\n",
            max,
        ),
        ("/v1/messages", "", max),
        // A decision's body is bounded at 64 KiB.
        (
            "/v1/approvals/apr-x/decision",
            "x-api-key: sk-wrong\r\n",
            65536,
        ),
    ] {
        // A declared body within the limit, none of it sent: the 401 comes from the head.
        let mut s = TcpStream::connect(&a).await.unwrap();
        let head = format!(
            "POST {route} HTTP/1.1\r\nhost: {a}\r\n{credential}content-type: application/json\r\ncontent-length: {len}\r\n\r\n"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        let answer = read_head(&mut s).await;
        assert!(answer.starts_with("http/1.1 401"), "{route}: {answer}");
        assert!(answer.contains("connection: close"), "{route}: {answer}");
        // The connection is closed, not kept for the body.
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(WAIT, s.read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "{route}: the connection stayed open");
    }
    // A declared length over the limit is 413 from the head, before the credential.
    let mut s = TcpStream::connect(&a).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {a}\r\ncontent-length: 999999999999\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    assert!(read_head(&mut s).await.starts_with("http/1.1 413"));
    // With a valid key the body is read as before.
    let (s, v) = gw
        .chat(ALICE, &json!({"model": "echo", "messages": [user("ok")]}))
        .await;
    assert_eq!(s, 200, "{v}");
}

#[tokio::test]
async fn one_principal_cannot_take_every_connection_with_streams() {
    // max_connections = 8: each client may hold max(1, 8 / 4) = 2 streams.
    let gw = Gateway::start_with(Opts {
        server: "max_connections = 8",
        ..Opts::default()
    })
    .await;
    let events = |key: &'static str| {
        gw.http
            .get(format!("{}/v1/approvals/events", gw.url))
            .bearer_auth(key)
            .send()
    };
    let first = events(ALICE).await.unwrap();
    assert_eq!(first.status(), 200);
    let leg = gw.hold_stream(ALICE).await;
    // A third stream of alice's, of either kind, is refused from its head.
    for over in [
        events(ALICE).await.unwrap(),
        gw.post(
            ALICE,
            &json!({"model": "echo", "stream": true, "messages": [user("x")]}),
        )
        .send()
        .await
        .unwrap(),
    ] {
        assert_eq!(over.status(), 429);
        assert_eq!(over.headers()["retry-after"], "1");
        assert_eq!(over.headers()["connection"], "close");
        let v: serde_json::Value = over.json().await.unwrap();
        assert_eq!(error_code(&v), "capacity_exhausted", "{v}");
    }
    // Meanwhile the gateway serves everyone else, and alice's answers that do not stream.
    let health = gw.http.get(format!("{}/healthz", gw.url)).send().await;
    assert_eq!(health.unwrap().status(), 200);
    let (s, _) = get(&gw, BOB, "/v1/models").await;
    assert_eq!(s, 200);
    let bob = events(BOB).await.unwrap();
    assert_eq!(bob.status(), 200);
    let (s, v) = gw
        .chat(ALICE, &json!({"model": "echo", "messages": [user("x")]}))
        .await;
    assert_eq!(s, 200, "{v}");
    // A closed stream gives its place back.
    drop(first);
    let again = wait_for("alice's place back", async || {
        let r = events(ALICE).await.unwrap();
        (r.status() == 200).then_some(r)
    })
    .await;
    drop((again, leg, bob));
}

#[tokio::test]
async fn a_client_entry_sets_its_own_stream_bound() {
    // The server allows one stream a client; bob's entry allows him two.
    let gw = Gateway::start_raw(
        Opts {
            server: "max_streams_per_client = 1",
            ..Opts::default()
        },
        |o, dir| config_text(o, dir).replace("id = \"bob\"\n", "id = \"bob\"\nmax_streams = 2\n"),
    )
    .await;
    let stream = json!({"model": "echo", "messages": [user("x")]});
    let alice = gw.hold_stream(ALICE).await;
    let (s, _, _) = gw.chat_stream(ALICE, &stream).await;
    assert_eq!(s, 429, "alice's second stream");
    let bob = gw.hold_stream(BOB).await;
    let bob_too = gw.hold_stream(BOB).await;
    let (s, _, _) = gw.chat_stream(BOB, &stream).await;
    assert_eq!(s, 429, "bob's third stream");
    drop((alice, bob, bob_too));
}
