//! Every answer the e2e suite receives, checked against the published contract of its API:
//! the JSON Schemas in `tests/schemas/`, derived from the pinned official SDKs' typed models
//! and tightened by the published references (`tests/schemas/derive.py`, `README.md`). The
//! request helpers of each surface call [`check`] on every 200 body and stream event and on
//! every error body, so a field that goes missing fails a test the day it goes missing.

use std::sync::OnceLock;

use jsonschema::Validator;
use serde_json::Value;

/// One published shape.
#[derive(Debug, Clone, Copy)]
pub enum Wire {
    ChatCompletion,
    ChatChunk,
    Response,
    ResponseEvent,
    Message,
    MessageEvent,
    MessageError,
    OpenAiError,
    GenerateContentResponse,
    CountTokensResponse,
    ListModelsResponse,
    GoogleModel,
    GoogleError,
}

impl Wire {
    const ALL: usize = 13;

    fn index(self) -> usize {
        self as usize
    }

    fn text(self) -> &'static str {
        match self {
            Wire::ChatCompletion => include_str!("../../schemas/chat.completion.json"),
            Wire::ChatChunk => include_str!("../../schemas/chat.completion.chunk.json"),
            Wire::Response => include_str!("../../schemas/responses.response.json"),
            Wire::ResponseEvent => include_str!("../../schemas/responses.event.json"),
            Wire::Message => include_str!("../../schemas/messages.message.json"),
            Wire::MessageEvent => include_str!("../../schemas/messages.event.json"),
            Wire::MessageError => include_str!("../../schemas/messages.error.json"),
            Wire::OpenAiError => include_str!("../../schemas/openai.error.json"),
            Wire::GenerateContentResponse => include_str!("../../schemas/gemini.response.json"),
            Wire::CountTokensResponse => include_str!("../../schemas/gemini.count_tokens.json"),
            Wire::ListModelsResponse => include_str!("../../schemas/gemini.models.json"),
            Wire::GoogleModel => include_str!("../../schemas/gemini.model.json"),
            Wire::GoogleError => include_str!("../../schemas/gemini.error.json"),
        }
    }
}

fn validator(wire: Wire) -> &'static Validator {
    static ALL: [OnceLock<Validator>; Wire::ALL] = [const { OnceLock::new() }; Wire::ALL];
    ALL[wire.index()].get_or_init(|| {
        let schema: Value = serde_json::from_str(wire.text()).expect("schema JSON");
        jsonschema::draft202012::new(&schema).expect("a valid schema")
    })
}

/// Panics, naming every violation, unless `v` is a valid `wire` document.
#[track_caller]
pub fn check(wire: Wire, v: &Value) {
    let errors: Vec<String> = validator(wire)
        .iter_errors(v)
        .map(|e| format!("  at {}: {e}", e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{wire:?} does not match its published schema:\n{}\n{v}",
        errors.join("\n")
    );
}

/// The error body of an OpenAI-shaped route (Chat Completions, Responses).
#[track_caller]
pub fn check_openai(status: u16, v: &Value, ok: Wire) {
    match status {
        200 => check(ok, v),
        _ => check(Wire::OpenAiError, v),
    }
}

#[test]
fn the_schemas_refuse_what_the_contracts_refuse() {
    let good = serde_json::json!({"id": "c", "object": "chat.completion", "created": 1,
        "model": "m", "choices": [{"index": 0, "finish_reason": "stop", "logprobs": null,
        "message": {"role": "assistant", "content": "hi", "refusal": null, "annotations": []}}]});
    check(Wire::ChatCompletion, &good);
    let mut bad = good.clone();
    bad["system_fingerprint"] = Value::Null;
    assert!(!validator(Wire::ChatCompletion).is_valid(&bad));
    let mut bad = good;
    bad["choices"][0]["message"]
        .as_object_mut()
        .unwrap()
        .remove("annotations");
    assert!(!validator(Wire::ChatCompletion).is_valid(&bad));
}
