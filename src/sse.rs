//! Server-sent events read from a byte stream: the one splitter both an upstream's answer
//! and an owner replica's relayed stream are read with. A wire codec, so a leaf: it knows no
//! backend and no surface.

use bytes::{Bytes, BytesMut};

/// One event of an SSE body.
#[derive(Debug, Clone, PartialEq)]
pub enum SseEvent {
    /// A `data:` payload other than `[DONE]`.
    Data(String),
    Done,
}

/// The largest SSE event (its unfinished line plus its `data:` lines) the splitter holds.
pub const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

/// Splits a byte stream into SSE events (`data:` lines joined per event; comments and other
/// fields ignored). Handles `\n` and `\r\n` line ends and events split across chunks.
#[derive(Default)]
pub struct SseSplitter {
    buf: BytesMut,
    data: Vec<String>,
    /// Bytes in `data`.
    held: usize,
    ready: std::collections::VecDeque<SseEvent>,
}

/// An event grew past [`MAX_EVENT_BYTES`]: the stream is broken off.
#[derive(Debug, PartialEq, Eq)]
pub struct Overflow;

impl SseSplitter {
    pub fn push(&mut self, bytes: &Bytes) -> Result<(), Overflow> {
        self.buf.extend_from_slice(bytes);
        while let Some(pos) = memchr::memchr(b'\n', &self.buf) {
            let line = self.buf.split_to(pos + 1);
            // Valid UTF-8 is borrowed (the common case, checked a word at a time).
            let line = match std::str::from_utf8(&line) {
                Ok(text) => std::borrow::Cow::Borrowed(text),
                Err(_) => String::from_utf8_lossy(&line),
            };
            self.line(line.trim_end_matches(['\n', '\r']));
            if self.held > MAX_EVENT_BYTES {
                return Err(Overflow);
            }
        }
        if self.buf.len() + self.held > MAX_EVENT_BYTES {
            return Err(Overflow);
        }
        Ok(())
    }

    /// The body ended: a last event without its blank line still counts.
    pub fn finish(&mut self) {
        if !self.buf.is_empty() {
            let rest = String::from_utf8_lossy(&self.buf).to_string();
            self.buf.clear();
            self.line(rest.trim_end_matches(['\n', '\r']));
        }
        self.line("");
    }

    fn line(&mut self, line: &str) {
        if line.is_empty() {
            if !self.data.is_empty() {
                // One `data:` line is the event, as it is.
                let data = match self.data.len() {
                    1 => self.data.pop().unwrap_or_default(),
                    _ => self.data.join("\n"),
                };
                self.data.clear();
                self.held = 0;
                self.ready.push_back(if data.trim() == "[DONE]" {
                    SseEvent::Done
                } else {
                    SseEvent::Data(data)
                });
            }
        } else if let Some(d) = line.strip_prefix("data:") {
            let d = d.strip_prefix(' ').unwrap_or(d);
            self.held += d.len() + 1;
            self.data.push(d.to_string());
        }
    }

    pub fn next_event(&mut self) -> Option<SseEvent> {
        self.ready.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_events_across_chunks_and_line_ends() {
        let mut s = SseSplitter::default();
        s.push(&Bytes::from("data: {\"a\":1}\n\nda")).unwrap();
        assert_eq!(s.next_event(), Some(SseEvent::Data("{\"a\":1}".into())));
        assert_eq!(s.next_event(), None);
        s.push(&Bytes::from(
            "ta: {\"b\":2}\r\n\r\n: comment\n\nevent: x\ndata: [DONE]\n\n",
        ))
        .unwrap();
        assert_eq!(s.next_event(), Some(SseEvent::Data("{\"b\":2}".into())));
        assert_eq!(s.next_event(), Some(SseEvent::Done));
        s.push(&Bytes::from("data: {\"c\":3}")).unwrap();
        s.finish();
        assert_eq!(s.next_event(), Some(SseEvent::Data("{\"c\":3}".into())));
    }

    #[test]
    fn an_event_over_the_bound_is_refused() {
        let mut s = SseSplitter::default();
        let line = Bytes::from(format!("data: {}\n", "x".repeat(MAX_EVENT_BYTES / 4)));
        for _ in 0..3 {
            s.push(&line).unwrap();
        }
        assert_eq!(s.push(&line), Err(Overflow));
        let mut s = SseSplitter::default();
        assert_eq!(
            s.push(&Bytes::from(vec![b'a'; MAX_EVENT_BYTES + 1])),
            Err(Overflow)
        );
    }
}
