//! The spans the engine opens and ends itself (the GenAI ones): a place in a trace
//! ([`Parent`]), a span ended by its owner ([`Open`]), a leg's ([`LegSpan`]), a batch of held
//! calls' ([`Held`]), an approval's wait ([`Wait`]) and a forward's client span ([`forward`]).
//! Each is empty, and each method does nothing, when traces are off.

use opentelemetry::trace::{Link, SpanContext, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::{on, TRACER};
use crate::turn::Usage;

tokio::task_local! {
    /// The request a task serves: its server span, set once around the handler. A task-local
    /// rather than an entered `tracing` span: entering a span at every poll costs more than
    /// the handful of reads that need it.
    static REQUEST: Request;
}

struct Request {
    span: tracing::Span,
    cx: Context,
}

/// Runs `fut` (a request's handling) with `span` as its server span.
pub async fn in_request<F: std::future::Future>(span: tracing::Span, fut: F) -> F::Output {
    let cx = span.context();
    REQUEST.scope(Request { span, cx }, fut).await
}

/// Records the execution a request served on its server span.
pub fn record_execution(execution: &str) {
    if !on() {
        return;
    }
    let _ = REQUEST.try_with(|r| {
        r.span.record("gen_ai.conversation.id", execution);
    });
}

/// A place in a trace to start spans under; empty when traces are off.
#[derive(Clone, Default)]
// Boxed, so an execution that carries one stays a pointer bigger when traces are off.
pub struct Parent(pub(super) Option<Box<Context>>);

impl std::fmt::Debug for Parent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Parent(..)"
        } else {
            "Parent(none)"
        })
    }
}

impl Parent {
    /// The server span of the request this task serves ([`in_request`]), else none: a span
    /// started under it begins a trace of its own.
    pub fn current() -> Parent {
        if !on() {
            return Parent(None);
        }
        let cx = REQUEST.try_with(|r| r.cx.clone());
        Parent(Some(Box::new(cx.unwrap_or_default())))
    }

    /// This one when it is set, else the current request's.
    pub fn or_current(&self) -> Parent {
        match self.0 {
            Some(_) => self.clone(),
            None => Parent::current(),
        }
    }

    fn span_context(&self) -> Option<SpanContext> {
        let cx = self.0.as_ref()?;
        let sc = cx.span().span_context().clone();
        sc.is_valid().then_some(sc)
    }
}

/// A span this code ends: at [`Open::end`], or when dropped (as not completed).
pub struct Open(Option<Context>);

impl Drop for Open {
    fn drop(&mut self) {
        if let Some(cx) = self.0.take() {
            cx.span().end();
        }
    }
}

impl Open {
    fn start(
        parent: &Parent,
        name: String,
        kind: SpanKind,
        attributes: Vec<KeyValue>,
        link: Option<SpanContext>,
    ) -> Open {
        let (Some(tracer), Some(cx)) = (TRACER.get(), parent.0.as_ref()) else {
            return Open(None);
        };
        let mut builder = tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attributes);
        if let Some(link) = link {
            builder = builder.with_links(vec![Link::with_context(link)]);
        }
        let span = builder.start_with_context(tracer, cx);
        Open(Some(cx.with_span(span)))
    }

    /// A place under this span.
    pub fn parent(&self) -> Parent {
        Parent(self.0.clone().map(Box::new))
    }

    /// This span's W3C `traceparent`, for a request it makes.
    pub fn traceparent(&self) -> Option<String> {
        let cx = self.0.as_ref()?;
        let span = cx.span();
        let sc = span.span_context();
        let flags = sc.trace_flags().to_u8();
        sc.is_valid()
            .then(|| format!("00-{}-{}-{flags:02x}", sc.trace_id(), sc.span_id()))
    }

    fn set(&self, attributes: Vec<KeyValue>) {
        if let Some(cx) = &self.0 {
            cx.span().set_attributes(attributes);
        }
    }

    /// Ends the span as failed, with `error.type`.
    pub fn fail(mut self, error_type: &'static str) {
        if let Some(cx) = self.0.take() {
            let span = cx.span();
            span.set_attribute(KeyValue::new("error.type", error_type));
            span.set_status(Status::error(error_type));
            span.end();
        }
    }

    /// Ends the span with `attributes`.
    pub fn end(mut self, attributes: Vec<KeyValue>) {
        if let Some(cx) = self.0.take() {
            let span = cx.span();
            span.set_attributes(attributes);
            span.end();
        }
    }
}

