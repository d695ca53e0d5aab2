//! Real coding harnesses (opencode, qwen-code, pi-coding-agent; pinned npm packages that
//! `.ci/run` installs under `.cache/harnesses/<name>`) run non-interactively against the real
//! gateway and demo backend. Model `fake-model` is demo scenario `tool`: the backend calls the
//! harness's own read tool on the first absolute path of the prompt, the gateway holds that
//! turn and hands the harness an `srct-` call, the harness reads `secret.txt` itself and posts
//! the result, and the same held turn answers `Tool result: <output>`. A test passes only if
//! the demo backend's spy saw the secret in a tool result **and** the harness printed it.
//!
//! Each run gets its own temporary project folder (the cwd, holding `secret.txt`) and HOME (all
//! XDG folders inside it), an environment cleared down to PATH, an npm registry pointed at a
//! closed loopback port (no harness downloads anything at run time), and a time limit after
//! which its whole process group is killed.
//!
//! A harness that is not installed is skipped loudly; under `CI` that is a failure only when
//! `.ci/run` wrote the install marker (`.turnstile-installed`), i.e. its install step worked.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::*;

/// The gateway model the harnesses use; it maps to demo scenario `tool`.
const MODEL: &str = "fake-model";
/// Bound on one harness run (they take 2-12 s here).
pub(crate) const RUN_LIMIT: Duration = Duration::from_secs(180);
/// Written by `.ci/run` into a harness folder after a successful install.
const INSTALLED_MARKER: &str = ".turnstile-installed";

pub(crate) struct Harness {
    /// Folder under `.cache/harnesses/`.
    name: &'static str,
    /// The npm package.
    package: &'static str,
    /// Its executable under `node_modules/.bin/`.
    bin: &'static str,
}

const OPENCODE: Harness = Harness {
    name: "opencode",
    package: "opencode-ai",
    bin: "opencode",
};
const QWEN: Harness = Harness {
    name: "qwen",
    package: "@qwen-code/qwen-code",
    bin: "qwen",
};
const PI: Harness = Harness {
    name: "pi",
    package: "@mariozechner/pi-coding-agent",
    bin: "pi",
};
pub(crate) const CLAUDE: Harness = Harness {
    name: "claude",
    package: "@anthropic-ai/claude-code",
    bin: "claude",
};
pub(crate) const GEMINI: Harness = Harness {
    name: "gemini",
    package: "@google/gemini-cli",
    bin: "gemini",
};
pub(crate) const CLAUDE_ACP: Harness = Harness {
    name: "claude-acp",
    package: "@zed-industries/claude-agent-acp",
    bin: "claude-agent-acp",
};

impl Harness {
    fn dir(&self) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(".cache/harnesses")
            .join(self.name)
    }

    fn version(&self) -> String {
        let manifest = self
            .dir()
            .join("node_modules")
            .join(self.package)
            .join("package.json");
        std::fs::read_to_string(manifest)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|v| v["version"].as_str().map(str::to_owned))
            .unwrap_or_else(|| "?".into())
    }

    /// The executable, or `None` after a loud skip message.
    pub(crate) fn locate(&self) -> Option<PathBuf> {
        let bin = self.dir().join("node_modules/.bin").join(self.bin);
        if bin.exists() {
            return Some(bin);
        }
        let marker = self.dir().join(INSTALLED_MARKER);
        if std::env::var_os("CI").is_some() && marker.exists() {
            panic!(
                "{}: .ci/run reported a successful install but {} is missing",
                self.name,
                bin.display()
            );
        }
        eprintln!(
            "\n!!!!! SKIPPED {} harness test: {} is not installed at {} !!!!!\n\
             !!!!! run .ci/run, which installs the pinned harnesses into .cache/harnesses !!!!!\n",
            self.name,
            self.package,
            bin.display()
        );
        None
    }
}

/// One harness run's world: the temporary project and HOME, the secret and the prompt.
pub(crate) struct Scene {
    pub(crate) tmp: tempfile::TempDir,
    pub(crate) project: PathBuf,
    pub(crate) home: PathBuf,
    pub(crate) secret: String,
    pub(crate) prompt: String,
    pub(crate) base_url: String,
}

