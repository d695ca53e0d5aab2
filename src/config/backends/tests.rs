//! Unit tests of the `[backends.NAME]` sections: each kind's keys, defaults and errors.

use std::path::Path;
use std::time::Duration;

use super::super::tests::{base_toml, parse};
use super::*;

#[test]
fn openai_backend_and_kind_specific_keys() {
    let text = base_toml().replace(
        "[backends.demo]",
        "[backends.up]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1/\"\napi_key_env = \"UP_KEY\"\nidle_timeout_ms = 50\n[backends.demo]",
    );
    let cfg = parse(&text).unwrap();
    let BackendSpec::OpenAi(up) = &cfg.backends["up"] else {
        panic!("up is an openai backend");
    };
    assert_eq!(up.base_url, "http://127.0.0.1:9/v1");
    assert_eq!(up.idle_timeout, Duration::from_millis(50));
    assert_eq!(up.api_key_env.as_deref(), Some("UP_KEY"));
    let bad = text.replace("idle_timeout_ms = 50", "command = [\"x\"]");
    assert_eq!(parse(&bad).unwrap_err().path, "backends.up.command");
    let bad = base_toml().replace(
        "command = [\"./bin/demo\"]",
        "command = [\"./bin/demo\"]\nbase_url = \"http://x\"",
    );
    assert_eq!(parse(&bad).unwrap_err().path, "backends.demo.base_url");
    let bad = text.replace("http://127.0.0.1:9/v1/", "ftp://x");
    assert_eq!(parse(&bad).unwrap_err().path, "backends.up.base_url");
}

#[test]
fn backend_errors_name_their_key() {
    // Each case: a `[backends.b]` section, and the whole error it must produce.
    let cases: &[(&str, &str)] = &[
        (
            "kind = \"nope\"\ncommand = [\"x\"]",
            "config backends.b.kind: unknown backend kind `nope` (expected `app-server`, `openai`, `claude-code` or `acp`)",
        ),
        (
            "kind = 3",
            "config backends.b.kind: invalid type: integer `3`, expected a string",
        ),
        ("command = [\"x\"]", "config backends.b: missing field `kind`"),
        (
            "command = [\"x\"]\nkind = \"openai\"\nbase_url = \"http://x\"",
            "config backends.b.command: not valid for kind `openai`",
        ),
        (
            "kind = \"app-server\"\ncommand = [\"x\"]\nbase_url = \"http://x\"",
            "config backends.b.base_url: not valid for kind `app-server`",
        ),
        (
            "kind = \"app-server\"\ncommand = [\"x\"]\nmax_sessions = \"x\"",
            "config backends.b.max_sessions: invalid type: string \"x\", expected usize",
        ),
        (
            "kind = \"app-server\"\ncommand = [1]",
            "config backends.b.command[0]: invalid type: integer `1`, expected a string",
        ),
        (
            "kind = \"app-server\"\ncommand = [\"x\"]\nenv = { A = 1 }",
            "config backends.b.env.A: invalid type: integer `1`, expected a string",
        ),
        (
            "kind = \"openai\"\nbase_url = \"http://x\"\nidle_timeout_ms = -3",
            "config backends.b.idle_timeout_ms: invalid value: integer `-3`, expected u64",
        ),
        (
            "kind = \"app-server\"",
            "config backends.b.command: missing: the program to run",
        ),
        (
            "kind = \"openai\"",
            "config backends.b.base_url: missing: e.g. http://127.0.0.1:8080/v1",
        ),
    ];
    for (section, want) in cases {
        let e = parse(&format!("[backends.b]\n{section}\n")).expect_err(section);
        assert_eq!(e.to_string(), *want, "{section}");
    }
    let e = parse("[backends.b]\nkind = \"openai\"\nbase_url = \"http://x\"\nproceses = 2\n")
        .unwrap_err();
    assert_eq!(e.path, "backends.b.proceses");
    assert!(e.message.starts_with("unknown field `proceses`"), "{e}");
}