/// What a leg's span says of it.
pub struct LegInfo<'a> {
    /// An agent backend (`invoke_agent`), else a stateless upstream (`chat`).
    pub agent: bool,
    pub provider: &'static str,
    pub model: &'a str,
    pub execution_id: &'a str,
    /// `gen_ai.conversation.id`: the execution, or the Managed Agents session it serves.
    pub conversation: &'a str,
    /// How the client's surface names the leg's answer (called only when traced).
    pub response_id: crate::turn::ResponseIdFn,
    /// Tool rounds of the execution before this leg.
    pub round: u32,
}

/// The span of one leg, under the execution's root, linked to the request that carries it
/// when that is another. Usage reported during the leg is added up and set at its end.
// One pointer when traces are off: an execution (and the leg's task) stays as small as it was.
pub struct LegSpan(Option<Box<Leg>>);

struct Leg {
    span: Open,
    usage: Usage,
}

impl LegSpan {
    pub fn none() -> LegSpan {
        LegSpan(None)
    }

    pub fn start(root: &Parent, info: LegInfo<'_>) -> LegSpan {
        if !on() {
            return LegSpan::none();
        }
        let here = Parent::current();
        let parent = root.or_current();
        let link = (here.span_context() != parent.span_context())
            .then(|| here.span_context())
            .flatten();
        let op = if info.agent { "invoke_agent" } else { "chat" };
        let attributes = vec![
            KeyValue::new("gen_ai.operation.name", op),
            // Trace stores built on OpenInference (Phoenix) show the span's kind from this.
            KeyValue::new(
                "openinference.span.kind",
                if info.agent { "AGENT" } else { "LLM" },
            ),
            KeyValue::new("gen_ai.provider.name", info.provider),
            KeyValue::new("gen_ai.request.model", info.model.to_string()),
            KeyValue::new("gen_ai.response.model", info.model.to_string()),
            KeyValue::new(
                "gen_ai.response.id",
                (info.response_id)(info.execution_id, info.round),
            ),
            KeyValue::new("gen_ai.conversation.id", info.conversation.to_string()),
            KeyValue::new("turnstile.round", i64::from(info.round)),
        ];
        let name = format!("{op} {}", info.model);
        LegSpan(Some(Box::new(Leg {
            span: Open::start(&parent, name, SpanKind::Client, attributes, link),
            usage: Usage::default(),
        })))
    }

    pub fn traceparent(&self) -> Option<String> {
        self.0.as_ref()?.span.traceparent()
    }

    pub fn parent(&self) -> Parent {
        self.0.as_ref().map(|l| l.span.parent()).unwrap_or_default()
    }

    /// One model request's usage, as the backend reported it.
    pub fn usage(&mut self, u: Usage) {
        if let Some(l) = &mut self.0 {
            l.usage.add(u);
        }
    }
}

impl Leg {
    fn usage_attributes(&self) -> Vec<KeyValue> {
        let u = &self.usage;
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        vec![
            KeyValue::new("gen_ai.usage.input_tokens", n(u.prompt_tokens)),
            KeyValue::new("gen_ai.usage.output_tokens", n(u.completion_tokens)),
            KeyValue::new("gen_ai.usage.cache_read.input_tokens", n(u.cached_tokens)),
            KeyValue::new(
                "gen_ai.usage.cache_creation.input_tokens",
                n(u.cache_write_tokens),
            ),
            KeyValue::new(
                "gen_ai.usage.reasoning.output_tokens",
                n(u.reasoning_tokens),
            ),
        ]
    }
}

