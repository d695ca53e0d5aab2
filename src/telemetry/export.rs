//! Getting finished spans to the collector without ever slowing a request: a bounded queue
//! that drops (and counts) what does not fit, one task on the gateway's runtime that sends
//! what queued up as one batch, and the OTLP/HTTP protobuf exporter over the gateway's own
//! `reqwest` (rustls, no proxy, a timeout).
//!
//! The SDK's `BatchSpanProcessor` is not used: it keeps its count of dropped spans to itself
//! (it only logs it at shutdown), and it exports from a thread of its own with a blocking
//! client. This one counts every span it drops, by cause, for `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Spans waiting for the exporter; past this, new ones are dropped.
pub(super) const QUEUE: usize = 4096;
/// The most spans in one export request.
const MAX_BATCH: usize = 512;
/// How long the first span of a batch waits for others (unless the batch fills first): one
/// export request per second at most, whatever the load.
const LINGER: Duration = Duration::from_secs(1);
/// One export request, retries included.
pub(super) const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long shutdown waits for the last batch.
const FINAL_FLUSH: Duration = Duration::from_secs(3);

/// Spans dropped because the queue was full, and because their export failed.
pub static DROPPED_QUEUE_FULL: AtomicU64 = AtomicU64::new(0);
pub static DROPPED_EXPORT_FAILED: AtomicU64 = AtomicU64::new(0);
/// Spans the collector accepted.
pub static EXPORTED: AtomicU64 = AtomicU64::new(0);