#[test]
fn a_backend_child_gets_the_pass_list_and_never_the_gateways_secrets() {
    let cfg = parse(&base_toml()).unwrap();
    let demo = cfg.backends["demo"].child().unwrap();
    assert!(demo.env_passthrough.contains(&"PATH".to_string()));
    assert!(!demo.env_passthrough.iter().any(|v| v.contains("KEY")));
    let text = base_toml().replace(
        "command = [\"./bin/demo\"]",
        "command = [\"./bin/demo\", \"-c\", 'model_providers.u={name=\"u\",env_key=\"UP_KEY\"}']\nenv_passthrough = [\"CODEX_API_KEY\"]",
    );
    let cfg = parse(&text).unwrap();
    let pass = &cfg.backends["demo"].child().unwrap().env_passthrough;
    assert!(pass.contains(&"UP_KEY".to_string()), "{pass:?}");
    assert!(pass.contains(&"CODEX_API_KEY".to_string()), "{pass:?}");
    let pg = text
        .replace(
            "path = \"data/t.db\"",
            "url = \"postgres://u@127.0.0.1/db\"\npassword_env = \"PG_PASS\"",
        )
        .replace("[\"CODEX_API_KEY\"]", "[\"PG_PASS\"]");
    let e = parse(&pg).unwrap_err();
    assert_eq!(e.path, "backends.demo.env_passthrough", "{e}");
    let bad = text.replace("[\"CODEX_API_KEY\"]", "[\"A=B\"]");
    assert_eq!(
        parse(&bad).unwrap_err().path,
        "backends.demo.env_passthrough[0]"
    );
}

#[test]
fn every_kind_is_one_backend_and_codex_settings_belong_to_the_app_server_kind() {
    let text = base_toml().replace(
        "[backends.demo]",
        "[[models]]\nid = \"up\"\nbackend = \"up\"\n[backends.up]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n[backends.demo]",
    );
    let cfg = parse(&text).unwrap();
    let kinds: Vec<_> = cfg
        .backends
        .iter()
        .map(|(n, b)| (n.as_str(), b.kind()))
        .collect();
    assert_eq!(kinds, [("demo", "app-server"), ("up", "openai")]);
    assert!(cfg.backends["up"].child().is_none());

    let codex = base_toml().replace(
        "approvals = {{ command = \"ask\" }}",
        "approval_policy = \"never\"\nsandbox = \"read-only\"",
    );
    let codex = codex.replace(
        "approvals = { command = \"ask\" }",
        "approval_policy = \"never\"\nsandbox = \"read-only\"",
    );
    let cfg = parse(&codex).unwrap();
    assert_eq!(
        cfg.models[0].codex.approval_policy.as_deref(),
        Some("never")
    );
    assert_eq!(cfg.models[0].codex.sandbox.as_deref(), Some("read-only"));

    for (key, value) in [("approval_policy", "never"), ("sandbox", "read-only")] {
        let text = text.replace(
            "id = \"up\"\nbackend = \"up\"",
            &format!("id = \"up\"\nbackend = \"up\"\n{key} = \"{value}\""),
        );
        let e = parse(&text).unwrap_err().to_string();
        assert_eq!(
            e,
            format!("config models[1].{key}: only for a model of a `kind = \"app-server\"` backend (`up` is `openai`)")
        );
    }
}

