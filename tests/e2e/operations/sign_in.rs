//! Sign-in for harnesses against a real OpenID provider (`tests/clients/oidc_idp.mjs`):
//! `turnstile login` completed by a scripted device approval, `turnstile token` printing the
//! gateway's own short-lived tokens, a change of groups at the provider ending an approver's
//! open event stream at the next refresh, a user disabled at the provider getting no new
//! token, sign-out, and a token accepted by every replica.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use super::approvals::{open_events, to_end};
use super::oidc::{whoami, Idp};
use crate::support::*;

pub(crate) const SECRET_ENV: &str = "TURNSTILE_TEST_IDP_SECRET";
const SECRET: &str = "turnstile-test-client-secret";

/// The provider as the gateway's sign-in, with developers and approvers groups.
pub(crate) fn sign_in_section(idp: &Idp, extra: &str) -> String {
    let keys = format!(
        "client_id = \"turnstile\"\nclient_secret_env = \"{SECRET_ENV}\"\nscopes = [\"openid\", \"offline_access\", \"groups\"]\n{extra}"
    );
    idp.section(&keys)
        + "\n[[groups]]\nname = \"developers\"\nmodels = [\"echo\", \"cmd-ask\"]\n\n[[groups]]\nname = \"approvers\"\nroles = [\"approver\"]\n"
}

pub(crate) fn opts() -> Opts {
    Opts {
        env: vec![(SECRET_ENV.into(), SECRET.into())],
        ..Opts::default()
    }
}

async fn gateway(idp: &Idp) -> Gateway {
    let section = sign_in_section(idp, "");
    Gateway::start_raw(opts(), move |o, d| config_text(o, d) + &section).await
}

/// The `turnstile` binary with the credentials file `creds`.
fn turnstile(creds: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_turnstile"));
    c.args(args)
        .env("TURNSTILE_CREDENTIALS", creds)
        .env_remove("TURNSTILE_URL");
    c
}

/// `turnstile login`, its code approved at the provider as `user`.
pub(crate) async fn login(idp: &Idp, gw: &Gateway, creds: &Path, user: &str) {
    let mut child = turnstile(creds, &["login", "--gateway", &gw.url])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("turnstile login");
    let mut err = BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    err.read_line(&mut line).expect("the login's first line");
    let code = line
        .trim()
        .rsplit(' ')
        .next()
        .filter(|_| line.starts_with("To sign in, open "))
        .unwrap_or_else(|| panic!("login said {line:?}"))
        .to_string();
    idp.call(
        reqwest::Method::POST,
        &format!("/approve?user={user}&code={code}"),
    )
    .await;
    let status = tokio::task::spawn_blocking(move || {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut rest);
        (child.wait().expect("login exit"), rest)
    });
    let (status, rest) = tokio::time::timeout(Duration::from_secs(60), status)
        .await
        .expect("login finished")
        .unwrap();
    assert!(status.success(), "login failed: {rest}");
    assert!(rest.contains("Signed in to"), "{rest}");
}

