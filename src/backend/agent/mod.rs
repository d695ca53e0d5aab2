//! The substrate every agent kind stands on: a child process and its supervision
//! ([`child`]), its output split into bounded lines ([`lines`]), the session permits
//! ([`pool`]) and places ([`places`]), a conversation rendered into an agent's first turn
//! ([`render`]), what every agent refuses ([`validate`]) and approval asks ([`approval`]).
//! The kinds whose session is one process (`claude_code/`, `acp/`) are each a [`Protocol`] on
//! the one [`AgentBackend`], which owns their sessions' lifecycle ([`session`]); `app_server/`
//! (Codex's JSON-RPC, many threads per process) has a backend of its own on the same parts.

mod approval;
mod backend;
pub mod bridge;
pub mod child;
pub mod lines;
pub mod places;
pub mod pool;
pub mod render;
pub mod scratch;
pub mod session;
mod stdin;
mod turns;

pub use self::approval::{approval, redact};
pub use self::backend::AgentBackend;
pub use self::session::{Opening, Protocol};
pub use self::turns::{answer, mcp_tools, output_schema, validate, Structured};
