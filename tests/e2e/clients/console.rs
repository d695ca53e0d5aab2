//! The console in real headless Chromium (Debian's `chromium`, driven by the pinned
//! `playwright-core` from `tests/clients/package.json`; `.ci/run` installs both). The cases
//! live in `tests/clients/console.mjs`: sign-in and a refused key, a pending approval arriving
//! live while a demo-backend turn waits on it, approve and deny finishing the waiting chat
//! streams, two consoles racing, reconnecting, a foreign principal, history filters, the
//! activity view (with spend and the budget), keyboard-only use, narrow and zoomed layouts, sign-out, the CSP, and no
//! request to anything but loopback. Screenshots go to `target/console-screenshots/`.

use std::path::PathBuf;
use std::time::Duration;

use crate::support::node;
use crate::support::*;

/// Bound on the whole script (about 20 s here).
const SCRIPT_LIMIT: Duration = Duration::from_secs(300);

pub(super) fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("TURNSTILE_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    match path.exists() {
        true => Some(path),
        false => node::skip(
            "console browser test",
            &format!(
                "no Chromium at {} (apt-get install chromium, as .ci/run does)",
                path.display()
            ),
        ),
    }
}

pub(super) fn screenshots() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("console-screenshots")
}

#[tokio::test]
async fn the_console_works_an_approval_queue_in_headless_chromium() {
    let Some(node) = node::node_with("playwright-core", "console browser test") else {
        return;
    };
    let Some(chromium) = chromium() else {
        return;
    };
    // Besides the keys, an approver that signs in with a JWT of issuer A.
    let bot = format!(
        "\n[[clients]]\nid = \"approver-bot\"\njwt = {{ issuer = \"{}\", subject = \"bot-1\" }}\nmodels = []\nroles = [\"approver\"]\n",
        crate::operations::jwt::ISS_A
    );
    let jwt = crate::operations::jwt::token_a("bot-1");
    // Alice has a daily USD budget; `p-echo` costs $1 a turn.
    let gw = Gateway::start_raw(Opts::default(), move |o, dir| {
        let text = crate::operations::jwt::jwt_config(o, dir, &bot);
        crate::operations::budgets::priced(text, &[("alice", "{ usd_per_day = 50.0 }")])
    })
    .await;
    let shots = screenshots();
    let env = [
        ("TURNSTILE_URL", gw.url.clone()),
        ("TURNSTILE_APPROVER_KEY", ROOT.to_string()),
        ("TURNSTILE_APPROVER_JWT", jwt.clone()),
        ("TURNSTILE_KEY", ALICE.to_string()),
        ("TURNSTILE_OTHER_KEY", BOB.to_string()),
        ("TURNSTILE_CHROMIUM", chromium.display().to_string()),
        ("TURNSTILE_SCREENSHOTS", shots.display().to_string()),
    ];
    let out = node::run(node, "console.mjs", &env, SCRIPT_LIMIT).await;
    let stdout = node::succeeded(&out, "console.mjs", &gw.log());
    eprintln!("{stdout}");
    assert!(stdout.contains(" 0 failed"), "{stdout}");
    for name in ["pending", "settled", "denied", "race-loser", "activity"] {
        let png = shots.join(format!("{name}.png"));
        assert!(png.exists(), "no screenshot {}", png.display());
    }
    // Every approval the script created is settled, every waiting stream has ended.
    let (_, pending) = get(&gw, ROOT, "/v1/approvals?state=pending").await;
    assert_eq!(pending["data"], serde_json::json!([]), "{pending}");
    // The page never logged a credential; the gateway log holds none either.
    let log = gw.log();
    assert!(
        !log.contains(ROOT) && !log.contains(ALICE) && !log.contains(&jwt),
        "a credential in the log"
    );
}
