//! The console signed in through the identity provider in real headless Chromium
//! (`tests/clients/console_sso.mjs` against `tests/clients/oidc_idp.mjs`): the provider's own
//! login page, the session cookie's attributes, a decision made, sign-out and the stale
//! cookie refused. Also: the pasted-key sign-in switched off.

use std::time::Duration;

use serde_json::Value;

use super::console::{chromium, screenshots};
use crate::operations::oidc::Idp;
use crate::operations::sign_in::{opts, sign_in_section};
use crate::support::node;
use crate::support::*;

const SCRIPT_LIMIT: Duration = Duration::from_secs(300);

#[tokio::test]
async fn the_console_signs_in_through_the_provider_in_headless_chromium() {
    let Some(node) = node::node_with("playwright-core", "console sign-in browser test") else {
        return;
    };
    let Some(chromium) = chromium() else {
        return;
    };
    let Some(idp) = Idp::start() else {
        return;
    };
    let section = sign_in_section(&idp, "");
    let gw = Gateway::start_raw(opts(), move |o, d| config_text(o, d) + &section).await;
    let callback = format!("{}/console/sso/callback", gw.url);
    idp.call(reqwest::Method::POST, &format!("/redirect?uri={callback}"))
        .await;
    let env = [
        ("TURNSTILE_URL", gw.url.clone()),
        ("TURNSTILE_KEY", ALICE.to_string()),
        ("TURNSTILE_CHROMIUM", chromium.display().to_string()),
        ("TURNSTILE_SCREENSHOTS", screenshots().display().to_string()),
    ];
    let out = node::run(node, "console_sso.mjs", &env, SCRIPT_LIMIT).await;
    let stdout = node::succeeded(&out, "console_sso.mjs", &gw.log());
    eprintln!("{stdout}");
    assert!(stdout.contains(" 0 failed"), "{stdout}");
    assert!(!gw.log().contains("tcs-"), "a session cookie in the log");
}

#[tokio::test]
async fn the_pasted_key_sign_in_can_be_switched_off() {
    let gw = Gateway::start_raw(Opts::default(), |o, d| {
        config_text(o, d) + "\n[console]\napi_key_sign_in = false\n"
    })
    .await;
    let r = gw
        .http
        .get(format!("{}/console/sso/providers", gw.url))
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v,
        serde_json::json!({"api_key_sign_in": false, "providers": []})
    );
    // Without a session cookie there is no console session.
    let r = gw
        .http
        .get(format!("{}/console/sso/session", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}