impl Scene {
    pub(crate) fn new(gw: &Gateway) -> Scene {
        let tmp = tempfile::tempdir().expect("tempdir");
        let project = tmp.path().join("project");
        let home = tmp.path().join("home");
        std::fs::create_dir_all(&project).expect("project dir");
        std::fs::create_dir_all(&home).expect("home dir");
        let secret = format!("TS-SECRET-{:016x}", rand::random::<u64>());
        std::fs::write(project.join("secret.txt"), format!("{secret}\n")).expect("secret");
        let prompt = format!(
            "Read the file {}/secret.txt and tell me the secret.",
            project.display()
        );
        Scene {
            tmp,
            project,
            home,
            secret,
            prompt,
            base_url: format!("{}/v1", gw.url),
        }
    }

    pub(crate) fn write(&self, path: &Path, v: &Value) {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("config dir");
        std::fs::write(path, serde_json::to_string_pretty(v).expect("json")).expect("config");
    }
}

/// The e2e config plus `fake-model` = demo scenario `tool`.
pub(crate) fn harness_config(o: &Opts, dir: &Path) -> String {
    let mut s = config_text(o, dir);
    s.push_str(&format!(
        "\n[[models]]\nid = \"{MODEL}\"\nbackend = \"demo\"\nbackend_model = \"tool\"\n"
    ));
    s
}

/// Runs `cmd` in its own process group; past `limit` the group is killed. The group is also
/// killed after a normal exit, so nothing a harness left behind outlives the test.
pub(crate) fn run_bounded(mut cmd: Command, limit: Duration) -> (Option<ExitStatus>, Duration) {
    let start = Instant::now();
    let mut child = cmd.process_group(0).spawn().expect("spawn harness");
    let pgid = child.id();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait harness") {
            break Some(s);
        }
        if start.elapsed() > limit {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let elapsed = start.elapsed();
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stderr(Stdio::null())
        .status();
    if status.is_none() {
        let _ = child.wait();
    }
    (status, elapsed)
}

pub(crate) fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The harness `bin` in `scene`, its output going to the files it returns. Nothing from the
/// caller's environment (keys, base URLs, configs) leaks in.
pub(crate) fn command(bin: &Path, scene: &Scene) -> (Command, PathBuf, PathBuf) {
    let stdout_path = scene.tmp.path().join("stdout.txt");
    let stderr_path = scene.tmp.path().join("stderr.txt");
    let mut cmd = Command::new(bin);
    let home = &scene.home;
    let dead_registry = "http://127.0.0.1:9/";
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_DATA_HOME", home.join(".local/share"))
        .env("XDG_STATE_HOME", home.join(".local/state"))
        .env("XDG_CACHE_HOME", home.join(".cache"))
        .env("TMPDIR", scene.tmp.path())
        .env("NO_COLOR", "1")
        .env("TERM", "dumb")
        .env("npm_config_registry", dead_registry)
        .env("BUN_CONFIG_REGISTRY", dead_registry)
        .current_dir(&scene.project)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout_path).expect("stdout file"))
        .stderr(std::fs::File::create(&stderr_path).expect("stderr file"));
    (cmd, stdout_path, stderr_path)
}

/// Starts the gateway on the demo backend, lets `configure` write the harness's config and
/// arguments, runs the harness on the secret prompt and checks both ends: the demo backend's
/// spy and the harness's output.
async fn reads_secret_through_held_turn(h: &Harness, configure: impl FnOnce(&Scene, &mut Command)) {
    let Some(bin) = h.locate() else {
        return;
    };
    let gw = Gateway::start_raw(Opts::default(), harness_config).await;
    let spy_saw = |secret: &str| {
        gw.spy_events("tool_result").iter().any(|e| {
            e["success"] == json!(true) && e["text"].as_str().is_some_and(|t| t.contains(secret))
        })
    };
    reads_secret(&gw, h.name, &h.version(), &bin, spy_saw, configure).await;
}