impl LegSpan {
    /// The leg ended with an answer (`stop`) or held calls (`tool_calls`).
    pub fn finish(self, reason: &'static str) {
        let Some(l) = self.0 else {
            return;
        };
        let mut attributes = l.usage_attributes();
        attributes.push(KeyValue::new(
            "gen_ai.response.finish_reasons",
            opentelemetry::Value::Array(vec![opentelemetry::StringValue::from(reason)].into()),
        ));
        l.span.end(attributes);
    }

    /// The leg failed: `error.type` is the execution's end reason.
    pub fn fail(self, reason: &'static str) {
        let Some(l) = self.0 else {
            return;
        };
        l.span.set(l.usage_attributes());
        l.span.fail(reason);
    }
}

/// The `execute_tool {name}` spans of a batch of held calls, from the exposure of their
/// tokens to the claim of the batch. Dropped unclaimed (expired, lost, cancelled), they end
/// as failed.
// A thin pointer (a boxed Vec, not a boxed slice): it sits in every parked execution, and
// is None unless traces are on.
#[derive(Default)]
#[allow(clippy::box_collection)]
pub struct Held(pub(super) Option<Box<Vec<Open>>>);

impl Held {
    pub fn start<'a>(leg: &LegSpan, names: impl Iterator<Item = &'a str>, round: u32) -> Held {
        if leg.0.is_none() {
            return Held::default();
        }
        let parent = leg.parent();
        let spans = names
            .enumerate()
            .map(|(i, name)| {
                let attributes = vec![
                    KeyValue::new("gen_ai.operation.name", "execute_tool"),
                    KeyValue::new("openinference.span.kind", "TOOL"),
                    KeyValue::new("gen_ai.tool.name", name.to_string()),
                    KeyValue::new("gen_ai.tool.type", "function"),
                    KeyValue::new("turnstile.tool.call.position", i as i64),
                    KeyValue::new("turnstile.round", i64::from(round)),
                ];
                let span_name = format!("execute_tool {name}");
                Open::start(&parent, span_name, SpanKind::Internal, attributes, None)
            })
            .collect();
        Held(Some(Box::new(spans)))
    }

    /// The client's results claimed the batch.
    pub fn answered(mut self) {
        for span in self.0.take().into_iter().flat_map(|s| *s) {
            span.end(Vec::new());
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        for span in self.0.take().into_iter().flat_map(|s| *s) {
            span.fail("unanswered");
        }
    }
}

/// The wait of one approval, from its creation to its decision.
pub struct Wait(Open);

impl Wait {
    pub fn none() -> Wait {
        Wait(Open(None))
    }

    pub fn start(parent: &Parent, kind: &str, approval_id: &str) -> Wait {
        if !on() {
            return Wait::none();
        }
        let attributes = vec![
            KeyValue::new("turnstile.approval.id", approval_id.to_string()),
            KeyValue::new("turnstile.approval.kind", kind.to_string()),
        ];
        let name = format!("await_approval {kind}");
        Wait(Open::start(
            parent,
            name,
            SpanKind::Internal,
            attributes,
            None,
        ))
    }

    /// Decided: `approved` or `denied`, by `reason` (`human`, `expired`, `cancelled`, …).
    pub fn decided(self, decision: &'static str, reason: &'static str) {
        self.0.end(vec![
            KeyValue::new("turnstile.approval.decision", decision),
            KeyValue::new("turnstile.approval.reason", reason),
        ]);
    }
}

/// The client span of a request relayed to the owner replica; its `traceparent` goes with
/// the request.
pub fn forward(replica: &str) -> Open {
    if !on() {
        return Open(None);
    }
    let attributes = vec![
        KeyValue::new("http.request.method", "POST"),
        KeyValue::new("turnstile.replica.id", replica.to_string()),
    ];
    Open::start(
        &Parent::current(),
        "POST forward".into(),
        SpanKind::Client,
        attributes,
        None,
    )
}

impl Open {
    /// Ends a client span with the status its request got (0: no answer).
    pub fn answered(self, status: u16) {
        if status == 0 || status >= 500 {
            return self.fail("unavailable");
        }
        self.end(vec![KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        )]);
    }
}
