//! The SSE body of a streamed leg, for every surface: wait (up to one keep-alive interval) for
//! the first event so that an early failure is still a real status, then the surface's opening
//! and its framing of each event, with `: keep-alive` comments through silent stretches.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;

use crate::engine::{EngineError, Leg, LegEvent};
use crate::error::ApiError;

pub type Body = BoxStream<'static, Result<Bytes, Infallible>>;

/// A surface's stream framing.
pub trait Frame: Send + 'static {
    /// What goes before the first event's text (a role delta, `response.created`).
    fn opening(&mut self) -> String;
    /// Frames one leg event; returns the text and whether the stream is finished.
    fn frame(&mut self, ev: LegEvent) -> (String, bool);
    /// What a silent stretch of one keep-alive interval sends.
    fn keepalive(&mut self) -> String {
        ": keep-alive\n\n".to_string()
    }
}

/// The SSE comment of a notice for a human watching the stream (an approval is pending).
pub fn notice_comment(n: &str) -> String {
    format!(": {}\n\n", n.replace(['\n', '\r'], " "))
}

/// A leg's first event, awaited up to one keep-alive interval so that an early failure can
/// still be answered as a real status (the Responses WebSocket: an `error` event with it);
/// `None` when the leg is still silent.
pub async fn first_event(leg: &mut Leg, keepalive: Duration) -> Result<Option<LegEvent>, ApiError> {
    match tokio::time::timeout(keepalive, leg.events.recv()).await {
        Ok(Some(LegEvent::Error(e))) => Err(e.into()),
        Ok(None) => Err(ApiError::upstream()),
        Ok(Some(ev)) => Ok(Some(ev)),
        Err(_) => Ok(None),
    }
}

pub async fn stream<F: Frame>(
    mut leg: Leg,
    mut framer: F,
    keepalive: Duration,
) -> Result<Body, ApiError> {
    let first = first_event(&mut leg, keepalive).await?;
    let mut opening = framer.opening();
    let mut done = false;
    if let Some(ev) = first {
        let (text, end) = framer.frame(ev);
        opening.push_str(&text);
        done = end;
    }
    let state = (leg, framer, done);
    let rest = futures::stream::unfold(state, move |(mut leg, mut framer, done)| async move {
        if done {
            return None;
        }
        loop {
            let (text, end) = match tokio::time::timeout(keepalive, leg.events.recv()).await {
                Err(_) => (framer.keepalive(), false),
                Ok(Some(ev)) => framer.frame(ev),
                Ok(None) => framer.frame(LegEvent::Error(EngineError::TurnFailed)),
            };
            if text.is_empty() && !end {
                continue;
            }
            return Some((Ok(Bytes::from(text)), (leg, framer, end)));
        }
    });
    let head = futures::stream::once(async move { Ok(Bytes::from(opening)) });
    Ok(head.chain(rest).boxed())
}
