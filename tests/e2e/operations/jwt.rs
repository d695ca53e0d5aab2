//! JWT principals and per-client limits against the real binary: the RFC 8725 attack matrix
//! (each case 401 with the bad-key body, nothing consumed or decided), principal identity
//! across token rotation and issuers, 429 `rate_limited` with `Retry-After`, continuations
//! that pass while over a limit, and limits changed by a SIGHUP reload.
//!
//! Issuer A verifies with a PEM copied next to the config (a relative `pem_file`); issuer B
//! with the committed JWKS (an absolute `jwks_file`). Tokens are signed here with the
//! committed test private keys in `fixtures/jwt/`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

use crate::support::*;

pub(crate) const ISS_A: &str = "https://idp-a.test";
const ISS_B: &str = "https://idp-b.test";
const AUD: &str = "turnstile";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/jwt")
        .join(name)
}

fn now() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

/// Signs `claims` with the fixture private key `key` (`issuer` or `other`).
fn sign(header: &Header, claims: &Value, key: &str) -> String {
    let pem = std::fs::read(fixture(&format!("{key}-private.pem"))).expect("fixture key");
    let key = EncodingKey::from_rsa_pem(&pem).expect("RSA private key");
    encode(header, claims, &key).expect("sign")
}

fn claims(iss: &str, sub: &str) -> Value {
    json!({"iss": iss, "sub": sub, "aud": AUD, "iat": now(), "exp": now() + 600,
           "jti": token_nonce()})
}

/// A different value per token, so two tokens of one (iss, sub) are different strings.
fn token_nonce() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!("n{}", N.fetch_add(1, Ordering::Relaxed))
}

/// A valid token of issuer A (PEM key).
pub(crate) fn token_a(sub: &str) -> String {
    sign(
        &Header::new(Algorithm::RS256),
        &claims(ISS_A, sub),
        "issuer",
    )
}

/// A valid token of issuer B (JWKS, kid `other-1`).
fn token_b(sub: &str) -> String {
    let mut h = Header::new(Algorithm::RS256);
    h.kid = Some("other-1".into());
    sign(&h, &claims(ISS_B, sub), "other")
}

/// The demo config plus both issuers and `extra` (client entries); the PEM is copied into
/// the gateway's folder so that the relative `pem_file` is resolved against it.
pub(crate) fn jwt_config(o: &Opts, dir: &Path, extra: &str) -> String {
    std::fs::create_dir_all(dir.join("keys")).expect("keys folder");
    std::fs::copy(
        fixture("issuer-public.pem"),
        dir.join("keys/issuer-public.pem"),
    )
    .expect("copy PEM");
    let mut s = config_text(o, dir);
    s.push_str(&format!(
        r#"
[[auth.jwt]]
issuer = "{ISS_A}"
audiences = ["{AUD}"]
algorithms = ["RS256"]
pem_file = "keys/issuer-public.pem"
models = ["*"]

[[auth.jwt]]
issuer = "{ISS_B}"
audiences = ["{AUD}"]
algorithms = ["RS256"]
jwks_file = "{jwks}"
models = ["*"]
{extra}
"#,
        jwks = fixture("other-jwks.json").display()
    ));
    s
}

async fn start(extra: &str) -> Gateway {
    let extra = extra.to_string();
    Gateway::start_raw(Opts::default(), move |o, dir| jwt_config(o, dir, &extra)).await
}

/// Status, `Retry-After` and the raw body of a request.
async fn send(req: reqwest::RequestBuilder) -> (u16, Option<String>, String) {
    let r = req.send().await.expect("send");
    let status = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap_or_default().to_string());
    (status, retry, r.text().await.expect("body"))
}

fn echo() -> Value {
    json!({"model": "echo", "messages": [user("hi")]})
}

async fn decide(gw: &Gateway, key: &str, id: &str, decision: &str) -> (u16, String) {
    let req = gw
        .http
        .post(format!("{}/v1/approvals/{id}/decision", gw.url))
        .bearer_auth(key)
        .json(&json!({ "decision": decision }));
    let (s, _, body) = send(req).await;
    (s, body)
}

