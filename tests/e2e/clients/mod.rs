//! Real clients against the gateway: coding harnesses (Claude Code, Codex CLI, Gemini CLI's
//! ACP side), the official SDKs (Python and Node) and the console in a headless browser.

mod claude_code;
pub(crate) mod codex_cli;
pub(crate) mod coding_harnesses;
mod console;
mod console_sso;
mod decision_links;
mod gemini_cli;
pub(crate) mod managed_agents;
pub(crate) mod sdk;
mod sdk_node;
mod signed_in;
