//! End-to-end tests: the real `turnstile` binary on port 0 against the real demo backend
//! binary, driven over HTTP (and by the official `openai` Python package where installed);
//! `codex` runs the real Codex `app-server` (where installed) against a fake Responses API.

// Tests and benchmarks: unwrap is the assertion, and wall-clock time is what they measure.
#![allow(clippy::unwrap_used, clippy::disallowed_types)]

mod backends;
mod clients;
mod operations;
mod support;
mod surfaces;