/// Starts a streaming `cmd-ask` turn (it waits on an approval) in the background.
fn start_ask(gw: &Gateway, key: &str) -> tokio::task::JoinHandle<u16> {
    let req = gw.post(
        key,
        &json!({"model": "cmd-ask", "stream": true, "messages": [user("go")]}),
    );
    tokio::spawn(async move {
        let r = req.send().await.expect("send");
        let status = r.status().as_u16();
        let _ = r.text().await;
        status
    })
}

/// Waits (bounded) for `key`'s one pending approval; returns its id.
async fn pending_id(gw: &Gateway, key: &str) -> String {
    let approval = pending(gw, key).await;
    approval["id"].as_str().expect("approval id").to_string()
}

/// The attack matrix (RFC 8725; adversarial cases X1): every token is refused with exactly the
/// body of a bad API key, on a fresh turn, on a continuation of a held turn and on a pending
/// approval's decision, and none of them consumes the turn or decides the approval.
#[tokio::test]
async fn attack_matrix_is_the_bad_key_401_and_consumes_nothing() {
    let gw = start("").await;
    let (s, _, bad_key_body) = send(gw.post("sk-not-a-key", &echo())).await;
    assert_eq!(s, 401);

    // A held turn and a pending approval of the (iss A, "victim") principal.
    let victim = token_a("victim");
    let req = tool_request("tool", "read /tmp/x");
    let (s, resp) = gw.chat(&victim, &req).await;
    assert_eq!(s, 200, "{resp}");
    let next = continuation(&req, &resp, |_, _| json!("R"));
    let ask = start_ask(&gw, &victim);
    let approval = pending_id(&gw, &victim).await;

    let public_pem = std::fs::read(fixture("issuer-public.pem")).unwrap();
    let victim_claims = || claims(ISS_A, "victim");
    let b64 = |v: &[u8]| -> String {
        // base64url without padding, to forge a token by hand.
        const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in v.chunks(3) {
            let b = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..=chunk.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            }
        }
        out
    };
    let with = |f: &dyn Fn(&mut Value)| {
        let mut c = victim_claims();
        f(&mut c);
        sign(&Header::new(Algorithm::RS256), &c, "issuer")
    };
    let cases: Vec<(&str, String)> = vec![
        ("alg:none", {
            let h = b64(br#"{"alg":"none","typ":"JWT"}"#);
            format!("{h}.{}.", b64(victim_claims().to_string().as_bytes()))
        }),
        (
            "HS256 signed with the RSA public key",
            encode(
                &Header::new(Algorithm::HS256),
                &victim_claims(),
                &EncodingKey::from_secret(&public_pem).unwrap(),
            )
            .unwrap(),
        ),
        (
            "expired beyond the 30 s leeway",
            with(&|c| c["exp"] = json!(now() - 120)),
        ),
        (
            "nbf in the future",
            with(&|c| c["nbf"] = json!(now() + 120)),
        ),
        ("wrong aud", with(&|c| c["aud"] = json!("someone-else"))),
        (
            "wrong iss (not configured)",
            with(&|c| c["iss"] = json!("https://evil.test")),
        ),
        (
            "iss of issuer B with issuer A's key",
            with(&|c| c["iss"] = json!(ISS_B)),
        ),
        (
            "bad signature (an unrelated key)",
            sign(&Header::new(Algorithm::RS256), &victim_claims(), "other"),
        ),
        ("unknown kid", {
            let mut h = Header::new(Algorithm::RS256);
            h.kid = Some("../../etc/passwd".into());
            let mut c = victim_claims();
            c["iss"] = json!(ISS_B);
            sign(&h, &c, "other")
        }),
        (
            "missing exp",
            with(&|c| {
                c.as_object_mut().unwrap().remove("exp");
            }),
        ),
        ("alg outside the allow-list (RS512)", {
            sign(&Header::new(Algorithm::RS512), &victim_claims(), "issuer")
        }),
    ];
    for (name, token) in &cases {
        for (what, (status, body)) in [
            ("fresh", {
                let (s, _, b) = send(gw.post(token, &echo())).await;
                (s, b)
            }),
            ("continuation", {
                let (s, _, b) = send(gw.post(token, &next)).await;
                (s, b)
            }),
            ("decision", decide(&gw, token, &approval, "approve").await),
        ] {
            assert_eq!(status, 401, "case `{name}` ({what}): {body}");
            assert_eq!(
                body, bad_key_body,
                "case `{name}` ({what}): the body must be the bad-key body"
            );
        }
    }
    assert!(
        gw.spy_events("tool_result").is_empty(),
        "nothing was resumed"
    );
    assert!(
        gw.spy_events("approval_decision").is_empty(),
        "nothing was decided"
    );
    // The rightful owner still has both.
    let (s, done) = gw.chat(&victim, &next).await;
    assert_eq!(
        (s.as_u16(), content(&done)),
        (200, "Tool result: R".to_string())
    );
    assert_eq!(decide(&gw, &victim, &approval, "deny").await.0, 200);
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(15), ask)
            .await
            .unwrap()
            .unwrap(),
        200
    );
}

