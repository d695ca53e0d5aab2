//! The neutral vocabulary of a turn, shared by surfaces, the engine and backends: what a client
//! asked for (messages, tools, tool choice, options), the continuation fingerprint its surface
//! computed, and what a backend answers with (usage). Nothing here knows a wire format: a
//! surface translates its own request into a [`TurnInput`], and a backend reads only this.

use serde_json::Value;
use tokio::time::Instant;

/// The client API a turn arrived on (the tag stored with a suspension). A token is answered
/// only on the surface that issued it, because each surface computes its fingerprint from its
/// own canonical projection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SurfaceId {
    Chat,
    Responses,
    Messages,
    Gemini,
    /// The Managed Agents API's sessions (`src/managed/`).
    Managed,
}

impl SurfaceId {
    pub fn as_str(self) -> &'static str {
        match self {
            SurfaceId::Chat => "chat",
            SurfaceId::Responses => "responses",
            SurfaceId::Messages => "messages",
            SurfaceId::Gemini => "gemini",
            SurfaceId::Managed => "managed",
        }
    }

    /// A surface whose clients may answer by reference (`previous_response_id`): its
    /// suspensions keep the conversation so that the reference can be expanded.
    pub fn keeps_history(self) -> bool {
        self == SurfaceId::Responses
    }

    pub fn parse(s: &str) -> Option<SurfaceId> {
        match s {
            "chat" => Some(SurfaceId::Chat),
            "responses" => Some(SurfaceId::Responses),
            "messages" => Some(SurfaceId::Messages),
            "gemini" => Some(SurfaceId::Gemini),
            "managed" => Some(SurfaceId::Managed),
            _ => None,
        }
    }
}

/// Who wrote a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
    /// A role this gateway does not interpret (kept for the transcript).
    Other(String),
}

impl Role {
    pub fn parse(s: &str) -> Role {
        match s {
            "system" => Role::System,
            "developer" => Role::Developer,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            other => Role::Other(other.to_string()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
            Role::Other(s) => s,
        }
    }

    /// System and developer messages instruct; they are not turns of the conversation.
    pub fn instructs(&self) -> bool {
        matches!(self, Role::System | Role::Developer)
    }
}

/// One message of the conversation, reduced to what carries meaning for a backend.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: Role,
    /// The text of the content (text parts joined with no separator).
    pub text: String,
    /// Image URLs of the content (data URLs included), for surfaces that carry them.
    pub images: Vec<String>,
    pub name: Option<String>,
    /// The tool calls of an assistant message.
    pub tool_calls: Vec<Call>,
    /// For a tool result: the id of the call it answers.
    pub tool_call_id: Option<String>,
    /// For a tool result: the client reported the call as failed (Anthropic `is_error`).
    pub is_error: bool,
}

impl Message {
    /// A message of `role` with only text.
    pub fn text(role: Role, text: &str) -> Message {
        Message::new(role, text.to_string(), Vec::new())
    }

    /// A message of `role` with text and image URLs, no calls.
    pub fn new(role: Role, text: String, images: Vec<String>) -> Message {
        Message {
            role,
            text,
            images,
            name: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            is_error: false,
        }
    }

    /// The bytes of text it holds (what keeping it in memory costs, near enough).
    pub fn kept_bytes(&self) -> usize {
        let calls: usize = self
            .tool_calls
            .iter()
            .map(|c| c.id.len() + c.name.len() + c.arguments.len())
            .sum();
        let images: usize = self.images.iter().map(String::len).sum();
        let ids = self.name.as_ref().map_or(0, String::len)
            + self.tool_call_id.as_ref().map_or(0, String::len);
        self.text.len() + images + calls + ids
    }
}

/// A tool call as it appears in a conversation (the id is whatever the client sent).
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub id: String,
    pub name: String,
    /// JSON text of the arguments.
    pub arguments: String,
}

/// A client tool definition, reduced to what a backend needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDef {
    pub name: String,
    pub description: String,
    pub parameters: Value,
}

/// The client's tool choice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    /// One named function.
    Named(String),
    /// A value the surface could not read; a backend that enforces tool choice refuses it.
    Invalid,
}

/// How hard the backend should reason, in the OpenAI vocabulary that both OpenAI surfaces
/// and Codex share. Each surface maps its own field onto it (unknown values are 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effort {
    None,
    Minimal,
    Low,
    Medium,
    High,
    XHigh,
}

impl Effort {
    /// The OpenAI value (`reasoning_effort`, `reasoning.effort`).
    pub fn parse(s: &str) -> Option<Effort> {
        Some(match s {
            "none" => Effort::None,
            "minimal" => Effort::Minimal,
            "low" => Effort::Low,
            "medium" => Effort::Medium,
            "high" => Effort::High,
            "xhigh" => Effort::XHigh,
            _ => return None,
        })
    }

