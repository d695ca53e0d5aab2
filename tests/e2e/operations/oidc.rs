//! `[[auth.oidc]]` against a real OpenID provider on loopback (`tests/clients/oidc_idp.mjs`:
//! npm `oidc-provider` over HTTPS with a test CA, users logging in by the device flow): keys
//! found by discovery, a rotation picked up without a restart, a flood of unknown `kid`s
//! costing a bounded number of fetches, and the provider down (kept keys accepted until
//! `max_key_age_seconds`, then refused).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::support::node::{clients_dir, node_with};
use crate::support::tls::TestCa;
use crate::support::*;

/// The provider process, its issuer URL and its control listener.
pub(crate) struct Idp {
    child: Child,
    pub issuer: String,
    control: String,
    ca_file: std::path::PathBuf,
    _dir: tempfile::TempDir,
    http: reqwest::Client,
}

impl Idp {
    /// None when node or `oidc-provider` is missing outside CI (a loud skip).
    pub fn start() -> Option<Idp> {
        let node = node_with("oidc-provider", "OpenID provider test")?;
        let ca = TestCa::new("idp");
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key, ca_file) = (
            dir.path().join("idp.crt"),
            dir.path().join("idp.key"),
            dir.path().join("ca.pem"),
        );
        std::fs::write(&cert, &ca.cert_pem).expect("cert");
        std::fs::write(&key, &ca.key_pem).expect("key");
        std::fs::write(&ca_file, &ca.ca_pem).expect("ca");
        let mut child = Command::new(node)
            .arg(clients_dir().join("oidc_idp.mjs"))
            .current_dir(clients_dir())
            .env("IDP_CERT", &cert)
            .env("IDP_KEY", &key)
            .env("IDP_CA", &ca_file)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the provider");
        let mut line = String::new();
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        out.read_line(&mut line).expect("provider line");
        // The provider's notices go on stdout: keep reading them, so it never writes to a
        // closed pipe.
        std::thread::spawn(move || for _ in out.lines().map_while(Result::ok) {});
        let mut ports = line
            .trim()
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("provider said {line:?}"))
            .split(' ');
        let (port, control) = (ports.next().expect("port"), ports.next().expect("control"));
        Some(Idp {
            child,
            issuer: format!("https://127.0.0.1:{port}"),
            control: format!("http://127.0.0.1:{control}"),
            ca_file,
            _dir: dir,
            // Bounded: a provider that stops answering fails the test instead of hanging it.
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .expect("client"),
        })
    }

    pub async fn call(&self, method: reqwest::Method, path: &str) -> Value {
        let r = self
            .http
            .request(method, format!("{}{path}", self.control))
            .send()
            .await
            .expect("control");
        assert!(r.status().is_success(), "{path}: {}", r.status());
        r.json().await.expect("control json")
    }

    /// An ID token of `user`, by a device-flow login.
    pub async fn token(&self, user: &str) -> String {
        let v = self
            .call(reqwest::Method::GET, &format!("/token?user={user}"))
            .await;
        v["id_token"].as_str().expect("id_token").to_string()
    }

    async fn forged(&self, kid: &str) -> String {
        let v = self
            .call(reqwest::Method::GET, &format!("/forged?kid={kid}"))
            .await;
        v["token"].as_str().expect("token").to_string()
    }

    async fn jwks_fetches(&self) -> u64 {
        self.call(reqwest::Method::GET, "/stats").await["jwks"]
            .as_u64()
            .expect("jwks count")
    }

    /// The `[[auth.oidc]]` entry trusting this provider, with `extra` keys.
    pub fn section(&self, extra: &str) -> String {
        format!(
            "\n[[auth.oidc]]\nissuer = \"{}\"\naudiences = [\"turnstile\"]\nalgorithms = [\"ES256\"]\nca_file = \"{}\"\n{extra}\n",
            self.issuer,
            self.ca_file.display()
        )
    }

    /// A gateway trusting this provider (`extra`: more keys of its entry).
    async fn gateway(&self, extra: &str) -> Gateway {
        let section = self.section(&format!("models = [\"*\"]\n{extra}"));
        Gateway::start_raw(Opts::default(), move |o, d| config_text(o, d) + &section).await
    }
}