/// X2: a rotated token of the same (iss, sub) is the same principal and resumes its turn.
#[tokio::test]
async fn rotated_token_resumes_the_held_turn() {
    let gw = start("").await;
    let first = token_a("dev-1");
    let req = tool_request("tool", "read /etc/hostname");
    let (s, resp) = gw.chat(&first, &req).await;
    assert_eq!(s, 200, "{resp}");
    assert_eq!(calls(&resp).len(), 1);

    let rotated = token_a("dev-1");
    assert_ne!(first, rotated, "a freshly signed token");
    let next = continuation(&req, &resp, |_, _| json!("host-7"));
    let (s, done) = gw.chat(&rotated, &next).await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(content(&done), "Tool result: host-7");
    assert_eq!(done["id"], resp["id"], "the same execution");
    assert_eq!(gw.spy_events("turn_start").len(), 1);
}

/// A JWT as an Anthropic client sends its key (`x-api-key`) is the same principal as its
/// bearer form: a Messages turn held with one resumes with the other; a forged one is 401.
#[tokio::test]
async fn a_jwt_in_x_api_key_is_the_same_principal() {
    use crate::support::messages::{answer, code, create, request, tool_uses};
    let gw = start("").await;
    let req = request("tool", "read /etc/hostname");
    let (s, resp) = create(&gw, &token_a("dev-2"), &req).await;
    assert_eq!(s, 200, "{resp}");
    let next = answer(&req, &resp, |_, _| json!("host-9"), &[]);
    assert_eq!(create(&gw, &token_a("dev-3"), &next).await.0, 404);
    let r = gw
        .http
        .post(format!("{}/v1/messages", gw.url))
        .bearer_auth(token_a("dev-2"))
        .json(&next)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let done: Value = r.json().await.unwrap();
    assert_eq!(done["content"][0]["text"], "Tool result: host-9", "{done}");
    assert!(tool_uses(&done).is_empty());
    let mut forged = token_a("dev-2");
    forged.pop();
    let (s, v) = create(&gw, &forged, &req).await;
    assert_eq!((s, code(&v)), (401, "invalid_api_key".into()));
}

/// X2: the same `sub` under another issuer is another principal: 404 on the continuation and
/// on the approval (show and decide), and the owner keeps both.
#[tokio::test]
async fn same_sub_under_another_issuer_is_another_principal() {
    let gw = start("").await;
    let owner = token_a("shared");
    let stranger = token_b("shared");
    let req = tool_request("tool", "read /tmp/y");
    let (s, resp) = gw.chat(&owner, &req).await;
    assert_eq!(s, 200, "{resp}");
    let next = continuation(&req, &resp, |_, _| json!("mine"));
    let ask = start_ask(&gw, &owner);
    let approval = pending_id(&gw, &owner).await;

    // The stranger is authenticated (its own issuer's token) but owns nothing here.
    assert_eq!(gw.chat(&stranger, &echo()).await.0, 200);
    let (s, v) = gw.chat(&stranger, &next).await;
    assert_eq!(
        (s.as_u16(), error_code(&v).as_str()),
        (404, "continuation_not_found"),
        "{v}"
    );
    let (s, body) = get_text(&gw, &stranger, &format!("/v1/approvals/{approval}")).await;
    assert_eq!(s, 404, "{body}");
    assert!(body.contains("approval_not_found"), "{body}");
    let (s, body) = decide(&gw, &stranger, &approval, "approve").await;
    assert_eq!(s, 404, "{body}");
    let (s, body) = get_text(&gw, &stranger, "/v1/approvals?state=pending").await;
    assert_eq!(s, 200);
    let listed: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(listed["data"], json!([]), "{body}");
    assert!(gw.spy_events("approval_decision").is_empty());

    let (s, done) = gw.chat(&owner, &next).await;
    assert_eq!(
        (s.as_u16(), content(&done)),
        (200, "Tool result: mine".to_string())
    );
    let (s, shown) = get_text(&gw, &owner, &format!("/v1/approvals/{approval}")).await;
    assert_eq!(s, 200, "{shown}");
    let shown: Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["client"], format!("jwt:{ISS_A}#shared"));
    assert_eq!(decide(&gw, &owner, &approval, "approve").await.0, 200);
    let _ = tokio::time::timeout(Duration::from_secs(15), ask).await;
}

