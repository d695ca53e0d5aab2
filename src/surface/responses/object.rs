//! The response object, typed: what it echoes of its request (`Envelope`, built once per
//! request by moving the request's members), its identity and status, its output and usage.
//! A whole answer is written from these straight to bytes; the streamed events carry the same
//! object as a tree.

use serde::Serialize;
use serde_json::{json, Value};

use super::Request;
use crate::turn::Usage;

/// The request fields a response object shows: every member the Open Responses
/// specification requires, sampling parameters as the request gave them or at their
/// documented defaults (never null), and the neutral values of what no backend here has
/// (`docs/src/conformance.md`). Members in the order the object lists them.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Envelope {
    pub model: String,
    instructions: Option<String>,
    max_output_tokens: Option<Value>,
    metadata: Value,
    parallel_tool_calls: bool,
    previous_response_id: Option<String>,
    reasoning: Reasoning,
    pub store: bool,
    temperature: Value,
    /// The request's; absent, the default (`{"format":{"type":"text"}}`), written without
    /// a tree.
    #[serde(serialize_with = "text_or_default")]
    text: Option<Value>,
    tool_choice: Value,
    pub tools: Vec<Value>,
    top_p: Value,
    presence_penalty: Value,
    frequency_penalty: Value,
    top_logprobs: Value,
    max_tool_calls: Value,
    /// Every response here runs in the foreground, on the backend's one tier.
    background: bool,
    service_tier: &'static str,
    truncation: &'static str,
    user: Value,
    safety_identifier: Value,
    prompt_cache_key: Value,
}

#[derive(Debug, Clone, Default, Serialize)]
struct Reasoning {
    effort: Value,
    summary: Value,
}

fn text_or_default<S: serde::Serializer>(text: &Option<Value>, s: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Format {
        r#type: &'static str,
    }
    #[derive(Serialize)]
    struct Text {
        format: Format,
    }
    match text {
        Some(t) => t.serialize(s),
        None => Text {
            format: Format { r#type: "text" },
        }
        .serialize(s),
    }
}

impl Envelope {
    /// The envelope of `req`, its members moved (the request is read by now).
    pub fn of(req: Request, parallel: bool) -> Envelope {
        let number = |v: Option<Value>, default: f64| match v {
            Some(n @ Value::Number(_)) => n,
            _ => json!(default),
        };
        let only = |v: Option<Value>, keep: fn(&Value) -> bool| v.filter(keep).unwrap_or_default();
        let mut reasoning = Reasoning::default();
        if let Some(Value::Object(mut r)) = req.reasoning {
            reasoning.effort = r.remove("effort").unwrap_or_default();
            reasoning.summary = r.remove("summary").unwrap_or_default();
        }
        Envelope {
            model: req.model,
            instructions: req.instructions,
            max_output_tokens: req.max_output_tokens,
            metadata: req.metadata.unwrap_or_else(|| json!({})),
            parallel_tool_calls: parallel,
            previous_response_id: req.previous_response_id,
            reasoning,
            store: req.store.unwrap_or(true),
            temperature: number(req.temperature, 1.0),
            text: req.text,
            tool_choice: req.tool_choice.unwrap_or_else(|| json!("auto")),
            tools: req.tools.unwrap_or_default(),
            top_p: number(req.top_p, 1.0),
            presence_penalty: number(req.presence_penalty, 0.0),
            frequency_penalty: number(req.frequency_penalty, 0.0),
            top_logprobs: req.top_logprobs.filter(Value::is_u64).unwrap_or(json!(0)),
            max_tool_calls: only(req.max_tool_calls, Value::is_u64),
            background: false,
            service_tier: "default",
            truncation: "disabled",
            user: only(req.user, Value::is_string),
            safety_identifier: only(req.safety_identifier, Value::is_string),
            prompt_cache_key: only(req.prompt_cache_key, Value::is_string),
        }
    }
}

/// Usage in the Responses shape.
#[derive(Serialize)]
pub struct UsageOut {
    input_tokens: u64,
    input_tokens_details: InputDetails,
    output_tokens: u64,
    output_tokens_details: OutputDetails,
    total_tokens: u64,
}

#[derive(Serialize)]
struct InputDetails {
    cached_tokens: u64,
    cache_write_tokens: u64,
}

#[derive(Serialize)]
struct OutputDetails {
    reasoning_tokens: u64,
}

impl UsageOut {
    pub fn of(u: Usage) -> UsageOut {
        UsageOut {
            input_tokens: u.prompt_tokens,
            input_tokens_details: InputDetails {
                cached_tokens: u.cached_tokens,
                cache_write_tokens: u.cache_write_tokens,
            },
            output_tokens: u.completion_tokens,
            output_tokens_details: OutputDetails {
                reasoning_tokens: u.reasoning_tokens,
            },
            total_tokens: u.total_tokens,
        }
    }
}

/// A response's identity.
pub struct Meta {
    pub id: String,
    pub created: u64,
}

/// The response object around `output` (`T`: a tree per item, or a typed item).
#[derive(Serialize)]
pub struct Object<'a, T: Serialize> {
    id: &'a str,
    object: &'static str,
    created_at: u64,
    status: &'a str,
    completed_at: Option<u64>,
    /// `{code, message}` of a failed response.
    error: Value,
    incomplete_details: Option<()>,
    #[serde(flatten)]
    envelope: &'a Envelope,
    output: &'a [T],
    usage: Option<UsageOut>,
}

impl<'a, T: Serialize> Object<'a, T> {
    pub fn new(
        meta: &'a Meta,
        envelope: &'a Envelope,
        status: &'a str,
        output: &'a [T],
        usage: Option<Usage>,
    ) -> Object<'a, T> {
        Object {
            id: &meta.id,
            object: "response",
            created_at: meta.created,
            status,
            completed_at: (status == "completed").then(crate::store::now_unix),
            error: Value::Null,
            incomplete_details: None,
            envelope,
            output,
            usage: usage.map(UsageOut::of),
        }
    }

    /// A failed response's `error`.
    pub fn failed(mut self, error: Value) -> Self {
        self.error = error;
        self
    }

    /// The object as a tree (the events carry it so).
    pub fn tree(&self) -> Value {
        // Cannot fail: strings, numbers and trees.
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// An output item of a whole answer: a message, typed, or any other item as a tree.
#[derive(Serialize)]
#[serde(untagged)]
pub enum Item {
    Message(MessageItem),
    Tree(Value),
}

/// A completed assistant message with one `output_text` part.
#[derive(Serialize)]
pub struct MessageItem {
    id: String,
    r#type: &'static str,
    status: &'static str,
    role: &'static str,
    content: [OutputText; 1],
}

#[derive(Serialize)]
struct OutputText {
    r#type: &'static str,
    text: String,
    annotations: [(); 0],
    logprobs: [(); 0],
}

impl MessageItem {
    pub fn completed(id: String, text: String) -> MessageItem {
        MessageItem {
            id,
            r#type: "message",
            status: "completed",
            role: "assistant",
            content: [OutputText {
                r#type: "output_text",
                text,
                annotations: [],
                logprobs: [],
            }],
        }
    }
}
