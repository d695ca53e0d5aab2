//! The message object and its usage as Anthropic's Messages reference defines them, every
//! member present, serialised straight from these types (no JSON tree is built for them).
//! `()` members are the reference's nullable ones that no backend here fills: `null`.

use serde::Serialize;
use serde_json::Value;

use crate::turn::Usage;

/// A `message_delta` event's usage (`MessageDeltaUsage`): `input_tokens` excludes the
/// tokens read from and written to the cache.
#[derive(Serialize)]
pub struct DeltaUsage {
    input_tokens: u64,
    cache_creation_input_tokens: u64,
    cache_read_input_tokens: u64,
    output_tokens: u64,
    output_tokens_details: OutputDetails,
    server_tool_use: (),
}

#[derive(Serialize)]
struct OutputDetails {
    thinking_tokens: u64,
}

impl From<Usage> for DeltaUsage {
    fn from(u: Usage) -> Self {
        DeltaUsage {
            input_tokens: u
                .prompt_tokens
                .saturating_sub(u.cached_tokens + u.cache_write_tokens),
            cache_creation_input_tokens: u.cache_write_tokens,
            cache_read_input_tokens: u.cached_tokens,
            output_tokens: u.completion_tokens,
            output_tokens_details: OutputDetails {
                thinking_tokens: u.reasoning_tokens,
            },
            server_tool_use: (),
        }
    }
}

/// A message's usage: the delta's members, cache writes counted as 5-minute ones, the
/// standard tier, no geography or speed chosen.
#[derive(Serialize)]
pub struct FullUsage {
    #[serde(flatten)]
    counts: DeltaUsage,
    cache_creation: CacheCreation,
    service_tier: &'static str,
    inference_geo: (),
    speed: (),
}

#[derive(Serialize)]
struct CacheCreation {
    ephemeral_5m_input_tokens: u64,
    ephemeral_1h_input_tokens: u64,
}

impl From<Usage> for FullUsage {
    fn from(u: Usage) -> Self {
        FullUsage {
            counts: u.into(),
            cache_creation: CacheCreation {
                ephemeral_5m_input_tokens: u.cache_write_tokens,
                ephemeral_1h_input_tokens: 0,
            },
            service_tier: "standard",
            inference_geo: (),
            speed: (),
        }
    }
}

/// A message object (`stop_reason` None while it is still being streamed).
#[derive(Serialize)]
pub struct Message<'a> {
    pub id: &'a str,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub role: &'static str,
    pub model: &'a str,
    pub content: &'a [Value],
    pub stop_reason: Option<&'a str>,
    pub stop_sequence: (),
    pub stop_details: (),
    pub container: (),
    pub diagnostics: (),
    pub usage: FullUsage,
}

impl<'a> Message<'a> {
    pub fn new(
        id: &'a str,
        model: &'a str,
        content: &'a [Value],
        stop: Option<&'a str>,
        usage: Usage,
    ) -> Self {
        Message {
            id,
            kind: "message",
            role: "assistant",
            model,
            content,
            stop_reason: stop,
            stop_sequence: (),
            stop_details: (),
            container: (),
            diagnostics: (),
            usage: usage.into(),
        }
    }
}