/// `turnstile token`: the token, or the error it printed.
pub(super) async fn token(creds: &Path) -> Result<String, String> {
    let mut c = turnstile(creds, &["token"]);
    let out = tokio::task::spawn_blocking(move || c.output().expect("turnstile token"))
        .await
        .unwrap();
    match out.status.success() {
        true => Ok(String::from_utf8(out.stdout).unwrap().trim().to_string()),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

/// The field `key` of the one gateway entry in the credentials file.
pub(crate) fn kept(creds: &Path, key: &str) -> String {
    let v: Value = serde_json::from_slice(&std::fs::read(creds).unwrap()).unwrap();
    let entries = v["gateways"].as_object().unwrap();
    entries.values().next().unwrap()[key]
        .as_str()
        .unwrap()
        .to_string()
}

fn refresh_token(creds: &Path) -> String {
    kept(creds, "refresh_token")
}

/// A refresh at the token endpoint: its status and answer (never cached).
pub(crate) async fn refresh(gw: &Gateway, refresh: &str) -> (u16, Value) {
    let r = gw
        .http
        .post(format!("{}/v1/auth/token", gw.url))
        .form(&[("grant_type", "refresh_token"), ("refresh_token", refresh)])
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    assert_eq!(r.headers()["cache-control"], "no-store");
    (status, r.json().await.unwrap())
}

fn creds_file(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("home").join("credentials.json")
}

#[tokio::test]
async fn login_then_token_signs_a_harness_in_and_group_changes_apply_at_the_refresh() {
    let Some(idp) = Idp::start() else {
        return;
    };
    let gw = gateway(&idp).await;
    let dir = tempfile::tempdir().unwrap();
    let creds = creds_file(&dir);
    login(&idp, &gw, &creds, "bob").await;

    // The file is the user's alone and holds the gateway's refresh token, not the provider's.
    let mode = std::fs::metadata(&creds).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let text = std::fs::read_to_string(&creds).unwrap();
    assert!(refresh_token(&creds).starts_with("tsr-"), "{text}");

    let t1 = token(&creds).await.unwrap();
    let (s, me) = whoami(&gw, &t1).await;
    assert_eq!(s, 200, "{me}\n{}", gw.log());
    assert_eq!(me["id"], format!("jwt:{}#bob", idp.issuer));
    assert_eq!(
        (me["approver"].clone(), me["groups"].clone()),
        (json!(true), json!(["developers", "approvers"]))
    );
    let (s, v) = gw
        .chat(&t1, &json!({"model": "echo", "messages": [user("hi")]}))
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        token(&creds).await.unwrap(),
        t1,
        "kept while young and taken"
    );
    let (_, sessions) = get(&gw, &t1, "/v1/auth/sessions").await;
    assert_eq!(sessions["data"].as_array().unwrap().len(), 1, "{sessions}");

    // Bob leaves the approvers at the provider: the next refresh raises the session's
    // generation, the older token stops verifying and his open stream ends.
    let events = open_events(&gw, &t1).await;
    idp.call(reqwest::Method::POST, "/groups?user=bob&group=developers")
        .await;
    let (s, t2) = refresh(&gw, &refresh_token(&creds)).await;
    assert_eq!(s, 200, "{t2}");
    assert!(
        t2.get("refresh_token").is_none(),
        "a refresh keeps the refresh token"
    );
    let t2 = t2["access_token"].as_str().unwrap().to_string();
    let seen = tokio::time::timeout(Duration::from_secs(30), to_end(events))
        .await
        .expect("the stream ended");
    assert!(!seen.contains("event: created"), "{seen}");
    assert_eq!(whoami(&gw, &t1).await.0, 401);
    let (_, me) = whoami(&gw, &t2).await;
    assert_eq!(
        (me["approver"].clone(), me["groups"].clone()),
        (json!(false), json!(["developers"]))
    );
    // `turnstile token` finds its kept token refused and refreshes.
    let t3 = token(&creds).await.unwrap();
    assert_ne!(t3, t1);
    assert_eq!(whoami(&gw, &t3).await.0, 200);

    // Sign-out: every token of the sign-in is refused, and no new one is had.
    let out = turnstile(&creds, &["logout"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(whoami(&gw, &t3).await.0, 401);
    let e = token(&creds).await.unwrap_err();
    assert!(e.contains("not signed in"), "{e}");
    let log = gw.log();
    for secret in [&t1, &t3, &SECRET.to_string()] {
        assert!(!log.contains(secret.as_str()), "a secret in the log");
    }
}

#[tokio::test]
async fn a_user_the_provider_disabled_gets_no_new_token_and_bad_requests_consume_nothing() {
    let Some(idp) = Idp::start() else {
        return;
    };
    let gw = gateway(&idp).await;
    let dir = tempfile::tempdir().unwrap();
    let creds = creds_file(&dir);
    login(&idp, &gw, &creds, "alice").await;
    let refresh_of = refresh_token(&creds);

    // Unknown or malformed grants: OAuth errors, nothing changed.
    let (s, v) = refresh(&gw, "tsr-unknown").await;
    assert_eq!(
        (s, v["error"].as_str()),
        (400, Some("invalid_grant")),
        "{v}"
    );
    let r = gw
        .http
        .post(format!("{}/v1/auth/token", gw.url))
        .json(&json!({"grant_type": "password"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        r.json::<Value>().await.unwrap()["error"],
        "unsupported_grant_type"
    );
    // Another principal's session is unknown to alice.
    let alice = token(&creds).await.unwrap();
    let (s, _) = get(&gw, &alice, "/v1/auth/sessions").await;
    assert_eq!(s, 200);
    let r = gw
        .http
        .delete(format!("{}/v1/auth/sessions/ses-0123", gw.url))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);

    idp.call(reqwest::Method::POST, "/disable?user=alice").await;
    let (s, v) = refresh(&gw, &refresh_of).await;
    assert_eq!(
        (s, v["error"].as_str()),
        (400, Some("invalid_grant")),
        "{v}"
    );
    // The provider ended it, so the gateway ended the sign-in: its token is refused too.
    assert_eq!(whoami(&gw, &alice).await.0, 401);
    let (s, _) = refresh(&gw, &refresh_of).await;
    assert_eq!(s, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_token_is_accepted_by_every_replica() {
    let Some(idp) = Idp::start() else {
        return;
    };
    let db = postgres::database();
    let mut replicas = Vec::new();
    for id in ["a", "b"] {
        let (id, db, section) = (id.to_string(), db.clone(), sign_in_section(&idp, ""));
        replicas.push(
            Gateway::start_raw(opts(), move |o, dir| {
                crate::operations::cluster::replica_config(o, dir, &id, &db, None, None) + &section
            })
            .await,
        );
    }
    let (a, b) = (&replicas[0], &replicas[1]);
    let dir = tempfile::tempdir().unwrap();
    let creds = creds_file(&dir);
    login(&idp, a, &creds, "bob").await;
    let t = token(&creds).await.unwrap();
    for gw in [a, b] {
        let (s, me) = whoami(gw, &t).await;
        assert_eq!(
            (s, me["id"].clone()),
            (200, json!(format!("jwt:{}#bob", idp.issuer))),
            "{me}"
        );
    }
    // Signed out on b: refused on a within the few seconds a replica trusts a session state.
    let (_, sessions) = get(b, &t, "/v1/auth/sessions").await;
    let id = sessions["data"][0]["id"].as_str().unwrap().to_string();
    let r = b
        .http
        .delete(format!("{}/v1/auth/sessions/{id}", b.url))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    wait_for_within(
        "the sign-out seen by a",
        Duration::from_secs(15),
        || a.log(),
        async || (whoami(a, &t).await.0 == 401).then_some(()),
    )
    .await;
}
