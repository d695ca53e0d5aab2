//! Turnstile: a gateway in front of stateful agent backends that holds the backend's turn open
//! while the client runs its own tools, and resumes that same turn exactly once when the same
//! client posts the matching results.
//!
//! # Layout (surfaces -> engine -> backends / store)
//! - [`http`]: router, one generic turn handler, the other routes, how an error becomes a
//!   response.
//! - [`surface`]: the `Surface` trait and one module per client API (`chat`, `responses`,
//!   `messages`): wire types, tolerant parsing into a neutral [`turn::TurnInput`], framing;
//!   the shared detection, turn builder and canonical projection.
//! - [`turn`]: the neutral vocabulary shared by surfaces, the engine and backends.
//! - [`engine`]: executions and legs: admission, fresh turns, the one suspension path, the
//!   claim, the one ending path, the deadline timer.
//! - [`backend`]: the `Backend` trait and its kinds: `app_server` (a held Codex turn over
//!   JSON-RPC), `claude_code` (a held Claude Code turn over stream-json) and `acp` (a held turn
//!   of any Agent Client Protocol agent), both protocols on the one generic agent backend, and
//!   `upstream` (a stateless OpenAI-compatible HTTP endpoint), over the shared `agent`
//!   substrate.
//! - [`continuation`]: `srct-` tokens, canonical JSON, pending records and tombstones in
//!   memory, the claim.
//! - [`approvals`]: durable approval records of backend side effects, decisions, events.
//! - [`store`]: the durable journal, suspensions, tombstones and approvals (SQLite or
//!   PostgreSQL).
//! - [`auth`]: principals from API keys (SHA-256 digests, constant-time match) and JWTs.
//! - [`sso`]: sign-in through an identity provider, the gateway's own short-lived tokens,
//!   and `turnstile login` / `turnstile token`.
//! - [`budget`]: prices, costs and spend caps over the UTC calendar.
//! - [`config`]: TOML config, parsed strictly, validated and frozen.
//! - [`error`]: stable error codes and their statuses.
//! - [`metrics`]: Prometheus metric names and rendering.
//! - [`digest`], [`ids`], [`sse`]: SHA-256, the ids the gateway issues, the SSE splitter.
//! - [`telemetry`]: OpenTelemetry GenAI traces over OTLP/HTTP (off unless configured).
//! - [`server`]: binding, signals (SIGINT/SIGTERM shutdown, SIGHUP reload) and serving.

pub mod approvals;
pub mod auth;
pub mod backend;
pub mod budget;
pub mod config;
pub mod continuation;
pub mod digest;
pub mod engine;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
pub mod ids;
pub mod managed;
pub mod metrics;
pub mod notify;
pub mod server;
pub mod sse;
pub mod sso;
pub mod store;
pub mod surface;
pub mod telemetry;
pub mod turn;