/// Runs the harness `bin` on the secret prompt against `gw` and checks both ends: the
/// backend received the secret in a tool result (`backend_saw`), and the harness printed the
/// backend's final answer (`Tool result: …` with the secret). Returns the harness's stderr and
/// how long it ran.
pub(crate) async fn reads_secret(
    gw: &Gateway,
    name: &str,
    version: &str,
    bin: &Path,
    backend_saw: impl Fn(&str) -> bool,
    configure: impl FnOnce(&Scene, &mut Command),
) -> (String, Duration) {
    let scene = Scene::new(gw);
    let (mut cmd, stdout_path, stderr_path) = command(bin, &scene);
    configure(&scene, &mut cmd);

    let (status, elapsed) = tokio::task::spawn_blocking(move || run_bounded(cmd, RUN_LIMIT))
        .await
        .expect("join");
    let stdout = std::fs::read_to_string(&stdout_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    let spy = gw.spy();
    let log = gw.log();
    let diagnostics = || {
        format!(
            "--- stdout\n{stdout}\n--- stderr (tail)\n{}\n--- gateway log (tail)\n{}\n--- spy\n{}",
            tail(&stderr, 60),
            tail(&log, 60),
            spy.iter()
                .map(|e| {
                    let mut e = e.clone();
                    e["developer_instructions"] = json!("…");
                    e.to_string()
                })
                .collect::<Vec<_>>()
                .join("\n")
        )
    };

    // What the gateway saw, for the record (`cargo test -- --nocapture`).
    let statuses: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("route=/v1/"))
        .filter_map(|l| l.split("status=").nth(1))
        .filter_map(|s| s.split_whitespace().next())
        .collect();
    let threads: Vec<String> = gw
        .thread_starts()
        .iter()
        .map(|t| t["dynamic_tools"].to_string())
        .collect();
    eprintln!(
        "harness {name} {version}: exit {:?} after {:.1} s; requests (status): {:?}; backend \
         threads (tools): {}",
        status.and_then(|s| s.code()),
        elapsed.as_secs_f64(),
        statuses,
        threads.join(" / ")
    );

    let status = status.unwrap_or_else(|| {
        panic!(
            "{name} did not finish within {RUN_LIMIT:?}\n{}",
            diagnostics()
        )
    });
    assert!(
        status.success(),
        "{name} exited with {status}\n{}",
        diagnostics()
    );
    assert!(
        backend_saw(&scene.secret),
        "{name}: the backend never received a tool result with the secret {}\n{}",
        scene.secret,
        diagnostics()
    );
    let answer = stdout
        .find("Tool result:")
        .map(|i| &stdout[i..])
        .unwrap_or_default();
    assert!(
        answer.contains(&scene.secret),
        "{name}: the final answer (`Tool result: …` with the secret {}) is not in its output\n{}",
        scene.secret,
        diagnostics()
    );
    (stderr, elapsed)
}

#[tokio::test]
async fn harness_opencode_reads_secret_through_held_turn() {
    reads_secret_through_held_turn(&OPENCODE, |s, cmd| {
        // Project config (opencode reads ./opencode.json); its title request goes to
        // `small_model` without tools and gets "No tools available.".
        let provider = json!({
            "npm": "@ai-sdk/openai-compatible",
            "name": "Turnstile",
            "options": {"baseURL": s.base_url, "apiKey": ALICE},
            "models": {MODEL: {"name": "Turnstile demo", "tool_call": true}},
        });
        let config = json!({
            "provider": {"turnstile": provider},
            "model": format!("turnstile/{MODEL}"),
            "small_model": format!("turnstile/{MODEL}"),
            "autoupdate": false,
            "share": "disabled",
        });
        s.write(&s.project.join("opencode.json"), &config);
        cmd.env("OPENCODE_DISABLE_MODELS_FETCH", "1")
            .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
            .env("OPENCODE_DISABLE_LSP_DOWNLOAD", "1")
            .args(["run", "-m", &format!("turnstile/{MODEL}"), &s.prompt]);
    })
    .await;
}

#[tokio::test]
async fn harness_qwen_code_reads_secret_through_held_turn() {
    reads_secret_through_held_turn(&QWEN, |s, cmd| {
        cmd.args([
            "--auth-type",
            "openai",
            "--openai-api-key",
            ALICE,
            "--openai-base-url",
            &s.base_url,
            "-m",
            MODEL,
            "--yolo",
            &s.prompt,
        ]);
    })
    .await;
}

