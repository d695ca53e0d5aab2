//! One client API each: Chat Completions (`core`), Responses, Messages, Gemini, their published
//! contracts (schemas, the Claude Code gateway protocol, forced tool choice), reasoning and
//! remote compaction, driven over HTTP against the demo backend and scripted upstreams.

mod compaction;
mod contract;
mod contracts;
mod core;
mod gemini;
mod messages;
mod reasoning;
mod responses;
