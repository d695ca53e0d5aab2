//! The response object and its event stream, as OpenAI streams them: `response.created`,
//! `response.in_progress`, then per output item `response.output_item.added`, its content
//! (`content_part.added`, `output_text.delta`..., `output_text.done`, `content_part.done`, or
//! a call's arguments / input delta and done) and `response.output_item.done` with the item
//! **complete**, and exactly one terminal `response.completed` / `response.failed`. Every
//! event has `type` and a `sequence_number` from 0, and an `event:` line naming it. An error
//! decided before the first byte is a real HTTP status; after it, `response.failed` ends the
//! stream. Silent stretches carry `: keep-alive` comments.
//!
//! Reasoning the backend shows is a `reasoning` item whose one `summary_text` part streams as
//! `response.reasoning_summary_part.added`, `response.reasoning_summary_text.delta`...,
//! `.text.done`, `.part.done`, before the text it preceded.
//!
//! Each leg of an execution answers as the same response (`resp_` + the execution id). Calls
//! are shown as the client declared them (`ToolMap`): a `function_call` (with its `namespace`
//! if it had one) or a `custom_tool_call` whose `input` is the function form's `input`.

use std::time::Duration;

use serde_json::{json, Value};

use super::object::{Item, MessageItem, Meta, Object};
use super::{error_body, response_id, Framing};
use crate::engine::{Leg, LegEvent};
use crate::error::ApiError;
use crate::surface::sse;
use crate::surface::Answer;
use crate::turn::{ExposedCall, Usage};

/// The client's form of one exposed call, complete.
fn call_item(c: &ExposedCall, f: &Framing) -> Value {
    let id = format!("fc_{}", c.id.trim_start_matches("srct-"));
    let tool = f.map.client(&c.name);
    let name = tool.map_or(c.name.as_str(), |t| t.name.as_str());
    let mut item = if tool.is_some_and(|t| t.custom) {
        let input = serde_json::from_str::<Value>(&c.arguments)
            .ok()
            .and_then(|v| v["input"].as_str().map(str::to_string))
            .unwrap_or_else(|| c.arguments.clone());
        json!({"id": id, "type": "custom_tool_call", "status": "completed", "call_id": c.id,
               "name": name, "input": input})
    } else {
        json!({"id": id, "type": "function_call", "status": "completed", "call_id": c.id,
               "name": name, "arguments": c.arguments})
    };
    if let Some(ns) = tool.and_then(|t| t.namespace.as_deref()) {
        item["namespace"] = json!(ns);
    }
    item
}

fn reasoning_item(id: &str, text: &str) -> Value {
    json!({"id": id, "type": "reasoning", "summary": [{"type": "summary_text", "text": text}]})
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content = if status == "completed" {
        json!([{"type": "output_text", "text": text, "annotations": [], "logprobs": []}])
    } else {
        json!([])
    };
    json!({"id": id, "type": "message", "status": status, "role": "assistant", "content": content})
}

fn meta(leg: &Leg) -> Meta {
    Meta {
        id: response_id(&leg.execution_id),
        created: leg.created,
    }
}

/// The event stream of one response, as JSON events: the SSE body renders them as `event:` /
/// `data:` pairs, the WebSocket transport sends each as a text frame.
pub struct Framer {
    f: Framing,
    leg: Meta,
    seq: u64,
    /// The open message item: its id and text so far.
    message: Option<(String, String)>,
    /// The open reasoning item: its id and summary text so far.
    reasoning: Option<(String, String)>,
    /// Finished output items.
    output: Vec<Value>,
}

impl sse::Frame for Framer {
    fn opening(&mut self) -> String {
        sse_text(Framer::opening(self))
    }

    fn frame(&mut self, ev: LegEvent) -> (String, bool) {
        if let LegEvent::Approval(n) = &ev {
            let text = n.text().map(|t| sse::notice_comment(&t));
            return (text.unwrap_or_default(), false);
        }
        let (events, done) = Framer::frame(self, ev);
        (sse_text(events), done)
    }
}

/// Events as SSE text, each with an `event:` line naming it.
pub fn sse_text(events: Vec<Value>) -> String {
    let mut out = String::new();
    for v in events {
        let kind = v["type"].as_str().unwrap_or_default().to_string();
        out.push_str(&format!("event: {kind}\ndata: {v}\n\n"));
    }
    out
}