/// The processor the tracer provider hands finished spans to.
#[derive(Debug)]
pub(super) struct Queue {
    tx: mpsc::Sender<SpanData>,
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if self.tx.try_send(span).is_err() {
            DROPPED_QUEUE_FULL.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The export task's handle: stopping it sends what is queued (within a bound).
pub(super) struct Exporting {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Exporting {
    pub(super) async fn stop(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(FINAL_FLUSH + EXPORT_TIMEOUT, self.task).await;
    }
}

/// The queue and the task that drains it into `exporter`.
pub(super) fn start<E: SpanExporter + 'static>(exporter: E) -> (Queue, Exporting) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let stop = CancellationToken::new();
    let task = tokio::spawn(drain(rx, exporter, stop.clone()));
    (Queue { tx }, Exporting { stop, task })
}

async fn drain<E: SpanExporter>(
    mut rx: mpsc::Receiver<SpanData>,
    exporter: E,
    stop: CancellationToken,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    'batches: loop {
        let n = tokio::select! {
            n = rx.recv_many(&mut batch, MAX_BATCH) => n,
            () = stop.cancelled() => break,
        };
        if n == 0 {
            return;
        }
        // The batch fills for a while before it goes.
        let linger = tokio::time::sleep(LINGER);
        tokio::pin!(linger);
        while batch.len() < MAX_BATCH {
            let room = MAX_BATCH - batch.len();
            tokio::select! {
                n = rx.recv_many(&mut batch, room) => if n == 0 { break },
                () = &mut linger => break,
                () = stop.cancelled() => break 'batches,
            }
        }
        send(&exporter, &mut batch).await;
    }
    // Shutdown: what is queued now, in batches, within a bound.
    let last = async {
        while let Ok(span) = rx.try_recv() {
            batch.push(span);
            if batch.len() == MAX_BATCH {
                send(&exporter, &mut batch).await;
            }
        }
        send(&exporter, &mut batch).await;
    };
    if tokio::time::timeout(FINAL_FLUSH, last).await.is_err() {
        tracing::warn!("the last spans were not all exported before shutdown");
    }
}

async fn send<E: SpanExporter>(exporter: &E, batch: &mut Vec<SpanData>) {
    if batch.is_empty() {
        return;
    }
    let n = batch.len() as u64;
    let spans = std::mem::take(batch);
    match tokio::time::timeout(EXPORT_TIMEOUT, exporter.export(spans)).await {
        Ok(Ok(())) => {
            EXPORTED.fetch_add(n, Ordering::Relaxed);
        }
        Ok(Err(e)) => {
            // Once per failure streak would be nicer; a dead collector at one batch in
            // flight logs at most once per export timeout.
            tracing::debug!(error = %e, spans = n, "trace export failed; spans dropped");
            DROPPED_EXPORT_FAILED.fetch_add(n, Ordering::Relaxed);
        }
        Err(_) => {
            tracing::debug!(spans = n, "trace export timed out; spans dropped");
            DROPPED_EXPORT_FAILED.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// The exporter's HTTP client: the gateway's `reqwest` (rustls with the platform's roots),
/// on the gateway's runtime.
#[derive(Debug)]
pub(super) struct Client(reqwest::Client);

impl Client {
    pub(super) fn new() -> Client {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .timeout(EXPORT_TIMEOUT)
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        Client(client)
    }
}

/// A collector's answer is small; anything longer is cut here.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

#[async_trait::async_trait]
impl HttpClient for Client {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let mut resp = self
            .0
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body)
            .send()
            .await?;
        let status = resp.status();
        let mut bytes = Vec::new();
        while let Some(chunk) = resp.chunk().await? {
            if bytes.len() + chunk.len() > MAX_RESPONSE_BYTES {
                break;
            }
            bytes.extend_from_slice(&chunk);
        }
        let mut out = Response::new(Bytes::from(bytes));
        *out.status_mut() = status;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Counts what it is sent.
    #[derive(Debug, Clone, Default)]
    struct Counting(Arc<AtomicU64>);

    impl SpanExporter for Counting {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            self.0.fetch_add(batch.len() as u64, Ordering::Relaxed);
            Ok(())
        }
    }

    fn span() -> SpanData {
        use opentelemetry::trace::{
            SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
        };
        SpanData {
            span_context: SpanContext::new(
                TraceId::from(1u128),
                SpanId::from(1u64),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: SpanKind::Internal,
            name: "s".into(),
            start_time: std::time::SystemTime::UNIX_EPOCH,
            end_time: std::time::SystemTime::UNIX_EPOCH,
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: Status::Unset,
            instrumentation_scope: Default::default(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_goes_when_full_or_after_the_linger() {
        let sent = Counting::default();
        let (tx, rx) = mpsc::channel(QUEUE);
        let stop = CancellationToken::new();
        let task = tokio::spawn(drain(rx, sent.clone(), stop.clone()));
        let count = || sent.0.load(Ordering::Relaxed);
        tx.send(span()).await.unwrap();
        tokio::time::sleep(LINGER / 2).await;
        assert_eq!(count(), 0, "a lone span waits for others");
        tokio::time::sleep(LINGER).await;
        assert_eq!(count(), 1, "and goes after the linger");
        for _ in 0..MAX_BATCH {
            tx.send(span()).await.unwrap();
        }
        // A full batch goes at once (no time passes).
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(count(), 1 + MAX_BATCH as u64);
        tx.send(span()).await.unwrap();
        tokio::task::yield_now().await;
        stop.cancel();
        task.await.unwrap();
        assert_eq!(
            count(),
            2 + MAX_BATCH as u64,
            "shutdown sends what is queued"
        );
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_and_shutdown_sends_what_is_queued() {
        let sent = Counting::default();
        let (tx, rx) = mpsc::channel(2);
        let queue = Queue { tx };
        let before = DROPPED_QUEUE_FULL.load(Ordering::Relaxed);
        for _ in 0..3 {
            queue.on_end(span());
        }
        assert!(DROPPED_QUEUE_FULL.load(Ordering::Relaxed) > before);
        let stop = CancellationToken::new();
        stop.cancel();
        drain(rx, sent.clone(), stop).await;
        assert_eq!(sent.0.load(Ordering::Relaxed), 2);
    }
}
