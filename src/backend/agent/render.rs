//! Renders a conversation into a Codex thread's turn: system and developer messages become
//! instructions, everything before the last user message becomes a faithful transcript, and
//! the last user message is the turn input. A kept thread ([`continued`]) gets only the new
//! user messages.

use crate::backend::BackendError;
use crate::turn::{Message, Role};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub instructions: Option<String>,
    pub history: Option<String>,
    /// One text input item each.
    pub input: Vec<String>,
}

fn invalid(message: &str) -> BackendError {
    BackendError::Invalid {
        message: message.to_string(),
        param: crate::error::Param::Conversation,
    }
}

/// The index of the turn's input: the last message that is not an instruction, which must be
/// a user message.
pub fn input_index(messages: &[Message]) -> Result<usize, BackendError> {
    let last = messages
        .iter()
        .rposition(|m| !m.role.instructs())
        .ok_or_else(|| invalid("`messages` must contain a user message"))?;
    if messages[last].role != Role::User {
        return Err(invalid(
            "the last message must be a user message (or tool results answering an `srct-` tool call)",
        ));
    }
    Ok(last)
}

pub fn render(messages: &[Message]) -> Result<Rendered, BackendError> {
    let last = input_index(messages)?;
    let mut instructions = Vec::new();
    let mut transcript = Vec::new();
    for m in &messages[..last] {
        match &m.role {
            Role::System | Role::Developer => instructions.push(m.text.clone()),
            Role::User => transcript.push(format!("[user]\n{}", m.text)),
            Role::Assistant => {
                if !m.text.is_empty() {
                    transcript.push(format!("[assistant]\n{}", m.text));
                }
                for c in &m.tool_calls {
                    transcript.push(format!(
                        "[assistant called tool {} with id {}]\n{}",
                        c.name, c.id, c.arguments
                    ));
                }
            }
            Role::Tool => transcript.push(format!(
                "[tool result for id {}]\n{}",
                m.tool_call_id.as_deref().unwrap_or(""),
                m.text
            )),
            Role::Other(other) => transcript.push(format!("[{other}]\n{}", m.text)),
        }
    }
    // System messages after the last user message are still instructions.
    for m in &messages[last + 1..] {
        instructions.push(m.text.clone());
    }
    Ok(Rendered {
        instructions: (!instructions.is_empty()).then(|| instructions.join("\n\n")),
        history: (!transcript.is_empty()).then(|| {
            format!(
                "The conversation so far (earlier turns, for context):\n\n{}",
                transcript.join("\n\n")
            )
        }),
        input: vec![messages[last].text.clone()],
    })
}

/// The input of a turn on a kept thread: the new messages after the answer it already has,
/// which must all be user messages.
pub fn continued(messages: &[Message]) -> Result<Vec<String>, BackendError> {
    if messages.is_empty() || messages.iter().any(|m| m.role != Role::User) {
        return Err(invalid(
            "a continued conversation must end with user messages",
        ));
    }
    Ok(messages.iter().map(|m| m.text.clone()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msgs(v: serde_json::Value) -> Vec<Message> {
        let wire: Vec<crate::surface::chat::wire::Message> = serde_json::from_value(v).unwrap();
        wire.iter()
            .map(crate::surface::chat::neutral_message)
            .collect()
    }

    #[test]
    fn single_user_message() {
        let r = render(&msgs(json!([{"role":"user","content":"hi"}]))).unwrap();
        assert_eq!(
            r,
            Rendered {
                instructions: None,
                history: None,
                input: vec!["hi".into()]
            }
        );
    }

    #[test]
    fn instructions_history_and_input() {
        let r = render(&msgs(json!([
            {"role":"system","content":"sys"},
            {"role":"developer","content":[{"type":"text","text":"dev"}]},
            {"role":"user","content":"first"},
            {"role":"assistant","content":null,"tool_calls":[{"id":"srct-1","type":"function","function":{"name":"read","arguments":"{\"p\":1}"}}]},
            {"role":"tool","tool_call_id":"srct-1","content":"R"},
            {"role":"assistant","content":"answer"},
            {"role":"user","content":"second"}
        ])))
        .unwrap();
        assert_eq!(r.instructions.as_deref(), Some("sys\n\ndev"));
        assert_eq!(r.input, ["second"]);
        let h = r.history.unwrap();
        let order = [
            "[user]\nfirst",
            "called tool read with id srct-1]\n{\"p\":1}",
            "[tool result for id srct-1]\nR",
            "[assistant]\nanswer",
        ];
        let mut at = 0;
        for part in order {
            let i = h[at..]
                .find(part)
                .unwrap_or_else(|| panic!("missing {part} in {h}"));
            at += i;
        }
    }

    #[test]
    fn must_end_with_user() {
        assert!(render(&msgs(json!([{"role":"system","content":"s"}]))).is_err());
        assert!(render(&msgs(
            json!([{"role":"user","content":"u"},{"role":"assistant","content":"a"}])
        ))
        .is_err());
        assert!(render(&[]).is_err());
    }
}
