//! The `turnstile` binary: CLI args -> telemetry -> config -> serve until shutdown.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// mimalloc: fewer instructions and less CPU per relayed request than the system allocator,
/// measured by `bench/instructions.sh` and `bench/run.sh` (`docs/src/benchmarks.md`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "turnstile",
    version,
    about = "OpenAI-compatible gateway for stateful agent backends"
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Serve {
        #[arg(long)]
        config: PathBuf,
    },
    /// Validate a config file without serving.
    Check {
        #[arg(long)]
        config: PathBuf,
    },
    /// Read an API key on stdin and print its SHA-256 hex (for `key_sha256`).
    HashKey,
    /// Inspect and decide pending approvals on a running gateway.
    Approvals {
        /// Gateway base URL.
        #[arg(long, env = "TURNSTILE_URL", default_value = "http://127.0.0.1:8787")]
        url: String,
        /// API key of an approver (or of the owning client).
        #[arg(long, env = "TURNSTILE_KEY", hide_env_values = true)]
        key: String,
        #[command(subcommand)]
        action: ApprovalAction,
    },
    /// Daily token usage on a running gateway: your own, or everyone's for an approver.
    Usage {
        /// Gateway base URL.
        #[arg(long, env = "TURNSTILE_URL", default_value = "http://127.0.0.1:8787")]
        url: String,
        /// API key of the client (an approver sees every client).
        #[arg(long, env = "TURNSTILE_KEY", hide_env_values = true)]
        key: String,
        /// Only this client (approvers).
        #[arg(long)]
        client: Option<String>,
        /// First day, YYYY-MM-DD (UTC).
        #[arg(long)]
        from: Option<String>,
        /// Last day, YYYY-MM-DD (UTC).
        #[arg(long)]
        to: Option<String>,
    },
    /// Sign in to a gateway with its identity provider (device flow); keeps the sign-in in a
    /// file only you can read.
    Login {
        /// Gateway base URL.
        #[arg(long, env = "TURNSTILE_URL")]
        gateway: String,
        /// The provider's issuer, when the gateway offers several.
        #[arg(long)]
        issuer: Option<String>,
        /// The credentials file (default: ~/.config/turnstile/credentials.json).
        #[arg(long, env = "TURNSTILE_CREDENTIALS")]
        credentials: Option<PathBuf>,
    },
    /// Print a valid short-lived access token of a gateway you signed in to (for
    /// `apiKeyHelper` and provider auth commands), refreshing it when needed.
    Token {
        /// Gateway base URL (default: the only one signed in to).
        #[arg(long)]
        gateway: Option<String>,
        #[arg(long, env = "TURNSTILE_CREDENTIALS")]
        credentials: Option<PathBuf>,
    },
    /// Sign out of a gateway: its sign-in is revoked and forgotten.
    Logout {
        #[arg(long)]
        gateway: Option<String>,
        #[arg(long, env = "TURNSTILE_CREDENTIALS")]
        credentials: Option<PathBuf>,
    },
}

