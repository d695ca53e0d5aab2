//! The `turnstile` binary: CLI args -> telemetry -> config -> serve until shutdown.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

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
}

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TURNSTILE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.with_ansi(false).init(),
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
        Command::Check { config } => match turnstile::config::load(&config) {
            Ok(cfg) => {
                println!(
                    "config OK: {} clients, {} models, {} backends",
                    cfg.clients.len(),
                    cfg.models.len(),
                    cfg.backends.len()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        },
        Command::Serve { config } => {
            init_logs(cli.log_format);
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("error: cannot start runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(turnstile::server::serve(&config)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    tracing::error!(error = %e, "turnstile stopped with an error");
                    ExitCode::from(2)
                }
            }
        }
    }
}
