//! Renders an OpenAI conversation into a stateful backend's turn: system and developer
//! messages become instructions, everything before the last user message becomes a faithful
//! transcript, and the last user message is the turn input.

use crate::error::ApiError;
use crate::openai::Message;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub instructions: Option<String>,
    pub history: Option<String>,
    pub input: String,
}

pub fn render(messages: &[Message]) -> Result<Rendered, ApiError> {
    let last = messages
        .iter()
        .rposition(|m| m.role != "system" && m.role != "developer")
        .ok_or_else(|| {
            ApiError::invalid("`messages` must contain a user message").with_param("messages")
        })?;
    if messages[last].role != "user" {
        return Err(ApiError::invalid(
            "the last message must be a user message (or tool results answering an `srct-` tool call)",
        )
        .with_param("messages"));
    }
    let mut instructions = Vec::new();
    let mut transcript = Vec::new();
    for m in &messages[..last] {
        match m.role.as_str() {
            "system" | "developer" => instructions.push(m.text()),
            "user" => transcript.push(format!("[user]\n{}", m.text())),
            "assistant" => {
                let text = m.text();
                if !text.is_empty() {
                    transcript.push(format!("[assistant]\n{text}"));
                }
                for c in m.tool_calls.iter().flatten() {
                    transcript.push(format!(
                        "[assistant called tool {} with id {}]\n{}",
                        c.function.name,
                        c.id,
                        c.function.arguments_text()
                    ));
                }
            }
            "tool" => transcript.push(format!(
                "[tool result for id {}]\n{}",
                m.tool_call_id.as_deref().unwrap_or(""),
                m.text()
            )),
            other => transcript.push(format!("[{other}]\n{}", m.text())),
        }
    }
    // System messages after the last user message are still instructions.
    for m in &messages[last + 1..] {
        instructions.push(m.text());
    }
    Ok(Rendered {
        instructions: (!instructions.is_empty()).then(|| instructions.join("\n\n")),
        history: (!transcript.is_empty()).then(|| {
            format!(
                "The conversation so far (earlier turns, for context):\n\n{}",
                transcript.join("\n\n")
            )
        }),
        input: messages[last].text(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msgs(v: serde_json::Value) -> Vec<Message> {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn single_user_message() {
        let r = render(&msgs(json!([{"role":"user","content":"hi"}]))).unwrap();
        assert_eq!(
            r,
            Rendered {
                instructions: None,
                history: None,
                input: "hi".into()
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
        assert_eq!(r.input, "second");
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
