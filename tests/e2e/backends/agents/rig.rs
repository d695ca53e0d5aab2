//! The agents of the contract: their capability table, their scripted model APIs and the
//! gateway each runs behind. A new agent kind is a variant, its row and its arm here, and one
//! `mod` line in `mod.rs`.

use serde_json::Value;

use crate::clients::coding_harnesses::{CLAUDE, CLAUDE_ACP, GEMINI};
use crate::support::fake_gemini::FakeGemini;
use crate::support::fake_messages::FakeMessages;
use crate::support::*;

/// The scripted model API of one agent.
pub(super) enum Fake {
    Gemini(FakeGemini),
    Messages(FakeMessages),
}

impl Fake {
    pub fn bodies(&self, scenario: &str) -> Vec<Value> {
        match self {
            Fake::Gemini(f) => f.bodies(scenario),
            Fake::Messages(f) => f.bodies(scenario),
        }
    }

    pub fn hold_next(&self) {
        let seen = match self {
            Fake::Gemini(f) => &f.seen.hold_next,
            Fake::Messages(f) => &f.seen.hold_next,
        };
        seen.store(1, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn held(&self) -> usize {
        let held = match self {
            Fake::Gemini(f) => &f.seen.held,
            Fake::Messages(f) => &f.seen.held,
        };
        held.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn release(&self) {
        match self {
            Fake::Gemini(f) => f.seen.release.notify_waiters(),
            Fake::Messages(f) => f.seen.release.notify_waiters(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Agent {
    ClaudeCode,
    Gemini,
    ClaudeAcp,
}

/// Where agents differ.
pub(super) struct Caps {
    /// The kind honours a reasoning effort (Claude Code's `--effort`); ACP has no such
    /// setting and refuses one, naming the field.
    pub effort: bool,
    /// Two read-only calls come in one batch (Gemini CLI runs an MCP server's calls one
    /// after the other, in two rounds).
    pub batches: bool,
    /// Results reach the model in call order, whatever order they were answered in (Claude's
    /// ACP adapter reports them as they are answered).
    pub call_order: bool,
    /// Its model API is Anthropic's Messages (the bodies the fake saw read as such).
    pub messages_api: bool,
    /// Its sessions' scratch folders: `turnstile-{scratch}-{gateway pid}-…`.
    pub scratch: &'static str,
}

impl Agent {
    pub fn caps(self) -> Caps {
        match self {
            Agent::ClaudeCode => Caps {
                effort: true,
                batches: true,
                call_order: true,
                messages_api: true,
                scratch: "claude",
            },
            Agent::Gemini => Caps {
                effort: false,
                batches: false,
                call_order: false,
                messages_api: false,
                scratch: "acp",
            },
            Agent::ClaudeAcp => Caps {
                effort: false,
                batches: true,
                call_order: false,
                messages_api: true,
                scratch: "acp",
            },
        }
    }
}

/// Models: (id, scenario, approvals); every model is on the agent's one backend.
const MODELS: &[(&str, &str, &str)] = &[
    ("agent-one", "one", "{}"),
    ("agent-parallel", "parallel", "{}"),
    ("agent-text", "text", "{}"),
    ("agent-bash-ask", "bash", r#"{ command = "ask" }"#),
    ("agent-bash", "bash", r#"{ command = "allow" }"#),
    ("agent-rounds", "rounds3", "{}"),
    (
        "agent-masquerade",
        "masquerade",
        r#"{ command = "ask", permissions = "ask" }"#,
    ),
];

/// A gateway with the agent as backend `agent` (its working folder `work/` in the gateway's
/// folder) on a fresh fake; None when the agent is not installed.
pub(super) async fn rig(agent: Agent, opts: Opts) -> Option<(Fake, Gateway)> {
    rig_edited(agent, opts, |s| s).await
}

/// [`rig`] with the config text passed through `edit`.
pub(super) async fn rig_edited(
    agent: Agent,
    opts: Opts,
    edit: impl FnOnce(String) -> String + Send + 'static,
) -> Option<(Fake, Gateway)> {
    let (bin, fake) = match agent {
        Agent::ClaudeCode => (
            CLAUDE.locate()?,
            Fake::Messages(FakeMessages::start().await),
        ),
        Agent::Gemini => (GEMINI.locate()?, Fake::Gemini(FakeGemini::start().await)),
        Agent::ClaudeAcp => (
            CLAUDE_ACP.locate()?,
            Fake::Messages(FakeMessages::start().await),
        ),
    };
    let url = match &fake {
        Fake::Gemini(f) => f.url.clone(),
        Fake::Messages(f) => f.url.clone(),
    };
    let gw = Gateway::start_raw(opts, move |o, dir| {
        // A real agent's parallel calls reach the bridge as separate processes' writes; on a
        // loaded machine 25 ms between them is not a batch's worth of quiet.
        let mut s = config_text(o, dir).replace("batch_debounce_ms = 25", "batch_debounce_ms = 250");
        let work = dir.join("work");
        std::fs::create_dir_all(&work).unwrap();
        let (kind, command, env) = match agent {
            // Bash enabled (to the approval policy) for the permission scenario.
            Agent::ClaudeCode => (
                "claude-code\"\nbuiltin_tools = [\"Bash\"]",
                format!("[\"{}\"]", bin.display()),
                format!(
                    "{{ ANTHROPIC_BASE_URL = \"{url}\", ANTHROPIC_API_KEY = \"sk-fake-upstream\" }}"
                ),
            ),
            Agent::Gemini => {
                // Gemini CLI's user settings: no usage statistics, telemetry or updates.
                let home = dir.join("gemini-home");
                std::fs::create_dir_all(home.join(".gemini")).unwrap();
                std::fs::write(
                    home.join(".gemini/settings.json"),
                    r#"{"privacy":{"usageStatisticsEnabled":false},"telemetry":{"enabled":false},
                        "general":{"enableAutoUpdate":false,"enableAutoUpdateNotification":false}}"#,
                )
                .unwrap();
                (
                    "acp\"",
                    format!("[\"{}\", \"--acp\"]", bin.display()),
                    format!(
                        "{{ GOOGLE_GEMINI_BASE_URL = \"{url}\", GEMINI_API_KEY = \"fake-key\", \
                         GEMINI_CLI_TRUST_WORKSPACE = \"true\", GEMINI_CLI_NO_RELAUNCH = \"true\", \
                         HOME = \"{}\" }}",
                        home.display()
                    ),
                )
            }
            Agent::ClaudeAcp => (
                "acp\"",
                format!("[\"{}\"]", bin.display()),
                format!(
                    "{{ ANTHROPIC_BASE_URL = \"{url}\", ANTHROPIC_API_KEY = \"sk-fake-upstream\" }}"
                ),
            ),
        };
        s.push_str(&format!(
            "\n[backends.agent]\nkind = \"{kind}\ncommand = {command}\nenv = {env}\n\
             cwd = \"{}\"\nmax_sessions = {}\n",
            work.display(),
            o.max_sessions.min(4)
        ));
        for (id, scenario, approvals) in MODELS {
            s.push_str(&format!(
                "\n[[models]]\nid = \"{id}\"\nbackend = \"agent\"\nbackend_model = \"{scenario}\"\napprovals = {approvals}\n"
            ));
        }
        edit(s)
    })
    .await;
    Some((fake, gw))
}

pub(super) fn path_of(call: &Value) -> String {
    let a: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    a["path"].as_str().unwrap_or_default().to_string()
}