impl Framer {
    pub fn new(leg: &Leg, framing: Framing) -> Framer {
        Framer::of(meta(leg), framing)
    }

    fn of(leg: Meta, framing: Framing) -> Framer {
        Framer {
            leg,
            f: framing,
            seq: 0,
            message: None,
            reasoning: None,
            output: Vec::new(),
        }
    }

    fn reason(&mut self, out: &mut Vec<Value>, r: &str) {
        self.close_message(out);
        let index = self.output.len();
        if self.reasoning.is_none() {
            let id = crate::ids::new_id("rs_");
            let item = json!({"id": id, "type": "reasoning", "summary": []});
            self.event(
                out,
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            );
            self.event(
                out,
                "response.reasoning_summary_part.added",
                json!({"item_id": id, "output_index": index, "summary_index": 0,
                       "part": {"type": "summary_text", "text": ""}}),
            );
            self.reasoning = Some((id, String::new()));
        }
        let Some((id, text)) = self.reasoning.as_mut() else {
            return;
        };
        text.push_str(r);
        let v = json!({"item_id": id, "output_index": index, "summary_index": 0, "delta": r});
        self.event(out, "response.reasoning_summary_text.delta", v);
    }

    fn close_reasoning(&mut self, out: &mut Vec<Value>) {
        let Some((id, text)) = self.reasoning.take() else {
            return;
        };
        let index = self.output.len();
        let at = json!({"item_id": id, "output_index": index, "summary_index": 0});
        let mut done = at.clone();
        done["text"] = json!(text);
        self.event(out, "response.reasoning_summary_text.done", done);
        let mut part = at;
        part["part"] = json!({"type": "summary_text", "text": text});
        self.event(out, "response.reasoning_summary_part.done", part);
        let item = reasoning_item(&id, &text);
        self.event(
            out,
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.output.push(item);
    }

    fn event(&mut self, out: &mut Vec<Value>, kind: &str, mut v: Value) {
        v["type"] = json!(kind);
        v["sequence_number"] = json!(self.seq);
        self.seq += 1;
        out.push(v);
    }

    /// `response.created` and `response.in_progress`.
    pub fn opening(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        let r = Object::<Value>::new(&self.leg, &self.f.envelope, "in_progress", &[], None).tree();
        self.event(&mut out, "response.created", json!({"response": r}));
        self.event(&mut out, "response.in_progress", json!({"response": r}));
        out
    }

    fn delta(&mut self, out: &mut Vec<Value>, d: &str) {
        self.close_reasoning(out);
        let index = self.output.len();
        if self.message.is_none() {
            let id = crate::ids::new_id("msg_");
            self.event(
                out,
                "response.output_item.added",
                json!({"output_index": index, "item": message_item(&id, "", "in_progress")}),
            );
            self.event(
                out,
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0,
                       "part": {"type": "output_text", "text": "", "annotations": []}}),
            );
            self.message = Some((id, String::new()));
        }
        let Some((id, text)) = self.message.as_mut() else {
            return;
        };
        text.push_str(d);
        let v = json!({"item_id": id, "output_index": index, "content_index": 0, "delta": d,
                       "logprobs": []});
        self.event(out, "response.output_text.delta", v);
    }

    fn close_message(&mut self, out: &mut Vec<Value>) {
        let Some((id, text)) = self.message.take() else {
            return;
        };
        let index = self.output.len();
        self.event(
            out,
            "response.output_text.done",
            json!({"item_id": id, "output_index": index, "content_index": 0, "text": text,
                   "logprobs": []}),
        );
        self.event(
            out,
            "response.content_part.done",
            json!({"item_id": id, "output_index": index, "content_index": 0,
                   "part": {"type": "output_text", "text": text, "annotations": []}}),
        );
        let item = message_item(&id, &text, "completed");
        self.event(
            out,
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.output.push(item);
    }

    fn call(&mut self, out: &mut Vec<Value>, c: &ExposedCall) {
        let index = self.output.len();
        let item = call_item(c, &self.f);
        let id = item["id"].clone();
        let mut added = item.clone();
        added["status"] = json!("in_progress");
        let custom = item["type"] == "custom_tool_call";
        let (field, kind) = if custom {
            ("input", "response.custom_tool_call_input")
        } else {
            ("arguments", "response.function_call_arguments")
        };
        let full = item[field].clone();
        added[field] = json!("");
        self.event(
            out,
            "response.output_item.added",
            json!({"output_index": index, "item": added}),
        );
        self.event(
            out,
            &format!("{kind}.delta"),
            json!({"item_id": id, "output_index": index, "delta": full}),
        );
        let mut done = json!({"item_id": id, "output_index": index});
        done[field] = full;
        if !custom {
            done["name"] = item["name"].clone();
        }
        self.event(out, &format!("{kind}.done"), done);
        self.event(
            out,
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.output.push(item);
    }

    /// Frames one leg event; returns its events and whether the response is finished.
    pub fn frame(&mut self, ev: LegEvent) -> (Vec<Value>, bool) {
        let mut out = Vec::new();
        match ev {
            LegEvent::Delta(d) => self.delta(&mut out, &d),
            LegEvent::Reasoning(r) => self.reason(&mut out, &r),
            LegEvent::Relayed(_)
            | LegEvent::Truncated
            | LegEvent::Approval(_)
            | LegEvent::ToolEnded(_) => {}
            LegEvent::End { calls, usage } => {
                self.close_reasoning(&mut out);
                self.close_message(&mut out);
                for c in &calls {
                    self.call(&mut out, c);
                }
                let r = Object::new(
                    &self.leg,
                    &self.f.envelope,
                    "completed",
                    &self.output,
                    Some(usage),
                )
                .tree();
                self.event(&mut out, "response.completed", json!({"response": r}));
                return (out, true);
            }
            LegEvent::Error(e) => {
                self.close_reasoning(&mut out);
                self.close_message(&mut out);
                let body = error_body(&ApiError::from(e));
                let error =
                    json!({"code": body["error"]["code"], "message": body["error"]["message"]});
                let r = Object::new(&self.leg, &self.f.envelope, "failed", &self.output, None)
                    .failed(error)
                    .tree();
                self.event(&mut out, "response.failed", json!({"response": r}));
                return (out, true);
            }
        }
        (out, false)
    }
}

/// The whole event stream of a response that ran no leg: `output` as finished items (none for
/// a `generate: false` response, one `compaction` item for a compaction).
pub fn finished(framing: Framing, id: &str, output: Vec<Value>, usage: Usage) -> Vec<Value> {
    let leg = Meta {
        id: id.to_string(),
        created: crate::store::now_unix(),
    };
    let mut f = Framer::of(leg, framing);
    let mut out = f.opening();
    for item in output {
        let index = f.output.len();
        let v = json!({"output_index": index, "item": item});
        f.event(&mut out, "response.output_item.added", v.clone());
        f.event(&mut out, "response.output_item.done", v);
        f.output.push(item);
    }
    let r = Object::new(&f.leg, &f.f.envelope, "completed", &f.output, Some(usage)).tree();
    f.event(&mut out, "response.completed", json!({"response": r}));
    out
}

/// The streaming body.
pub async fn stream(
    leg: Leg,
    framing: Framing,
    keepalive: Duration,
) -> Result<sse::Body, ApiError> {
    let framer = Framer::new(&leg, framing);
    sse::stream(leg, framer, keepalive).await
}

/// Non-streaming: waits for the leg's end and answers one response object, written from its
/// typed parts.
pub async fn collect(mut leg: Leg, framing: Framing) -> Result<Answer, ApiError> {
    let meta = meta(&leg);
    let mut text = String::new();
    let mut thought = String::new();
    while let Some(ev) = leg.events.recv().await {
        match ev {
            LegEvent::Delta(d) => text.push_str(&d),
            LegEvent::Reasoning(r) => thought.push_str(&r),
            LegEvent::Relayed(_)
            | LegEvent::Approval(_)
            | LegEvent::Truncated
            | LegEvent::ToolEnded(_) => {}
            LegEvent::Error(e) => return Err(e.into()),
            LegEvent::End { calls, usage } => {
                let mut output = Vec::new();
                if !thought.is_empty() {
                    let id = crate::ids::new_id("rs_");
                    output.push(Item::Tree(reasoning_item(&id, &thought)));
                }
                if !text.is_empty() {
                    let id = crate::ids::new_id("msg_");
                    output.push(Item::Message(MessageItem::completed(id, text)));
                }
                output.extend(calls.iter().map(|c| Item::Tree(call_item(c, &framing))));
                let object =
                    Object::new(&meta, &framing.envelope, "completed", &output, Some(usage));
                // Cannot fail: strings, numbers and trees.
                let body = serde_json::to_vec(&object).unwrap_or_default();
                return Ok(Answer::Raw(body.into()));
            }
        }
    }
    Err(ApiError::upstream())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::EngineError;
    use crate::surface::responses::tools;

    fn framer() -> Framer {
        let tools = [
            json!({"type": "custom", "name": "apply_patch"}),
            json!({"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "f"}]}),
        ];
        Framer {
            f: Framing {
                stream: true,
                envelope: Default::default(),
                map: tools::read(Some(&tools), false).map,
            },
            leg: Meta {
                id: "resp_1".into(),
                created: 7,
            },
            seq: 0,
            message: None,
            reasoning: None,
            output: Vec::new(),
        }
    }

    #[test]
    fn reasoning_is_an_item_with_a_summary_before_the_text() {
        let mut f = framer();
        let mut ev = f.opening();
        ev.extend(f.frame(LegEvent::Reasoning("Think".into())).0);
        ev.extend(f.frame(LegEvent::Reasoning("ing.".into())).0);
        ev.extend(f.frame(LegEvent::Delta("Hi".into())).0);
        let (end, _) = f.frame(LegEvent::End {
            calls: Vec::new(),
            usage: Usage::default(),
        });
        ev.extend(end);
        let kinds: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds[2..9],
            [
                "response.output_item.added",
                "response.reasoning_summary_part.added",
                "response.reasoning_summary_text.delta",
                "response.reasoning_summary_text.delta",
                "response.reasoning_summary_text.done",
                "response.reasoning_summary_part.done",
                "response.output_item.done",
            ]
        );
        let done = &ev.last().unwrap()["response"]["output"];
        assert_eq!(done[0]["type"], "reasoning");
        assert_eq!(done[0]["summary"][0]["text"], "Thinking.");
        assert_eq!(done[1]["content"][0]["text"], "Hi");
        assert_eq!(ev[8]["output_index"], 0);
        assert_eq!(ev[9]["output_index"], 1);
    }

    fn events(text: &str) -> Vec<Value> {
        text.split("\n\n")
            .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }

    #[test]
    fn event_order_and_sequence_numbers() {
        let mut f = framer();
        let mut ev = f.opening();
        ev.extend(f.frame(LegEvent::Delta("he".into())).0);
        ev.extend(f.frame(LegEvent::Delta("y".into())).0);
        let calls = vec![
            ExposedCall {
                id: "srct-a".into(),
                name: "apply_patch".into(),
                arguments: r#"{"input":"*** Begin"}"#.into(),
            },
            ExposedCall {
                id: "srct-b".into(),
                name: "ns__f".into(),
                arguments: "{}".into(),
            },
        ];
        let (end, done) = f.frame(LegEvent::End {
            calls,
            usage: Usage::default(),
        });
        assert!(done);
        ev.extend(end);
        // The SSE rendering names each event and carries it whole.
        assert_eq!(events(&sse_text(ev.clone())), ev);
        let kinds: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.custom_tool_call_input.delta",
                "response.custom_tool_call_input.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (i, e) in ev.iter().enumerate() {
            assert_eq!(e["sequence_number"], i as u64);
        }
        assert_eq!(ev[6]["text"], "hey");
        let custom = &ev[12]["item"];
        assert_eq!(
            (custom["type"].as_str(), custom["input"].as_str()),
            (Some("custom_tool_call"), Some("*** Begin"))
        );
        let call = &ev[16]["item"];
        assert_eq!(
            (call["name"].as_str(), call["namespace"].as_str()),
            (Some("f"), Some("ns"))
        );
        assert_eq!(call["call_id"], "srct-b");
        let done = &ev[17]["response"];
        assert_eq!(done["status"], "completed");
        assert_eq!(done["output"].as_array().unwrap().len(), 3);
        assert_eq!(done["output"][0]["content"][0]["text"], "hey");
    }

    #[test]
    fn an_error_after_the_first_byte_fails_the_response() {
        let mut f = framer();
        f.opening();
        let (ev, done) = f.frame(LegEvent::Error(EngineError::TurnFailed));
        assert!(done);
        assert_eq!(ev[0]["type"], "response.failed");
        assert_eq!(ev[0]["response"]["status"], "failed");
        assert_eq!(ev[0]["response"]["error"]["code"], "upstream_error");
        assert_eq!(ev[0]["sequence_number"], 2);
    }
}