    /// The value a backend receives (Codex's `turn/start.effort`, an upstream's
    /// `reasoning_effort`).
    pub fn as_str(self) -> &'static str {
        match self {
            Effort::None => "none",
            Effort::Minimal => "minimal",
            Effort::Low => "low",
            Effort::Medium => "medium",
            Effort::High => "high",
            Effort::XHigh => "xhigh",
        }
    }

    /// Reads an OpenAI effort field: absent or null is none, a known string is that effort,
    /// anything else is a 400 on `param`.
    pub fn read(
        v: Option<&Value>,
        param: &'static str,
    ) -> Result<Option<Effort>, crate::error::ApiError> {
        match v {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Effort::parse(s).map(Some).ok_or_else(|| {
                crate::error::ApiError::invalid(format!(
                    "`{param}` must be one of \"none\", \"minimal\", \"low\", \"medium\", \"high\", \"xhigh\""
                ))
                .with_param(param)
            }),
            Some(_) => Err(crate::error::ApiError::invalid(format!("`{param}` must be a string")).with_param(param)),
        }
    }
}

/// The tool-side digests of a request, for the suspension its leg may reach: the canonical
/// tool set, the tool choice and the whole conversation as sent (the prefix of whatever
/// assistant message the leg produces).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    pub tools: [u8; 32],
    pub tool_choice: [u8; 32],
    pub prefix: [u8; 32],
}

/// A request that answers tool calls: the surface found trailing results for an assistant
/// message whose call ids all have the `srct-` shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Continuation {
    /// Index in [`TurnInput::messages`] of the assistant message carrying the calls.
    pub assistant: usize,
    /// Digests of that message's call ids, in order (duplicates kept: they are drift).
    pub tokens: Vec<[u8; 32]>,
    /// Each trailing result: the digest of the id it answers and its message index.
    pub results: Vec<([u8; 32], usize)>,
    /// Digest of every message before the assistant message.
    pub prefix: [u8; 32],
    /// Digest of the assistant message as the client sent it back.
    pub echo: [u8; 32],
    /// The execution the client named (`previous_response_id`): the batch must be its own,
    /// else the continuation is unknown.
    pub bound: Option<String>,
}

/// A surface's echo projection: the digest of an assistant message carrying `calls` after
/// `text`, as the client will send it back.
pub type EchoFn = fn(&str, &[ExposedCall]) -> [u8; 32];

/// A surface's message projection: the digest of one message of its conversation.
pub type DigestFn = fn(&Message) -> [u8; 32];

/// A surface's id for the answer of an execution's leg after `round` tool rounds (for traces).
pub type ResponseIdFn = fn(&str, u32) -> String;

/// One client request, translated by its surface.
#[derive(Debug, Clone)]
pub struct TurnInput {
    pub surface: SurfaceId,
    /// How this surface digests the assistant message a suspension exposes.
    pub echo: EchoFn,
    /// How this surface digests one message (the assistant message a suspension exposes,
    /// when the suspension keeps the conversation's digests).
    pub digest: DigestFn,
    /// How this surface names a leg's answer.
    pub response_id: ResponseIdFn,
    pub model: String,
    pub messages: Vec<Message>,
    /// The digest of each message, in order, once [`TurnInput::digested`].
    pub message_digests: Vec<[u8; 32]>,
    /// `message_digests` and the fingerprint's `prefix` are computed: a continuation's when
    /// it is read, an agent's turn's before it starts, a stateless leg's only if it suspends
    /// ([`TurnInput::digest_messages`]); a relayed request that just answers digests nothing.
    pub digested: bool,
    /// The client's tools, or why they could not be read (a backend that declares tools to
    /// an agent refuses the request; a stateless upstream receives them as sent).
    pub tools: Result<Vec<ToolDef>, String>,
    pub tool_choice: ToolChoice,
    /// The reasoning effort asked for (bound in the `tool_choice` digest).
    pub effort: Option<Effort>,
    pub parallel_tool_calls: bool,
    /// The client wants the answer streamed (a stateless upstream is asked the same).
    pub stream: bool,
    pub fingerprint: Fingerprint,
    pub continuation: Option<Box<Continuation>>,
    /// A fresh turn that continues the conversation of this completed execution, named by
    /// reference (`previous_response_id` with new input only).
    pub follows: Option<String>,
    /// The trailing tool results answer the client's own call ids (not `srct-`): ordinary
    /// history that a stateless upstream receives as sent and a stateful backend refuses.
    pub client_tool_history: bool,
    /// The request body as the client sent it, for a backend that speaks the same wire: it
    /// is relayed with only `model` renamed, so fields the gateway does not interpret reach
    /// the upstream untouched.
    pub passthrough: Option<Passthrough>,
    /// Sampling options a backend that builds its own request body passes on (boxed: the
    /// input is moved through several futures, and these are rarely all set).
    pub sampling: Box<Sampling>,
    /// A turn of the gateway's own (a compaction's summary): it runs on a fresh thread and
    /// its thread is not kept for the conversation.
    pub ephemeral: bool,
    /// When the request arrived (the time until the backend is engaged is gateway overhead).
    pub arrived: Instant,
    /// A spend cap of this execution's own (nano-USD), applied with the principal's
    /// per-execution cap (the tighter wins): what is left of a Managed Agents session's budget.
    pub usd_cap: Option<u64>,
    /// An approval policy of this execution's own, which narrows the model's (never
    /// widens it): a Managed Agents session's permission policies.
    pub approvals: Option<crate::config::ApprovalPolicy>,
    /// The agent's working folder for this execution, over its backend's `cwd`: a Managed
    /// Agents session's own folder.
    pub cwd: Option<std::path::PathBuf>,
    /// The conversation traces name (`gen_ai.conversation.id`) when it is not the execution:
    /// a Managed Agents session.
    pub conversation: Option<String>,
}

