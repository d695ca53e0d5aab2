//! What an ACP turn costs while it runs. ACP reports a turn's usage once, in its
//! `session/prompt` response, and a held turn is one prompt across all its rounds; so the
//! gateway meters each round as it ends (at the agent's call of a client tool) from what it
//! saw: the context the agent last reported (`usage_update.used`, where the agent sends it),
//! else a token per four bytes of everything exchanged so far, and for the output a token
//! per four bytes the agent said. The prompt's own report then adds only what it has beyond
//! that, so a per-execution cap can stop the execution at its next round. The report itself
//! is read here too ([`reported`]).

use serde_json::Value;

use crate::turn::Usage;

#[derive(Debug, Default)]
pub(super) struct Metering {
    /// Metered so far in this prompt.
    metered: Usage,
    /// Bytes of the whole exchange so far (what the agent's context holds).
    seen: usize,
    /// Bytes the agent said since the last metered round.
    said: usize,
    /// Input reached the agent since the last metered round (a new model call reads it).
    fresh: bool,
    /// The context size the agent last reported.
    context: Option<u64>,
}

/// A turn's usage as the prompt response reports it: ACP's `usage` (input tokens are the
/// uncached ones; prompt tokens here are input plus cache reads and writes, as everywhere in
/// the gateway), else Gemini CLI's `_meta.quota.token_count`.
pub(super) fn reported(result: &Value) -> Option<Usage> {
    let quota = &result["_meta"]["quota"]["token_count"];
    if !result["usage"].is_object() && quota.is_object() {
        let count = |k: &str| quota.get(k).and_then(Value::as_u64).unwrap_or(0);
        let (prompt, completion) = (count("input_tokens"), count("output_tokens"));
        return Some(Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            ..Usage::default()
        });
    }
    let u = &result["usage"];
    let count = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    if !u.is_object() {
        return None;
    }
    let (read, write) = (count("cachedReadTokens"), count("cachedWriteTokens"));
    let prompt = count("inputTokens") + read + write;
    let completion = count("outputTokens");
    Some(Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
        cached_tokens: read,
        cache_write_tokens: write,
        reasoning_tokens: count("thoughtTokens"),
    })
}

impl Metering {
    /// Text sent to the agent: the prompt, a result, text beside it.
    pub fn sent(&mut self, bytes: usize) {
        self.seen = self.seen.saturating_add(bytes);
        self.fresh = true;
    }

    /// Text the agent said: its answer, thoughts, a call's arguments.
    pub fn said(&mut self, bytes: usize) {
        self.seen = self.seen.saturating_add(bytes);
        self.said = self.said.saturating_add(bytes);
    }

    /// The agent's `usage_update`: its context holds `used` tokens now.
    pub fn context(&mut self, used: u64) {
        self.context = Some(used);
    }

    /// A round ended (the agent calls a client tool): what it cost, metered. Calls of one
    /// model answer read no new input: only the first counts the input.
    pub fn round(&mut self) -> Usage {
        let fresh = std::mem::take(&mut self.fresh);
        let read = if fresh { self.seen } else { 0 };
        let mut u = Usage::estimate(read, std::mem::take(&mut self.said));
        // The context the agent last reported is what a new call reads, when it says so.
        if let Some(used) = fresh.then(|| self.context.take()).flatten() {
            u.prompt_tokens = used;
            u.total_tokens = used + u.completion_tokens;
        }
        self.metered.add(u);
        u
    }

    /// The prompt ended with the agent's `report` (or none: the last round is estimated as
    /// the others): what it adds to what the rounds metered.
    pub fn rest(&mut self, report: Option<Usage>) -> Usage {
        let Some(r) = report else {
            self.fresh = true;
            return self.round();
        };
        let m = &self.metered;
        let u = Usage {
            prompt_tokens: r.prompt_tokens.saturating_sub(m.prompt_tokens),
            completion_tokens: r.completion_tokens.saturating_sub(m.completion_tokens),
            total_tokens: r.total_tokens.saturating_sub(m.total_tokens),
            cached_tokens: r.cached_tokens.saturating_sub(m.cached_tokens),
            cache_write_tokens: r.cache_write_tokens.saturating_sub(m.cache_write_tokens),
            reasoning_tokens: r.reasoning_tokens.saturating_sub(m.reasoning_tokens),
        };
        self.metered.add(u);
        u
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_turns_usage_from_acp_or_gemini_clis_quota() {
        let acp = json!({"stopReason": "end_turn", "usage": {"inputTokens": 200, "outputTokens": 40,
            "cachedReadTokens": 100, "cachedWriteTokens": 14, "totalTokens": 354}});
        let u = reported(&acp).unwrap();
        assert_eq!(
            (u.prompt_tokens, u.completion_tokens, u.total_tokens),
            (314, 40, 354)
        );
        assert_eq!((u.cached_tokens, u.cache_write_tokens), (100, 14));
        let gemini = json!({"stopReason": "end_turn", "_meta": {"quota": {"token_count":
            {"input_tokens": 200, "output_tokens": 40}}}});
        let u = reported(&gemini).unwrap();
        assert_eq!(
            (u.prompt_tokens, u.completion_tokens, u.total_tokens),
            (200, 40, 240)
        );
        assert!(reported(&json!({"stopReason": "cancelled"})).is_none());
    }

    #[test]
    fn rounds_are_metered_as_they_end_and_the_report_adds_the_rest() {
        let mut m = Metering::default();
        m.sent(400); // the prompt
        m.said(40); // a call's arguments
        let first = m.round();
        assert_eq!((first.prompt_tokens, first.completion_tokens), (110, 10));
        // A parallel call of the same answer reads no new input.
        m.said(8);
        assert_eq!(m.round().prompt_tokens, 0);
        // The agent says how full its context is: that is the next call's input.
        m.sent(100);
        m.context(700);
        m.said(4);
        let second = m.round();
        assert_eq!((second.prompt_tokens, second.completion_tokens), (700, 1));
        // The prompt's report: only what it has beyond the rounds.
        let report = Usage {
            prompt_tokens: 1000,
            completion_tokens: 5,
            total_tokens: 1005,
            cached_tokens: 300,
            ..Usage::default()
        };
        let rest = m.rest(Some(report));
        assert_eq!(
            (
                rest.prompt_tokens,
                rest.completion_tokens,
                rest.cached_tokens
            ),
            (190, 0, 300)
        );
        // Without a report, the last round is estimated like the others.
        let mut m = Metering::default();
        m.sent(8);
        m.said(8);
        assert_eq!(m.rest(None).total_tokens, 4 + 2);
    }
}
