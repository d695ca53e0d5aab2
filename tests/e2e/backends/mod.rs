//! One backend kind each, behind the gateway: the agent-kind contract (`agents`: every
//! one-process-per-session agent on the same scenarios), the Codex `app-server`, Claude Code's
//! own scenarios and the OpenAI-compatible upstream with its passthroughs.

mod agents;
pub(crate) mod claude_backend;
pub(crate) mod codex;
mod codex_messages;
mod codex_threads;
mod managed;
mod messages_upstream;
mod responses_upstream;
mod upstream;
mod upstream_hardening;