/// Runs a sign-in command on a small runtime; its error on stderr, exit 1.
fn sign_in_cli<F, T>(
    credentials: Option<PathBuf>,
    run: impl FnOnce(PathBuf) -> F,
    done: impl FnOnce(T),
) -> ExitCode
where
    F: std::future::Future<Output = Result<T, String>>,
{
    let Some(path) = credentials.or_else(turnstile::sso::client::default_path) else {
        eprintln!("error: no home folder: name the credentials file with --credentials");
        return ExitCode::FAILURE;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    match runtime
        .map_err(|e| e.to_string())
        .and_then(|r| r.block_on(run(path)))
    {
        Ok(v) => {
            done(v);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Subcommand)]
enum ApprovalAction {
    /// List approvals, newest first.
    List {
        /// pending, approved or denied.
        #[arg(long)]
        state: Option<String>,
    },
    /// Show one approval.
    Show { id: String },
    /// Approve a pending approval.
    Approve {
        id: String,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Deny a pending approval.
    Deny {
        id: String,
        #[arg(long)]
        reason: Option<String>,
    },
}

/// `turnstile usage`: prints the gateway's JSON answer.
fn usage_cli(url: &str, key: &str, filters: [(&str, Option<String>); 3]) -> ExitCode {
    let query: Vec<(&str, String)> = filters
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
        .collect();
    let target = format!("{}/v1/usage", url.trim_end_matches('/'));
    call_cli(&target, &query, key, None)
}

/// Runs one approvals command; prints the JSON answer. Non-2xx answers exit 1.
fn approvals_cli(url: &str, key: &str, action: ApprovalAction) -> ExitCode {
    let base = format!("{}/v1/approvals", url.trim_end_matches('/'));
    let decision = |id: &str, d: &str, reason: Option<String>| {
        let mut body = serde_json::json!({"decision": d});
        if let Some(r) = reason {
            body["reason"] = serde_json::json!(r);
        }
        (format!("{base}/{id}/decision"), Some(body))
    };
    let mut query = Vec::new();
    let (target, body) = match action {
        ApprovalAction::List { state } => {
            query.extend(state.map(|s| ("state", s)));
            (base.clone(), None)
        }
        ApprovalAction::Show { id } => (format!("{base}/{id}"), None),
        ApprovalAction::Approve { id, reason } => decision(&id, "approve", reason),
        ApprovalAction::Deny { id, reason } => decision(&id, "deny", reason),
    };
    call_cli(&target, &query, key, body)
}

/// One request to a running gateway (GET with `query`, or POST with a JSON body); prints the
/// answer, pretty. Non-2xx answers exit 1.
fn call_cli(
    target: &str,
    query: &[(&str, String)],
    key: &str,
    body: Option<serde_json::Value>,
) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let client = reqwest::Client::new();
        let req = match body {
            Some(b) => client.post(target).json(&b),
            None => client.get(target).query(query),
        };
        let resp = req.bearer_auth(key).send().await?;
        let status = resp.status();
        let text = resp.text().await?;
        Ok::<_, reqwest::Error>((status, text))
    });
    match result {
        Ok((status, text)) => {
            let pretty = serde_json::from_str::<serde_json::Value>(&text)
                .and_then(|v| serde_json::to_string_pretty(&v))
                .unwrap_or(text);
            if status.is_success() {
                println!("{pretty}");
                ExitCode::SUCCESS
            } else {
                eprintln!("error: HTTP {status}\n{pretty}");
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("error: cannot reach {target}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs each `claude-code` backend's `command --version` and reports what it found.
/// Each endpoint's signing secrets are set and well formed, and its client can be built.
/// The secrets `check` reads from the environment: sign-in clients' and webhooks'.
fn check_secrets(cfg: &turnstile::config::Config) -> ExitCode {
    let mut ok = true;
    for (issuer, s) in (cfg.jwt.iter()).filter_map(|i| Some((&i.issuer, i.sign_in()?.1))) {
        match (&s.client_secret_env, s.secret()) {
            (Some(var), None) => {
                eprintln!("error: auth.oidc `{issuer}`: client_secret_env: the environment variable {var} is not set");
                ok = false;
            }
            _ => println!("sign-in through {issuer} as client {}", s.client_id),
        }
    }
    for w in &cfg.webhooks {
        match turnstile::notify::secrets(w) {
            Ok(s) => println!(
                "webhook {}: {} signing secret(s), events {}",
                w.id,
                s.len(),
                w.events.join(", ")
            ),
            Err(e) => {
                eprintln!("error: {e}");
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    }
}

fn check_agents(cfg: &turnstile::config::Config) -> ExitCode {
    use turnstile::config::BackendSpec;
    let claude: Vec<_> = cfg
        .backends
        .iter()
        .filter_map(|(name, b)| match b {
            BackendSpec::ClaudeCode(c) => Some((name, c)),
            _ => None,
        })
        .collect();
    if claude.is_empty() {
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut status = ExitCode::SUCCESS;
    for (name, c) in claude {
        match runtime.block_on(turnstile::backend::agent::child::version(&c.agent.child)) {
            Ok(v) => println!("backend {name} (claude-code): {v}"),
            Err(e) => {
                eprintln!("error: backend {name} (claude-code): {e}");
                status = ExitCode::from(2);
            }
        }
    }
    status
}

/// Logs on stderr, written by a thread of their own: a request's line is handed over, not
/// written on the request path; the thread writes what queued up in one go as soon as it
/// wakes, and what is left when the returned guard drops (at exit). With traces on, the
/// server spans (and nothing else of the logs) also go to the exporter.
fn init_logs(
    format: LogFormat,
    traces: Option<&turnstile::telemetry::Telemetry>,
) -> tracing_appender::non_blocking::WorkerGuard {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    // The MCP SDK logs the bridge's messages (tool arguments and results) at info and debug:
    // never below warn, whatever TURNSTILE_LOG asks. The trace spans are not log lines.
    let filter = tracing_subscriber::EnvFilter::try_from_env("TURNSTILE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
        .add_directive("rmcp=warn".parse().expect("a valid directive"))
        .add_directive(
            format!("{}=off", turnstile::telemetry::TARGET)
                .parse()
                .expect("a valid directive"),
        );
    let (writer, guard) =
        tracing_appender::non_blocking(std::io::BufWriter::new(std::io::stderr()));
    let access = match format {
        LogFormat::Text => turnstile::http::access::Format::Text,
        LogFormat::Json => turnstile::http::access::Format::Json,
    };
    turnstile::http::access::install(writer.clone(), access);
    let Some(traces) = traces else {
        // Without traces, one subscriber with a global filter: a disabled event costs only
        // its callsite's cached interest.
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(writer);
        match format {
            LogFormat::Json => builder.json().init(),
            LogFormat::Text => builder.with_ansi(false).init(),
        }
        return guard;
    };
    let fmt = tracing_subscriber::fmt::layer().with_writer(writer);
    let fmt = match format {
        LogFormat::Json => fmt.json().with_filter(filter).boxed(),
        LogFormat::Text => fmt.with_ansi(false).with_filter(filter).boxed(),
    };
    tracing_subscriber::registry()
        .with(fmt)
        .with(traces.layer())
        .init();
    guard
}

/// `turnstile serve`: the config, then logs (and traces), then serving until a signal.
fn serve(config: PathBuf, format: LogFormat) -> ExitCode {
    let cfg = match turnstile::config::load(&config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let traces = match &cfg.telemetry {
        Some(t) => match runtime.block_on(async { turnstile::telemetry::start(t) }) {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        },
        None => None,
    };
    let _logs = init_logs(format, traces.as_ref());
    let served = runtime.block_on(turnstile::server::serve(cfg, &config));
    if let Some(t) = traces {
        runtime.block_on(t.shutdown());
    }
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            tracing::error!(error = %e, "turnstile stopped with an error");
            ExitCode::from(2)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::HashKey => {
            let mut key = String::new();
            if let Err(e) = std::io::stdin().read_to_string(&mut key) {
                eprintln!("error: cannot read stdin: {e}");
                return ExitCode::FAILURE;
            }
            let key = key.strip_suffix('\n').unwrap_or(&key);
            let key = key.strip_suffix('\r').unwrap_or(key);
            if key.is_empty() {
                eprintln!("error: no key on stdin");
                return ExitCode::FAILURE;
            }
            println!("{}", turnstile::auth::hash_key(key));
            ExitCode::SUCCESS
        }
        Command::Approvals { url, key, action } => approvals_cli(&url, &key, action),
        Command::Usage {
            url,
            key,
            client,
            from,
            to,
        } => usage_cli(&url, &key, [("client", client), ("from", from), ("to", to)]),
        Command::Check { config } => match turnstile::config::load(&config) {
            Ok(cfg) => {
                println!(
                    "config OK: {} clients, {} JWT issuers, {} models, {} backends",
                    cfg.clients.len(),
                    cfg.jwt.len(),
                    cfg.models.len(),
                    cfg.backends.len()
                );
                for w in cfg.warnings() {
                    eprintln!("warning: {w}");
                }
                match check_secrets(&cfg) {
                    ExitCode::SUCCESS => check_agents(&cfg),
                    failed => failed,
                }
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        },
        Command::Serve { config } => serve(config, cli.log_format),
        Command::Login {
            gateway,
            issuer,
            credentials,
        } => sign_in_cli(
            credentials,
            async |p| turnstile::sso::client::login(&gateway, issuer.as_deref(), &p).await,
            |()| {},
        ),
        Command::Token {
            gateway,
            credentials,
        } => sign_in_cli(
            credentials,
            async |p| turnstile::sso::client::token(gateway.as_deref(), &p).await,
            |t| println!("{t}"),
        ),
        Command::Logout {
            gateway,
            credentials,
        } => sign_in_cli(
            credentials,
            async |p| turnstile::sso::client::logout(gateway.as_deref(), &p).await,
            |()| eprintln!("Signed out."),
        ),
    }
}
