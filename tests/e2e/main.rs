//! End-to-end tests: the real `turnstile` binary on port 0 against the real demo backend
//! binary, driven over HTTP (and by the official `openai` Python package where installed);
//! `codex` runs the real Codex `app-server` (where installed) against a fake Responses API.

// Tests and benchmarks: unwrap is the assertion, and wall-clock time is what they measure.
#![allow(clippy::unwrap_used, clippy::disallowed_types)]

mod acp;
mod approvals;
mod budgets;
mod claude_backend;
mod claude_code;
mod cluster;
mod codex;
mod codex_cli;
mod codex_messages;
mod codex_threads;
mod coding_harnesses;
mod compaction;
mod connections;
mod console;
mod continuation;
mod contracts;
mod core;
mod crash;
mod flood;
mod jwt;
mod lifecycle;
mod messages;
mod messages_upstream;
mod reasoning;
mod responses;
mod responses_upstream;
mod sdk;
mod sdk_node;
mod security_ii;
mod store_pg;
mod support;
mod threads;
mod traces;
mod upstream;
mod upstream_hardening;