impl Drop for Idp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) async fn whoami(gw: &Gateway, token: &str) -> (u16, Value) {
    let r = gw
        .http
        .get(format!("{}/v1/whoami", gw.url))
        .bearer_auth(token)
        .send()
        .await
        .expect("whoami");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn keys_found_by_discovery_verify_the_providers_tokens() {
    let Some(idp) = Idp::start() else {
        return;
    };
    let gw = idp.gateway("").await;
    let token = idp.token("alice").await;
    let (s, me) = whoami(&gw, &token).await;
    assert_eq!(s, 200, "{me}\n{}", gw.log());
    assert_eq!(me["id"], format!("jwt:{}#alice", idp.issuer));
    // A token naming a key the provider never had, and one for another audience: refused.
    assert_eq!(whoami(&gw, &idp.forged("k-unknown").await).await.0, 401);
    let log = gw.log();
    assert!(!log.contains(&token), "a token in the log");
}

#[tokio::test]
async fn a_key_rotated_at_the_provider_is_picked_up_without_a_restart() {
    let Some(idp) = Idp::start() else {
        return;
    };
    let gw = idp.gateway("").await;
    assert_eq!(whoami(&gw, &idp.token("alice").await).await.0, 200);
    let before = idp.jwks_fetches().await;
    let rotated = idp.call(reqwest::Method::POST, "/rotate").await;
    let token = idp.token("bob").await;
    let kid = jsonwebtoken::decode_header(&token).expect("header").kid;
    assert_eq!(
        kid.as_deref(),
        rotated["kid"].as_str(),
        "signed with the new key"
    );
    // Its first use finds the new key by one fetch.
    let (s, me) = whoami(&gw, &token).await;
    assert_eq!(s, 200, "{me}\n{}", gw.log());
    assert_eq!(me["id"], format!("jwt:{}#bob", idp.issuer));
    assert_eq!(idp.jwks_fetches().await, before + 1);
}

#[tokio::test]
async fn a_flood_of_unknown_kids_costs_a_bounded_number_of_fetches() {
    let Some(idp) = Idp::start() else {
        return;
    };
    let gw = idp.gateway("").await;
    assert_eq!(whoami(&gw, &idp.token("alice").await).await.0, 200);
    let before = idp.jwks_fetches().await;
    for i in 0..40 {
        let forged = idp.forged(&format!("k-forged-{i}")).await;
        assert_eq!(whoami(&gw, &forged).await.0, 401);
    }
    let fetched = idp.jwks_fetches().await - before;
    assert!(
        fetched <= 2,
        "{fetched} fetches for 40 unknown kids (one per 10 s at most)"
    );
}

#[tokio::test]
async fn with_the_provider_down_kept_keys_verify_until_they_are_too_old() {
    let Some(idp) = Idp::start() else {
        return;
    };
    let gw = idp
        .gateway("refresh_seconds = 1\nmax_key_age_seconds = 4")
        .await;
    assert_eq!(whoami(&gw, &idp.token("alice").await).await.0, 200);
    // Minted before the provider goes down, used after.
    let (kept, late) = (idp.token("bob").await, idp.token("alice").await);
    idp.call(reqwest::Method::POST, "/down").await;
    let (s, me) = whoami(&gw, &kept).await;
    assert_eq!(s, 200, "kept keys verify while the provider is down: {me}");
    // No refresh succeeds: within max_key_age the keys age out and nothing verifies,
    // including a token verified before (fail closed).
    wait_for_within(
        "the kept keys refused once too old",
        Duration::from_secs(20),
        || gw.log(),
        async || (whoami(&gw, &kept).await.0 == 401).then_some(()),
    )
    .await;
    assert_eq!(whoami(&gw, &late).await.0, 401);
    // Back up: the next refresh makes them good again.
    idp.call(reqwest::Method::POST, "/up").await;
    wait_for_within(
        "the provider's keys fetched again",
        Duration::from_secs(20),
        || gw.log(),
        async || (whoami(&gw, &late).await.0 == 200).then_some(()),
    )
    .await;
}
