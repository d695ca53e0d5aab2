//! Remote compaction: one summary turn of the conversation's own model on a fresh, ephemeral
//! thread or upstream call (every backend kind can run it), and the summary kept durably
//! behind an opaque handle (`cmp-` + 128 CSPRNG bits) that the client carries back.
//!
//! The store holds only the handle's digest and the summary sealed with ChaCha20-Poly1305
//! under a key derived from the handle, bound to the principal, until
//! `[continuations] compaction_ttl_days` have passed: valid on every replica and after a
//! restart, unreadable without the handle. An unknown, expired or another principal's handle
//! reads as none.

use chacha20poly1305::aead::{Aead, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};

use super::EngineError;
use crate::config::CompactionLimits;
use crate::digest::sha256;
use crate::store::{now_unix, CompactionRecord, Store};
use crate::turn::{Fingerprint, Message, Role, ToolChoice, TurnInput};

/// What the summary turn is asked, before the conversation's transcript.
const PROMPT: &str = "You are compacting a conversation so that it can continue in a fresh \
context. Write a summary that lets the work carry on without the earlier messages: the \
user's goals and constraints, what has been done and decided, the files, commands and tools \
involved with their important results, and what remains to be done. Answer with the summary \
only.\n\nThe conversation so far:\n";

/// The key that seals a handle's summary. Derived from the handle alone (never stored); the
/// lookup digest is the handle's plain SHA-256, a different value.
fn key_of(handle: &str) -> ChaCha20Poly1305 {
    let mut material = b"turnstile compaction key\0".to_vec();
    material.extend_from_slice(handle.as_bytes());
    ChaCha20Poly1305::new(Key::from_slice(&sha256(&material)))
}

// Each key seals exactly one message, so a fixed nonce never repeats under a key.
const NONCE: [u8; 12] = [0; 12];

fn seal(handle: &str, summary: &str) -> Option<Vec<u8>> {
    key_of(handle)
        .encrypt(Nonce::from_slice(&NONCE), summary.as_bytes())
        .ok()
}

fn open(handle: &str, sealed: &[u8]) -> Option<String> {
    let plain = key_of(handle)
        .decrypt(Nonce::from_slice(&NONCE), sealed)
        .ok()?;
    String::from_utf8(plain).ok()
}

/// The conversation as one transcript for the summary turn: it carries tool calls and
/// results as text, so the summary turn declares no tools on any backend.
fn transcript(messages: &[Message]) -> String {
    let mut out = String::new();
    for m in messages {
        out.push_str(&format!("\n[{}]", m.role.as_str()));
        if let Some(id) = &m.tool_call_id {
            out.push_str(&format!(" (result of {id})"));
        }
        out.push('\n');
        out.push_str(&m.text);
        for c in &m.tool_calls {
            out.push_str(&format!("\n(call {} {}: {})", c.id, c.name, c.arguments));
        }
        out.push('\n');
    }
    out
}

/// The summary turn of `input`'s conversation: one user message asking for the summary over
/// its transcript, no tools, on a fresh thread that is not kept.
pub(super) fn summary_turn(input: TurnInput) -> TurnInput {
    let ask = Message {
        role: Role::User,
        text: format!("{PROMPT}{}", transcript(&input.messages)),
        images: Vec::new(),
        name: None,
        tool_calls: Vec::new(),
        tool_call_id: None,
        is_error: false,
    };
    let digest = (input.digest)(&ask);
    TurnInput {
        messages: vec![ask],
        message_digests: vec![digest],
        digested: true,
        tools: Ok(Vec::new()),
        tool_choice: ToolChoice::Auto,
        parallel_tool_calls: false,
        stream: false,
        fingerprint: Fingerprint {
            tools: [0; 32],
            tool_choice: [0; 32],
            prefix: digest,
        },
        continuation: None,
        follows: None,
        client_tool_history: false,
        passthrough: None,
        sampling: Default::default(),
        ephemeral: true,
        usd_cap: None,
        approvals: None,
        cwd: None,
        conversation: None,
        ..input
    }
}