/// Claude Code on the Messages surface: its own `Read` tool, run under its own permissions
/// (`--allowedTools Read`), fully offline.
#[tokio::test]
async fn harness_claude_code_reads_secret_through_held_turn() {
    reads_secret_through_held_turn(&CLAUDE, |s, cmd| claude(s, cmd, &s.prompt, MODEL)).await;
}

/// The Claude Code environment: the gateway, a key, and no traffic elsewhere.
pub(crate) fn claude_env(s: &Scene, cmd: &mut Command) {
    cmd.env("ANTHROPIC_BASE_URL", s.base_url.trim_end_matches("/v1"))
        .env("ANTHROPIC_API_KEY", ALICE)
        .env("DISABLE_TELEMETRY", "1")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_AUTOUPDATER", "1");
}

/// The Claude Code environment and arguments for `prompt` on `model`, allowed to `Read`.
fn claude(s: &Scene, cmd: &mut Command, prompt: &str, model: &str) {
    claude_env(s, cmd);
    cmd.args(["-p", prompt, "--model", model, "--allowedTools", "Read"]);
}

/// Runs Claude Code on the secret prompt with `model`, allowed to `Read`; it must exit 0. Its
/// stdout, and the diagnostics for a failed assertion.
async fn run_claude(bin: &Path, gw: &Gateway, model: &str) -> (String, String) {
    let scene = Scene::new(gw);
    let prompt = scene.prompt.clone();
    claude_in(
        bin,
        gw,
        &scene,
        &["-p", &prompt, "--model", model, "--allowedTools", "Read"],
        None,
    )
    .await
}

/// Runs Claude Code with `args` (and one more variable in its environment, if given) in
/// `scene`; it must exit 0. Its stdout, and the diagnostics for a failed assertion.
pub(crate) async fn claude_in(
    bin: &Path,
    gw: &Gateway,
    scene: &Scene,
    args: &[&str],
    env: Option<(&str, &str)>,
) -> (String, String) {
    let (mut cmd, stdout_path, stderr_path) = command(bin, scene);
    claude_env(scene, &mut cmd);
    if let Some((k, v)) = env {
        cmd.env(k, v);
    }
    cmd.args(args);
    let run = args.join(" ");
    let (status, _) = tokio::task::spawn_blocking(move || run_bounded(cmd, RUN_LIMIT))
        .await
        .expect("join");
    let stdout = std::fs::read_to_string(&stdout_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    let why = format!(
        "{run}\n--- stdout\n{stdout}\n--- stderr\n{}\n--- gateway log\n{}",
        tail(&stderr, 40),
        tail(&gw.log(), 40)
    );
    assert!(status.is_some_and(|s| s.success()), "{why}");
    (stdout, why)
}

/// `claude -c` continues the last conversation: the gateway finds the thread it kept for it
/// (Claude Code sends the history back as it was answered) and the backend gets only the new
/// prompt.
#[tokio::test]
async fn harness_claude_code_continues_a_conversation_on_its_thread() {
    let Some(bin) = CLAUDE.locate() else {
        return;
    };
    let gw = Gateway::start().await;
    let scene = Scene::new(&gw);
    for (round, prompt) in ["hello there", "and once more"].into_iter().enumerate() {
        let args = ["-c", "-p", prompt, "--model", "echo"];
        let (stdout, why) =
            claude_in(&bin, &gw, &scene, &args[usize::from(round == 0)..], None).await;
        assert!(stdout.contains(prompt), "{why}");
        assert!(stdout.contains("You said:"), "{why}");
    }
    let turns = gw.spy_events("turn_start");
    assert_eq!(turns.len(), 2, "{turns:?}");
    assert_eq!(gw.thread_starts().len(), 1, "{turns:?}");
    assert_eq!(turns[1]["thread"], turns[0]["thread"]);
    let input = turns[1]["input"].to_string();
    assert!(
        input.contains("and once more") && !input.contains("hello there"),
        "{input}"
    );
}

/// Claude Code through three sequential rounds and then two parallel calls of one held turn
/// each: the demo backend asks `Read` for paths that do not exist (the secret's path plus a
/// suffix), Claude Code answers each with an `is_error` result, which reaches the held turn as
/// an unsuccessful tool result, and prints the backend's final answer.
#[tokio::test]
async fn harness_claude_code_sequential_rounds_and_parallel_calls() {
    let Some(bin) = CLAUDE.locate() else {
        return;
    };
    let gw = Gateway::start_raw(Opts::default(), |o, dir| {
        let mut s = config_text(o, dir);
        for (id, scenario) in [("cc-rounds", "rounds3"), ("cc-parallel", "parallel")] {
            s.push_str(&format!(
                "\n[[models]]\nid = \"{id}\"\nbackend = \"demo\"\nbackend_model = \"{scenario}\"\n"
            ));
        }
        s
    })
    .await;
    let mut seen = 0;
    for (model, answer, calls) in [
        ("cc-rounds", "Done after 3 rounds:", 3),
        ("cc-parallel", "Results:", 2),
    ] {
        let (stdout, why) = run_claude(&bin, &gw, model).await;
        assert!(stdout.contains(answer), "{why}");
        let results = gw.spy_events("tool_result");
        assert_eq!(results.len(), seen + calls, "{why}");
        assert!(
            results[seen..].iter().all(|r| r["success"] == json!(false)),
            "{results:?}"
        );
        seen += calls;
    }
    // Three rounds and one parallel batch: four suspensions of two executions.
    let log = gw.log();
    let suspended: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("execution suspended"))
        .filter_map(|l| l.split("execution=").nth(1))
        .filter_map(|s| s.split_whitespace().next())
        .collect();
    assert_eq!(suspended.len(), 4, "{log}");
    let executions: std::collections::BTreeSet<&str> = suspended.into_iter().collect();
    assert_eq!(executions.len(), 2, "{log}");
}

