//! A running turn, as seen by its scenario task: emissions guarded by "still the active turn".

use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::protocol::Ctx;
use crate::state::{Pending, State};
use crate::util::{chunks, ended_turn, merge, now_ms, rand_hex};

/// The turn was interrupted (or otherwise ended): the scenario must stop.
pub(crate) struct Stopped;
pub(crate) type Step<T = ()> = Result<T, Stopped>;

pub(crate) struct Turn {
    pub(crate) ctx: Ctx,
    pub(crate) thread: String,
    pub(crate) id: String,
}

impl Turn {
    /// Runs `f` under the state lock, but only while this turn is still the thread's active
    /// turn: emissions are thereby atomic with respect to `turn/interrupt`.
    pub(crate) fn guarded<R>(&self, f: impl FnOnce(&mut State) -> R) -> Step<R> {
        let mut st = self.ctx.state.lock();
        match st.active_mut(&self.thread) {
            Some(a) if a.id == self.id => Ok(f(&mut st)),
            _ => Err(Stopped),
        }
    }
    /// Emits a notification whose params start with this turn's `threadId` and `turnId`.
    pub(crate) fn notify(&self, method: &str, extra: Value) -> Step {
        let params = merge(json!({"threadId": self.thread, "turnId": self.id}), extra);
        self.guarded(|_| self.ctx.notify(method, params))
    }
    pub(crate) fn item_started(&self, item: Value) -> Step {
        self.notify(
            "item/started",
            json!({"startedAtMs": now_ms(), "item": item}),
        )
    }
    pub(crate) fn item_completed(&self, item: Value) -> Step {
        self.notify(
            "item/completed",
            json!({"completedAtMs": now_ms(), "item": item}),
        )
    }
    pub(crate) fn status(&self, flags: &[&str]) -> Step {
        let status = json!({"type": "active", "activeFlags": flags});
        self.guarded(|_| {
            let params = json!({"threadId": self.thread, "status": status});
            self.ctx.notify("thread/status/changed", params)
        })
    }
    pub(crate) fn stream_text(&self, text: &str) -> Step {
        let id = format!("msg_{}", rand_hex::<8>());
        self.item_started(json!({"type": "agentMessage", "id": id, "text": ""}))?;
        for delta in chunks(text) {
            self.notify(
                "item/agentMessage/delta",
                json!({"itemId": id, "delta": delta}),
            )?;
        }
        self.item_completed(json!({"type": "agentMessage", "id": id, "text": text}))
    }
    /// A reasoning item whose summary streams in two parts.
    pub(crate) fn stream_reasoning(&self, parts: &[&str]) -> Step {
        let id = format!("rs_{}", rand_hex::<8>());
        self.item_started(json!({"type": "reasoning", "id": id, "summary": [], "content": []}))?;
        for (i, part) in parts.iter().enumerate() {
            self.notify(
                "item/reasoning/summaryPartAdded",
                json!({"itemId": id, "summaryIndex": i}),
            )?;
            for delta in chunks(part) {
                self.notify(
                    "item/reasoning/summaryTextDelta",
                    json!({"itemId": id, "delta": delta, "summaryIndex": i}),
                )?;
            }
        }
        self.item_completed(json!({"type": "reasoning", "id": id, "summary": parts, "content": []}))
    }

    /// A model request is in flight whose usage is reported later (when its calls are
    /// answered, or when the turn is interrupted).
    pub(crate) fn usage_pending(&self) -> Step {
        self.guarded(|st| {
            if let Some(a) = st.active_mut(&self.thread) {
                a.unreported = true;
            }
        })
    }

    pub(crate) fn report_usage(&self) -> Step {
        self.guarded(|st| {
            if let Some(a) = st.active_mut(&self.thread) {
                a.unreported = false;
            }
            report_usage(&self.ctx, st, &self.thread, &self.id);
        })
    }
    /// Emits `thread/status/changed` idle and `turn/completed`, and retires the turn.
    pub(crate) fn finish(&self, turn: Value) -> Step {
        self.guarded(|st| {
            let idle = json!({"threadId": self.thread, "status": {"type": "idle"}});
            self.ctx.notify("thread/status/changed", idle);
            self.ctx.notify(
                "turn/completed",
                json!({"threadId": self.thread, "turn": turn}),
            );
            if let Some(th) = st.threads.get_mut(&self.thread) {
                th.active = None;
            }
        })
    }
    pub(crate) fn complete(&self) -> Step {
        self.finish(ended_turn(&self.id, "completed", Value::Null))
    }
    /// Sends a server request (registering `open_call` as an open tool item, if given).
    pub(crate) fn request(
        &self,
        method: &str,
        params: Value,
        open_call: Option<Value>,
    ) -> Step<(u64, oneshot::Receiver<Value>)> {
        let (tx, rx) = oneshot::channel();
        self.guarded(|st| {
            let id = st.next_request_id;
            st.next_request_id += 1;
            let call_id = open_call
                .as_ref()
                .map(|c| c["id"].as_str().unwrap_or("").to_owned());
            if let (Some(call), Some(active)) = (open_call, st.active_mut(&self.thread)) {
                active.open_calls.push(call);
            }
            let (thread, turn, method) = (self.thread.clone(), self.id.clone(), method.to_owned());
            self.ctx
                .send(json!({"id": id, "method": method, "params": params}));
            st.pending.insert(
                id,
                Pending {
                    thread,
                    turn,
                    method,
                    call_id,
                    tx,
                },
            );
            (id, rx)
        })
    }
}

/// One model request's usage (10 in, 5 out, 2 of them reasoning), with the thread's total.
pub(crate) fn report_usage(ctx: &Ctx, st: &mut State, thread: &str, turn: &str) {
    let n = st.threads.get_mut(thread).map_or(1, |th| {
        th.usage_reports += 1;
        th.usage_reports
    });
    let usage = |k: u64| {
        json!({"totalTokens": 15 * k, "inputTokens": 10 * k, "cachedInputTokens": 0,
            "cacheWriteInputTokens": 0, "outputTokens": 5 * k, "reasoningOutputTokens": 2 * k})
    };
    let token_usage = json!({"total": usage(n), "last": usage(1), "modelContextWindow": 200000});
    let params = json!({"threadId": thread, "turnId": turn, "tokenUsage": token_usage});
    ctx.notify("thread/tokenUsage/updated", params);
    ctx.notify("account/rateLimits/updated", json!({"rateLimits": {}}));
}