#[test]
fn a_claude_code_backend_takes_exactly_its_keys() {
    let section = "[backends.cc]\nkind = \"claude-code\"\ncommand = [\"claude\"]\n\
                   env = { ANTHROPIC_BASE_URL = \"https://api.anthropic.com\" }\n\
                   env_passthrough = [\"ANTHROPIC_API_KEY\"]\nmax_sessions = 8\n\
                   builtin_tools = [\"Bash\", \"Edit\"]\ncwd = \"work\"\n";
    let text = base_toml().replace("[backends.demo]", &format!("{section}[backends.demo]"));
    let cfg = parse(&text).unwrap();
    let BackendSpec::ClaudeCode(cc) = &cfg.backends["cc"] else {
        panic!("cc is a claude-code backend");
    };
    assert_eq!(cc.agent.child.command, ["claude"]);
    assert_eq!(
        cc.agent.child.env["ANTHROPIC_BASE_URL"],
        "https://api.anthropic.com"
    );
    assert!(cc
        .agent
        .child
        .env_passthrough
        .contains(&"ANTHROPIC_API_KEY".to_string()));
    assert_eq!(
        cc.agent.child.cwd.as_deref(),
        Some(Path::new("/etc/turnstile/work"))
    );
    assert_eq!((cc.agent.max_sessions, cc.builtin_tools.len()), (8, 2));
    // Defaults: no built-in, a scratch folder per session.
    let minimal = "[backends.cc]\nkind = \"claude-code\"\ncommand = [\"claude\"]\n";
    let cfg = parse(&base_toml().replace("[backends.demo]", &format!("{minimal}[backends.demo]")))
        .unwrap();
    let BackendSpec::ClaudeCode(cc) = &cfg.backends["cc"] else {
        panic!("cc is a claude-code backend");
    };
    assert!(cc.builtin_tools.is_empty() && cc.agent.child.cwd.is_none());
    assert_eq!(cc.agent.max_sessions, 16);

    for (extra, want) in [
        ("processes = 2", "config backends.cc.processes: not valid for kind `claude-code`"),
        ("base_url = \"http://x\"", "config backends.cc.base_url: not valid for kind `claude-code`"),
        ("nope = 1", "config backends.cc.nope: unknown field `nope`"),
        ("max_sessions = 0", "config backends.cc.max_sessions: must be greater than 0"),
        (
            "builtin_tools = [\"Bash\", \"Rm -rf\"]",
            "config backends.cc.builtin_tools[1]: must name one of Claude Code's tools (e.g. \"Bash\", \"Edit\")",
        ),
        (
            "builtin_tools = [\"mcp__x__y\"]",
            "config backends.cc.builtin_tools[0]: must name a built-in tool, not an MCP one",
        ),
    ] {
        let text = base_toml().replace("[backends.demo]", &format!("{minimal}{extra}\n[backends.demo]"));
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.starts_with(want), "{extra}: {e}");
    }
}

#[test]
fn an_acp_backend_takes_exactly_its_keys_and_the_bridge_is_loopback() {
    let minimal = "[backends.ag]\nkind = \"acp\"\ncommand = [\"gemini\", \"--acp\"]\n";
    let text = base_toml().replace("[backends.demo]", &format!("{minimal}\n[backends.demo]"));
    let cfg = parse(&text).unwrap();
    let Some(BackendSpec::Acp(acp)) = cfg.backends.get("ag") else {
        panic!("an acp backend: {:?}", cfg.backends);
    };
    assert_eq!(acp.agent.child.command, ["gemini", "--acp"]);
    assert_eq!(acp.mcp_bridge.to_string(), "127.0.0.1:0");
    let with_bridge = format!("[mcp_bridge]\nlisten = \"[::1]:7000\"\n{text}");
    let Some(BackendSpec::Acp(acp)) = parse(&with_bridge).unwrap().backends.get("ag").cloned()
    else {
        panic!("an acp backend");
    };
    assert_eq!(acp.mcp_bridge.to_string(), "[::1]:7000");
    for (bridge, extra, want) in [
        (
            "0.0.0.0:0",
            "",
            "config mcp_bridge.listen: must be a loopback address",
        ),
        (
            "nowhere",
            "",
            "config mcp_bridge.listen: `nowhere` is not an address",
        ),
        (
            "127.0.0.1:0",
            "builtin_tools = [\"Bash\"]",
            "config backends.ag.builtin_tools: not valid for kind `acp`",
        ),
        (
            "127.0.0.1:0",
            "max_sessions = 0",
            "config backends.ag.max_sessions: must be greater than 0",
        ),
    ] {
        let text = base_toml().replace(
            "[backends.demo]",
            &format!("{minimal}{extra}\n[backends.demo]"),
        );
        let text = format!("[mcp_bridge]\nlisten = \"{bridge}\"\n{text}");
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.starts_with(want), "{bridge} {extra}: {e}");
    }
}