impl TurnInput {
    /// Digests each message and the conversation (the fingerprint's prefix), once.
    pub fn digest_messages(&mut self) {
        if !self.digested {
            (self.message_digests, self.fingerprint.prefix) = digests(&self.messages, self.digest);
            self.digested = true;
        }
    }
}

/// The digest of each message with `digest`, and of the conversation.
pub fn digests(messages: &[Message], digest: DigestFn) -> (Vec<[u8; 32]>, [u8; 32]) {
    let each: Vec<[u8; 32]> = messages.iter().map(digest).collect();
    let all = crate::continuation::canonical::digest_of_digests(&each);
    (each, all)
}

/// A wire format a request body can be relayed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    ChatCompletions,
}

/// A backend's own answer body or stream chunk in a client wire (Chat Completions, the only
/// [`Wire`] relayed today), its `model` renamed: a surface that speaks that wire relays it.
#[derive(Debug)]
pub enum Relayed {
    /// No tool calls in it: relayed byte for byte. `finish`: it has a `finish_reason`.
    Raw { json: String, finish: bool },
    /// Read as a tree, its tool calls taken out.
    Tree(serde_json::Value),
}

impl Relayed {
    /// Whether the first choice has a `finish_reason`.
    pub fn finishes(&self) -> bool {
        match self {
            Relayed::Raw { finish, .. } => *finish,
            Relayed::Tree(v) => v["choices"][0]["finish_reason"].as_str().is_some(),
        }
    }

    /// As a tree (parsed only on the tool-call paths, which rewrite it).
    pub fn into_value(self) -> serde_json::Value {
        match self {
            Relayed::Tree(v) => v,
            raw => raw.to_value(),
        }
    }

    /// A copy as a tree.
    pub fn to_value(&self) -> serde_json::Value {
        match self {
            Relayed::Raw { json, .. } => serde_json::from_str(json).unwrap_or_default(),
            Relayed::Tree(v) => v.clone(),
        }
    }

    /// One SSE `data:` event of it (a raw chunk framed in its own buffer).
    pub fn into_event(self) -> String {
        match self {
            Relayed::Raw { mut json, .. } => {
                json.insert_str(0, "data: ");
                json.push_str("\n\n");
                json
            }
            Relayed::Tree(v) => format!("data: {v}\n\n"),
        }
    }
}

/// A client's request body as it came, in `wire`.
#[derive(Debug, Clone)]
pub struct Passthrough {
    pub wire: Wire,
    pub body: bytes::Bytes,
    /// The body has cache hints (`prompt_cache_key`, `user`) that a shared upstream must
    /// receive scoped to the principal.
    pub cache_hints: bool,
}

/// Sampling options as the client gave them (values relayed as sent; `None` when absent or
/// null).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampling {
    pub max_tokens: Option<Value>,
    pub temperature: Option<Value>,
    pub top_p: Option<Value>,
    pub stop: Option<Value>,
    /// A key the provider's prompt cache may group requests by (it names no one).
    pub cache_key: Option<Value>,
    /// A structured-output request, in the Chat Completions shape.
    pub response_format: Option<Value>,
}

/// Token usage of one leg.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    /// Of `prompt_tokens`, those the provider served from its cache.
    pub cached_tokens: u64,
    /// Of `prompt_tokens`, those the provider wrote to its cache.
    pub cache_write_tokens: u64,
    /// Of `completion_tokens`, those spent reasoning.
    pub reasoning_tokens: u64,
}

impl Usage {
    /// The gateway's own estimate of a model call that reported no usage: a token per four
    /// bytes of what it was sent and of what it said, rounded up.
    pub fn estimate(sent_bytes: usize, said_bytes: usize) -> Usage {
        let prompt = sent_bytes.div_ceil(4) as u64;
        let completion = said_bytes.div_ceil(4) as u64;
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            ..Usage::default()
        }
    }

    /// Saturating: a backend's absurd count must not wrap a total.
    pub fn add(&mut self, other: Usage) {
        self.prompt_tokens = self.prompt_tokens.saturating_add(other.prompt_tokens);
        self.completion_tokens = self
            .completion_tokens
            .saturating_add(other.completion_tokens);
        self.total_tokens = self.total_tokens.saturating_add(other.total_tokens);
        self.cached_tokens = self.cached_tokens.saturating_add(other.cached_tokens);
        self.cache_write_tokens = self
            .cache_write_tokens
            .saturating_add(other.cache_write_tokens);
        self.reasoning_tokens = self.reasoning_tokens.saturating_add(other.reasoning_tokens);
    }
}

/// A tool call as exposed to the client: the id is a continuation token.
#[derive(Debug, Clone, PartialEq)]
pub struct ExposedCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}