/// A client entry naming a JWT subject, limited to 60 requests a minute with a burst of 2.
const LIMITED: &str = r#"
[[clients]]
id = "limited"
jwt = { issuer = "https://idp-a.test", subject = "limited-1" }
requests_per_minute = 60
burst = 2
"#;

/// Spends the principal's rate with cheap requests (an unknown model: admission comes before
/// the model lookup, so each costs a request and answers 404 at once) until one is refused;
/// returns the refusal's `Retry-After` and body. Cheap requests keep the test independent of
/// how fast the machine runs turns (a slow turn would let the bucket refill).
async fn exhaust(gw: &Gateway, key: &str) -> (u64, Value) {
    let nope = json!({"model": "nope", "messages": [user("x")]});
    for _ in 0..50 {
        let (s, retry, body) = send(gw.post(key, &nope)).await;
        if s == 429 {
            let wait = retry.expect("Retry-After").parse().expect("seconds");
            return (wait, serde_json::from_str(&body).expect("json"));
        }
        assert_eq!(s, 404, "{body}");
    }
    panic!("50 requests never hit a limit of 60 a minute with a burst of 2");
}

/// Over the rate: 429 `rate_limited` with `Retry-After`; after that wait, the retry passes.
#[tokio::test]
async fn rate_limit_is_429_with_retry_after_and_the_retry_passes() {
    let gw = start(LIMITED).await;
    let key = token_a("limited-1");
    let (wait, v) = exhaust(&gw, &key).await;
    assert_eq!(error_code(&v), "rate_limited", "{v}");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert!((1..=2).contains(&wait), "Retry-After {wait}");
    // A turn is refused the same way, before anything runs.
    let (s, retry, body) = send(gw.post(&key, &echo())).await;
    assert_eq!(s, 429, "{body}");
    let wait: u64 = retry.expect("Retry-After").parse().expect("seconds");
    assert!((1..=2).contains(&wait), "Retry-After {wait}");
    assert!(
        gw.thread_starts().is_empty(),
        "no backend thread was started"
    );
    // Keyed per principal: another subject of the same issuer is not limited.
    assert_eq!(gw.chat(&token_a("someone-else"), &echo()).await.0, 200);

    tokio::time::sleep(Duration::from_secs(wait)).await;
    let (s, _, body) = send(gw.post(&key, &echo())).await;
    assert_eq!(s, 200, "after Retry-After: {body}");
}

/// A continuation is never rate-limited: refusing it would strand the held turn.
#[tokio::test]
async fn continuation_passes_while_over_the_request_limit() {
    let gw = start(LIMITED).await;
    let key = token_a("limited-1");
    let req = tool_request("tool", "read /a");
    let (s, resp) = gw.chat(&key, &req).await;
    assert_eq!(s, 200, "{resp}");
    exhaust(&gw, &key).await;
    let (s, _, body) = send(gw.post(&key, &echo())).await;
    assert_eq!(s, 429, "over the limit now: {body}");

    let next = continuation(&req, &resp, |_, _| json!("still here"));
    let (s, done) = gw.chat(&key, &next).await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(content(&done), "Tool result: still here");
}