/// Claude Code on a stateless Chat Completions upstream (the in-test fake): its real request
/// translated to Chat, the upstream's call (a tool Claude Code does not have, so it answers
/// with an error result) exposed as a token, and the result forwarded with the upstream's own
/// id restored.
#[tokio::test]
async fn harness_claude_code_on_a_chat_upstream() {
    let Some(bin) = CLAUDE.locate() else {
        return;
    };
    let (gw, fake) =
        crate::support::fake_upstream::gateway_on_fake(Opts::default(), &[("cc-up", "up-tool")])
            .await;
    let (stdout, why) = run_claude(&bin, &gw, "cc-up").await;
    assert!(stdout.contains("Results: call_up_1="), "{why}");
    let bodies = fake.bodies();
    assert_eq!(bodies.len(), 2, "{why}");
    let first = &bodies[0];
    assert_eq!(first["messages"][0]["role"], "system", "{first}");
    assert_eq!(first["tools"].as_array().map(Vec::len), Some(12), "{first}");
    // The 2026 body, translated: no cache breakpoints (nor their `ttl`), thinking or context
    // management reach a Chat upstream; the client's cache identity does, hashed.
    let text = first.to_string();
    for absent in [
        "cache_control",
        "\"ttl\"",
        "context_management",
        "\"thinking\"",
    ] {
        assert!(
            !text.contains(absent),
            "{absent} reached the upstream: {first}"
        );
    }
    let key = first["prompt_cache_key"].as_str().unwrap_or_default();
    assert!(
        key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit()),
        "{first}"
    );
    assert!(first["reasoning_effort"].is_string(), "{first}");
    let sent = bodies[1]["messages"].as_array().unwrap();
    let n = sent.len();
    assert_eq!(sent[n - 2]["tool_calls"][0]["id"], "call_up_1", "{sent:?}");
    assert_eq!(sent[n - 1]["role"], "tool", "{sent:?}");
    assert_eq!(sent[n - 1]["tool_call_id"], "call_up_1");
    assert!(!bodies[1].to_string().contains("srct-"));
}

#[tokio::test]
async fn harness_pi_reads_secret_through_held_turn() {
    reads_secret_through_held_turn(&PI, |s, cmd| {
        let models = json!({"providers": {"turnstile": {
            "baseUrl": s.base_url,
            "api": "openai-completions",
            "apiKey": ALICE,
            "models": [{"id": MODEL}],
        }}});
        s.write(&s.home.join(".pi/agent/models.json"), &models);
        cmd.args([
            "--offline",
            "--no-session",
            "-p",
            "--provider",
            "turnstile",
            "--model",
            MODEL,
            &s.prompt,
        ]);
    })
    .await;
}
