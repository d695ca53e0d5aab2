//! Turnstile: an OpenAI Chat Completions gateway in front of stateful agent backends that
//! holds the backend's turn open while the client runs its own tools, and resumes that same
//! turn exactly once when the same client posts matching `role:"tool"` results.
//!
//! # Layout
//! - [`config`]: TOML config, parsed strictly, validated and frozen.
//! - [`error`]: `ApiError` and `ErrorCode`, the only error -> HTTP mapping.
//! - [`openai`]: Chat Completions wire types and response builders.
//! - [`approvals`]: durable approval records of backend side effects, decisions, events.
//! - [`auth`]: principals from API keys (SHA-256 digests, constant-time match) and JWTs
//!   (`auth::jwt`: RFC 8725 verification, a digest-keyed cache).
//! - [`continuation`]: `srct-` tokens, canonical digests, pending records, tombstones, claim.
//! - [`backend`]: the `Backend` trait, conversation rendering, and the `codex app-server`
//!   implementation (process pool, JSON-RPC framing, thread routing).
//! - [`gateway`]: executions and legs: fresh turns, suspension, validated resume, endings.
//! - [`store`]: the durable SQLite journal, live executions and tombstones.
//! - [`metrics`]: Prometheus metric names and rendering.
//! - [`http`]: router, thin handlers, SSE framing.
//! - [`server`]: binding, signals (SIGINT/SIGTERM shutdown, SIGHUP reload) and serving.

pub mod approvals;
pub mod auth;
pub mod backend;
pub mod config;
pub mod continuation;
pub mod error;
pub mod gateway;
pub mod http;
pub mod metrics;
pub mod openai;
pub mod server;
pub mod store;