/// Waits (bounded) until the log shows `n` successful reloads.
async fn reloaded(gw: &Gateway, n: usize) {
    wait_until("config reloaded", || {
        gw.log().matches("config reloaded").count() >= n
    })
    .await;
}

/// SIGHUP applies a client's new limits at once: a tight rate is loosened, then a suspended
/// turn plus `max_suspended = 1` refuses fresh turns while its continuation still passes, and
/// `concurrent_executions` counts running and suspended executions alike.
#[tokio::test]
async fn sighup_reload_changes_limits_at_once() {
    let client = |limits: &str| {
        format!(
            "\n[[clients]]\nid = \"reloaded\"\njwt = {{ issuer = \"{ISS_A}\", subject = \"r-1\" }}\n{limits}\n"
        )
    };
    let gw = start(&client("requests_per_minute = 1\nburst = 1")).await;
    let key = token_a("r-1");
    assert_eq!(gw.chat(&key, &echo()).await.0, 200);
    let (s, retry, _) = send(gw.post(&key, &echo())).await;
    assert_eq!(s, 429);
    assert!(retry.unwrap().parse::<u64>().unwrap() > 2, "about a minute");

    let rewrite = |limits: &str| {
        let text = jwt_config(&gw.opts, gw.dir.path(), &client(limits));
        std::fs::write(gw.config_path(), text).unwrap();
        gw.signal("HUP");
    };
    rewrite("requests_per_minute = 600\nburst = 10");
    reloaded(&gw, 1).await;
    assert_eq!(
        gw.chat(&key, &echo()).await.0,
        200,
        "the looser rate applies at once"
    );

    let req = tool_request("tool", "read /b");
    let (s, resp) = gw.chat(&key, &req).await;
    assert_eq!(s, 200, "{resp}");
    rewrite("max_suspended = 1");
    reloaded(&gw, 2).await;
    let (s, retry, body) = send(gw.post(&key, &echo())).await;
    assert_eq!(s, 429, "one suspended execution is the limit: {body}");
    assert!(body.contains("max_suspended"), "{body}");
    assert_eq!(retry.as_deref(), Some("1"));

    rewrite("concurrent_executions = 1");
    reloaded(&gw, 3).await;
    let (s, _, body) = send(gw.post(&key, &echo())).await;
    assert_eq!(s, 429, "the suspended execution is live: {body}");
    assert!(body.contains("concurrent_executions"), "{body}");

    let next = continuation(&req, &resp, |_, _| json!("ok"));
    let (s, done) = gw.chat(&key, &next).await;
    assert_eq!(s, 200, "the continuation passes: {done}");
    // Once the execution has ended (just after its last byte), its place is free again.
    let within = Duration::from_secs(5);
    wait_for_within("the slot to be freed", within, String::new, async || {
        let (s, _, body) = send(gw.post(&key, &echo())).await;
        if s == 200 {
            return Some(());
        }
        assert_eq!(s, 429, "{body}");
        None
    })
    .await;
}

/// An approver reads one JWT principal's usage through the CLI: its id (`jwt:<iss>#<sub>`)
/// travels percent-encoded in the query string and is decoded as such.
#[tokio::test]
async fn the_usage_cli_selects_a_jwt_principal() {
    let gw = start("").await;
    let req = json!({"model": "echo", "messages": [user("count me")]});
    for (token, n) in [(token_a("usage-sub"), 2), (token_a("other-sub"), 1)] {
        for _ in 0..n {
            let (s, _, body) = send(gw.post(&token, &req)).await;
            assert_eq!(s, 200, "{body}");
        }
    }
    let id = format!("jwt:{ISS_A}#usage-sub");
    let run = |client: String| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_turnstile"))
            .args([
                "usage", "--url", &gw.url, "--key", ROOT, "--client", &client,
            ])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str::<Value>(&stdout).unwrap()
    };
    let v = wait_for("the usage flushed", async || {
        let v = run(id.clone());
        (v["total"]["requests"].as_u64() >= Some(2)).then_some(v)
    })
    .await;
    let clients: Vec<&Value> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["client"])
        .collect();
    assert!(
        !clients.is_empty() && clients.iter().all(|c| **c == json!(id)),
        "{v}"
    );
    assert_eq!(v["total"]["requests"], 2, "{v}");
}
