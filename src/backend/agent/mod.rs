//! The substrate every agent kind stands on: a child process and its supervision
//! ([`child`]), its output split into bounded lines ([`lines`]), the session permits
//! ([`pool`]) and a conversation rendered into an agent's first turn ([`render`]). A kind
//! (`app_server/`, Codex's JSON-RPC) adds only its protocol: what it writes to the child, what
//! its lines mean, how a turn is held and released.

pub mod child;
pub mod lines;
pub mod pool;
pub mod render;
