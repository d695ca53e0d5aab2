//! End-to-end tests: the real `turnstile` binary on port 0 against the real demo backend
//! binary, driven over HTTP (and by the official `openai` Python package where installed).

mod approvals;
mod continuation;
mod core;
mod harness;
mod lifecycle;
mod sdk;
mod sdk_node;
mod support;
mod upstream;