/// Keeps `summary` sealed behind a fresh handle for `principal` for `ttl_secs`, within the
/// principal's bounds (its oldest summaries go first); returns the handle.
pub(super) async fn keep(
    store: &Store,
    principal: &str,
    model: &str,
    summary: &str,
    ttl_secs: u64,
    limits: &CompactionLimits,
) -> Result<String, EngineError> {
    let handle = crate::ids::new_id("cmp-");
    let sealed = seal(&handle, summary).ok_or(EngineError::TurnFailed)?;
    let now = now_unix();
    let record = CompactionRecord {
        digest: &sha256(handle.as_bytes()),
        principal,
        model,
        sealed: &sealed,
        created_at: now,
        expires_at: now.saturating_add(ttl_secs),
    };
    let bounds = (limits.max_per_client, limits.max_bytes_per_client);
    if let Err(e) = store.compaction_insert(&record, bounds).await {
        tracing::error!(error = %e, "could not keep a compaction summary");
        return Err(EngineError::Store);
    }
    Ok(handle)
}

/// A summary as it was sealed, and what its text will weigh once opened.
pub(super) struct Sealed(Vec<u8>);

impl Sealed {
    /// The length of the summary it holds (the sealed bytes less the 16-byte tag).
    pub fn text_len(&self) -> usize {
        self.0.len().saturating_sub(16)
    }

    /// The summary, if `handle` opens it.
    pub fn open(self, handle: &str) -> Option<String> {
        open(handle, &self.0)
    }
}

/// The sealed summary behind a compaction handle, if it is `principal`'s and has not
/// expired.
pub(super) async fn lookup(
    store: &Store,
    principal: &str,
    handle: &str,
) -> Result<Option<Sealed>, EngineError> {
    let digest = sha256(handle.as_bytes());
    match store.compaction_get(&digest, principal, now_unix()).await {
        Ok(sealed) => Ok(sealed.map(Sealed)),
        Err(e) => {
            tracing::error!(error = %e, "could not read a compaction summary");
            Err(EngineError::Store)
        }
    }
}

/// `summary` cut to at most `max` bytes, on a character boundary.
pub(super) fn bounded(mut summary: String, max: usize) -> String {
    if summary.len() > max {
        let mut at = max;
        while !summary.is_char_boundary(at) {
            at -= 1;
        }
        summary.truncate(at);
        tracing::warn!(max, "a compaction summary was cut at max_summary_bytes");
    }
    summary
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_opens_only_with_its_own_handle() {
        let sealed = seal("cmp-a", "the summary").unwrap();
        assert!(!sealed.windows(b"summary".len()).any(|w| w == b"summary"));
        assert_eq!(open("cmp-a", &sealed).as_deref(), Some("the summary"));
        assert_eq!(open("cmp-b", &sealed), None);
    }

    #[test]
    fn a_long_summary_is_cut_on_a_character_boundary() {
        assert_eq!(bounded("abc".into(), 3), "abc");
        assert_eq!(bounded("ab\u{e9}".into(), 3), "ab");
        assert_eq!(Sealed(seal("cmp-a", "four").unwrap()).text_len(), 4);
    }

    #[test]
    fn the_transcript_carries_calls_and_results_as_text() {
        let mut call = Message {
            role: Role::Assistant,
            text: String::new(),
            images: Vec::new(),
            name: None,
            tool_calls: vec![crate::turn::Call {
                id: "c1".into(),
                name: "read".into(),
                arguments: "{\"p\":1}".into(),
            }],
            tool_call_id: None,
            is_error: false,
        };
        let t = transcript(std::slice::from_ref(&call));
        assert!(t.contains("[assistant]") && t.contains("(call c1 read: {\"p\":1})"));
        call.role = Role::Tool;
        call.tool_calls.clear();
        call.tool_call_id = Some("c1".into());
        call.text = "ok".into();
        assert!(transcript(&[call]).contains("[tool] (result of c1)\nok"));
    }
}
