//! The SSE body of a streamed leg, for every surface: wait (up to one keep-alive interval) for
//! the first event so that an early failure is still a real status, then the surface's opening
//! and its framing of each event, with `: keep-alive` comments through silent stretches.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use tokio::time::Instant;

use crate::engine::{EngineError, Leg, LegEvent};
use crate::error::ApiError;
use crate::sse::Silence;

pub type Body = BoxStream<'static, Result<Bytes, Infallible>>;

/// A surface's stream framing.
pub trait Frame: Send + Unpin + 'static {
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
    let mut out = framer.opening();
    let mut done = false;
    if let Some(ev) = first {
        let (text, end) = framer.frame(ev);
        out.push_str(&text);
        done = end;
    }
    Ok(Framed {
        leg,
        framer,
        done,
        out,
        quiet: Silence::new(keepalive),
        sent_at: Instant::now(),
    }
    .boxed())
}

/// The bytes one body frame gathers from the events already waiting (more wait for the next).
const GATHER_BYTES: usize = 64 * 1024;

/// What a body frame's text grows by when a second event joins it.
const GATHER_ROOM: usize = 2048;

/// A leg's events framed as they come. The events already waiting go out as one body frame
/// (the same bytes in fewer writes); a keep-alive is due one interval after bytes last went.
struct Framed<F> {
    leg: Leg,
    framer: F,
    done: bool,
    /// Framed and not yet sent.
    out: String,
    quiet: Silence,
    /// When bytes last went out: the keep-alive is due one interval after.
    sent_at: Instant,
}

impl<F: Frame> Stream for Framed<F> {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        while !this.done && this.out.len() < GATHER_BYTES {
            let Poll::Ready(ev) = this.leg.events.poll_recv(cx) else {
                break;
            };
            let ev = ev.unwrap_or(LegEvent::Error(EngineError::TurnFailed));
            let (text, end) = this.framer.frame(ev);
            match this.out.is_empty() {
                true => this.out = text,
                false => {
                    // Room for a few more at once, not a copy at each.
                    this.out.reserve(text.len().max(GATHER_ROOM));
                    this.out.push_str(&text);
                }
            }
            this.done = end;
        }
        if !this.out.is_empty() {
            this.sent_at = Instant::now();
            return Poll::Ready(Some(Ok(Bytes::from(std::mem::take(&mut this.out)))));
        }
        if this.done {
            return Poll::Ready(None);
        }
        std::task::ready!(this.quiet.poll_since(cx, this.sent_at));
        this.sent_at = Instant::now();
        Poll::Ready(Some(Ok(Bytes::from(this.framer.keepalive()))))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Each event as its text on a line; anything else ends the stream.
    struct Lines;

    impl Frame for Lines {
        fn opening(&mut self) -> String {
            "open\n".into()
        }
        fn frame(&mut self, ev: LegEvent) -> (String, bool) {
            match ev {
                LegEvent::Delta(d) => (format!("{d}\n"), false),
                _ => ("end\n".into(), true),
            }
        }
    }

    /// A leg whose events come from `events`, for a surface's framing tests.
    pub(crate) fn leg(events: tokio::sync::mpsc::Receiver<LegEvent>) -> Leg {
        Leg {
            execution_id: "exe-1".into(),
            created: 0,
            model: "m".into(),
            round: 0,
            native: false,
            spent: None,
            deadline: Instant::now(),
            events,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_events_go_out_together_and_only_silence_is_kept_alive() {
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let delta = |d: &str| LegEvent::Delta(d.into());
        tx.send(delta("a")).await.unwrap();
        let started = Instant::now();
        let mut body = stream(leg(rx), Lines, Duration::from_secs(10))
            .await
            .unwrap();
        tx.send(delta("b")).await.unwrap();
        tx.send(delta("c")).await.unwrap();
        let text =
            |b: Option<Result<Bytes, Infallible>>| String::from_utf8(b.unwrap().unwrap().to_vec());
        assert_eq!(text(body.next().await).unwrap(), "open\na\nb\nc\n");
        // Six seconds on, an event: the keep-alive is due ten seconds after it, not after
        // the stream began.
        tokio::time::sleep(Duration::from_secs(6)).await;
        tx.send(delta("d")).await.unwrap();
        assert_eq!(text(body.next().await).unwrap(), "d\n");
        assert_eq!(text(body.next().await).unwrap(), ": keep-alive\n\n");
        assert_eq!(started.elapsed(), Duration::from_secs(16));
        assert_eq!(text(body.next().await).unwrap(), ": keep-alive\n\n");
        assert_eq!(started.elapsed(), Duration::from_secs(26));
        tx.send(LegEvent::Truncated).await.unwrap();
        assert_eq!(text(body.next().await).unwrap(), "end\n");
        assert!(body.next().await.is_none());
    }
}
