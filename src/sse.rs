//! Server-sent events read from a byte stream: the one splitter both an upstream's answer
//! and an owner replica's relayed stream are read with, and the timer of an event stream's
//! silences (an upstream's idle timeout, a client's keep-alive). A wire codec, so a leaf: it
//! knows no backend and no surface.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// The silences of a stream timed with one timer, moved on only when it fires (a timer per
/// event would be registered and dropped each time).
pub struct Silence {
    period: Duration,
    timer: Pin<Box<Sleep>>,
}

impl Silence {
    pub fn new(period: Duration) -> Silence {
        Silence {
            period,
            timer: Box::pin(tokio::time::sleep(period)),
        }
    }

    /// Ready once a whole period has passed since `since`; until then the task is woken
    /// when it may have.
    pub fn poll_since(&mut self, cx: &mut Context<'_>, since: Instant) -> Poll<()> {
        loop {
            std::task::ready!(self.timer.as_mut().poll(cx));
            let due = since + self.period;
            if due <= Instant::now() {
                return Poll::Ready(());
            }
            self.timer.as_mut().reset(due);
        }
    }
}

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
pub struct SseSplitter {
    buf: Vec<u8>,
    data: Vec<String>,
    /// Bytes in `data`.
    held: usize,
    ready: std::collections::VecDeque<SseEvent>,
}

impl Default for SseSplitter {
    fn default() -> Self {
        SseSplitter {
            buf: Vec::new(),
            data: Vec::with_capacity(1),
            held: 0,
            // A chunk of a streamed answer often holds a few events.
            ready: std::collections::VecDeque::with_capacity(8),
        }
    }
}

/// An event grew past [`MAX_EVENT_BYTES`]: the stream is broken off.
#[derive(Debug, PartialEq, Eq)]
pub struct Overflow;

impl SseSplitter {
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), Overflow> {
        let mut rest = bytes;
        // The line held from the last chunk, completed first.
        if !self.buf.is_empty() {
            let Some(pos) = memchr::memchr(b'\n', rest) else {
                self.buf.extend_from_slice(rest);
                return self.bounded();
            };
            self.buf.extend_from_slice(&rest[..pos]);
            let held = std::mem::take(&mut self.buf);
            self.line(&held);
            rest = &rest[pos + 1..];
        }
        // The lines wholly inside the chunk, read where they lie.
        while let Some(pos) = memchr::memchr(b'\n', rest) {
            self.line(&rest[..pos]);
            if self.held > MAX_EVENT_BYTES {
                return Err(Overflow);
            }
            rest = &rest[pos + 1..];
        }
        self.buf.extend_from_slice(rest);
        self.bounded()
    }

    fn bounded(&self) -> Result<(), Overflow> {
        match self.buf.len() + self.held > MAX_EVENT_BYTES {
            true => Err(Overflow),
            false => Ok(()),
        }
    }

    /// The body ended: a last event without its blank line still counts.
    pub fn finish(&mut self) {
        if !self.buf.is_empty() {
            let rest = std::mem::take(&mut self.buf);
            self.line(&rest);
        }
        self.line(b"");
    }

    /// One line, its `\n` taken off. Only a `data:` line's text is read (and its UTF-8
    /// checked, once; invalid sequences become U+FFFD); other fields are ignored.
    fn line(&mut self, line: &[u8]) {
        let mut end = line.len();
        while end > 0 && matches!(line[end - 1], b'\n' | b'\r') {
            end -= 1;
        }
        let line = &line[..end];
        if line.is_empty() {
            if !self.data.is_empty() {
                // One `data:` line is the event, as it is.
                let data = match self.data.len() {
                    1 => self.data.pop().unwrap_or_default(),
                    _ => self.data.join("\n"),
                };
                self.data.clear();
                self.held = 0;
                let done = data.len() <= 16 && data.trim() == "[DONE]";
                self.ready.push_back(match done {
                    true => SseEvent::Done,
                    false => SseEvent::Data(data),
                });
            }
        } else if let Some(d) = line.strip_prefix(b"data:") {
            let d = d.strip_prefix(b" ").unwrap_or(d);
            self.held += d.len() + 1;
            self.data.push(match std::str::from_utf8(d) {
                Ok(text) => text.to_owned(),
                Err(_) => String::from_utf8_lossy(d).into_owned(),
            });
        }
    }

    pub fn next_event(&mut self) -> Option<SseEvent> {
        self.ready.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

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
