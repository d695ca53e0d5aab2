//! A scripted OpenAI-compatible upstream for the `openai` backend kind, on 127.0.0.1:0 in the
//! test process. The scenario is the `model` the gateway forwards (the model's
//! `backend_model`). Every request body and Authorization header is recorded; a streaming
//! answer that is dropped by its reader is recorded as `disconnects`. It serves plain HTTP or
//! TLS (HTTP/2 or HTTP/1.1 by ALPN) with a certificate the test made; the next requests can be
//! told to fail (`fail_next`: 503 with no body, `stall_next`: no headers for 5 s,
//! `break_next`: a stream that goes silent after its second chunk, `hold_next`: no answer
//! until the test calls `release`). `up-read` reads the last `/….txt` path the user named with
//! `read_file` (`file_path`) and answers `Tool result: <call id>=<result>`. Like OpenAI, it streams usage only when
//! `stream_options.include_usage` is set; `up-no-usage` never reports usage.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Version};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

#[derive(Default)]
pub struct Seen {
    pub bodies: Mutex<Vec<Value>>,
    /// Each request body as it arrived, byte for byte.
    pub raw: Mutex<Vec<Bytes>>,
    pub versions: Mutex<Vec<Version>>,
    pub auth: Mutex<Vec<String>>,
    /// The `traceparent` of each request (empty when it had none).
    pub traceparents: Mutex<Vec<String>>,
    pub disconnects: AtomicUsize,
    pub fail_next: AtomicUsize,
    pub stall_next: AtomicUsize,
    pub break_next: AtomicUsize,
    pub hold_next: AtomicUsize,
    /// Lets one held request answer.
    pub release: tokio::sync::Notify,
}

/// Takes one from a "next N requests" counter.
fn take(counter: &AtomicUsize) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

pub struct FakeUpstream {
    pub url: String,
    pub seen: Arc<Seen>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeUpstream {
    pub async fn start() -> FakeUpstream {
        let (seen, app) = app();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/v1", listener.local_addr().expect("addr"));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeUpstream { url, seen, task }
    }

    /// The same upstream behind TLS on `https://127.0.0.1:PORT/v1`, with the certificate
    /// chain and key given (PEM), offering HTTP/2 and HTTP/1.1.
    pub async fn start_tls(cert_pem: &str, key_pem: &str) -> FakeUpstream {
        use tokio_rustls::rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
        let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("certificate PEM");
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).expect("key PEM");
        let mut config = tokio_rustls::rustls::ServerConfig::builder_with_provider(Arc::new(
            tokio_rustls::rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocols")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("server certificate");
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let (seen, app) = app();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("https://{}/v1", listener.local_addr().expect("addr"));
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (acceptor, app) = (acceptor.clone(), app.clone());
                tokio::spawn(async move {
                    // A failed handshake (an untrusting client) just ends the connection.
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper_util::service::TowerToHyperService::new(app);
                    let _ = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
                });
            }
        });
        FakeUpstream { url, seen, task }
    }

    pub fn versions(&self) -> Vec<Version> {
        self.seen.versions.lock().unwrap().clone()
    }

    pub fn raw(&self) -> Vec<Bytes> {
        self.seen.raw.lock().unwrap().clone()
    }

    pub fn bodies(&self) -> Vec<Value> {
        self.seen.bodies.lock().unwrap().clone()
    }

    pub fn disconnects(&self) -> usize {
        self.seen.disconnects.load(Ordering::SeqCst)
    }
}

fn chunk(model: &str, delta: Value, finish: Option<&str>) -> String {
    let c = json!({"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 1, "model": model,
                   "system_fingerprint": "fp_up", "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]});
    format!("data: {c}\n\n")
}

/// `up-think` reads 4 of its 7 prompt tokens from its cache and writes 2 to it.
fn usage(model: &str) -> Value {
    let mut u = json!({"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10});
    if model == "up-think" {
        u["prompt_tokens_details"] = json!({"cached_tokens": 4, "cache_write_tokens": 2});
    }
    u
}

/// What `up-think` reasons before it answers.
pub const THOUGHT: &str = "Weighing the options.";

fn tool_results(body: &Value) -> usize {
    body["messages"]
        .as_array()
        .map_or(0, |m| m.iter().filter(|m| m["role"] == "tool").count())
}

fn last_user(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// Counts a stream dropped by its reader before it finished.
struct DropGuard(Arc<Seen>, bool);
impl DropGuard {
    fn disarm(&mut self) {
        self.1 = true;
    }
}
impl Drop for DropGuard {
    fn drop(&mut self) {
        if !self.1 {
            self.0.disconnects.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn sse(parts: Vec<(u64, String)>, seen: Arc<Seen>, stall_at_end: bool) -> Response {
    let stream = futures::stream::unfold(
        (parts.into_iter(), DropGuard(seen, false)),
        move |(mut it, mut guard)| async move {
            match it.next() {
                Some((delay, text)) => {
                    if delay > 0 {
                        tokio::time::sleep(Duration::from_millis(delay)).await;
                    }
                    Some((Ok::<_, std::convert::Infallible>(text), (it, guard)))
                }
                None if stall_at_end => {
                    std::future::pending::<()>().await;
                    None
                }
                None => {
                    guard.disarm();
                    None
                }
            }
        },
    );
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

fn app() -> (Arc<Seen>, Router) {
    let seen = Arc::new(Seen::default());
    let app = Router::new()
        .route("/v1/chat/completions", post(handle))
        .with_state(seen.clone());
    (seen, app)
}

async fn handle(
    State(seen): State<Arc<Seen>>,
    version: Version,
    headers: HeaderMap,
    raw: Bytes,
) -> Response {
    let Ok(body) = serde_json::from_slice::<Value>(&raw) else {
        return (StatusCode::BAD_REQUEST, "not JSON").into_response();
    };
    seen.bodies.lock().unwrap().push(body.clone());
    seen.raw.lock().unwrap().push(raw);
    seen.versions.lock().unwrap().push(version);
    let traceparent = headers.get("traceparent").and_then(|v| v.to_str().ok());
    (seen.traceparents.lock().unwrap()).push(traceparent.unwrap_or_default().to_string());
    if take(&seen.fail_next) {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    if take(&seen.hold_next) {
        seen.release.notified().await;
    }
    if take(&seen.stall_next) {
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let cut = take(&seen.break_next);
    if let Some(a) = headers.get("authorization").and_then(|v| v.to_str().ok()) {
        seen.auth.lock().unwrap().push(a.to_string());
    }
    let model = body["model"].as_str().unwrap_or_default().to_string();
    let stream = body["stream"].as_bool().unwrap_or(false);
    let include_usage = body["stream_options"]["include_usage"]
        .as_bool()
        .unwrap_or(false);
    let last = body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .unwrap_or(Value::Null);
    // `up-read`: the last `/….txt` path the user named, as a `read_file` call's `file_path`.
    let named = last_user(&body)
        .split_whitespace()
        .map(|w| w.trim_end_matches(['.', ',']))
        .rfind(|w| w.starts_with('/') && w.ends_with(".txt"))
        .map(|p| json!({"file_path": p}).to_string())
        .unwrap_or_default();
    let calls: Vec<(&str, &str, &str)> = match model.as_str() {
        "up-500" => return (StatusCode::INTERNAL_SERVER_ERROR, "boom at http://secret-upstream.internal").into_response(),
        "up-401" | "up-403" => {
            let status = if model == "up-401" { StatusCode::UNAUTHORIZED } else { StatusCode::FORBIDDEN };
            return (status, Json(json!({"error": {"message": "Incorrect API key provided: sk-proj-****wXyZ. You can find your API key at https://platform.openai.com/account/api-keys.", "type": "invalid_request_error", "code": "invalid_api_key", "param": null}}))).into_response()
        }
        // Bodies of 2 MiB, over the 1 MiB bound the tests configure.
        "up-huge-400" => {
            return (StatusCode::BAD_REQUEST, Json(json!({"error": {"message": "x".repeat(2 << 20), "type": "invalid_request_error"}}))).into_response()
        }
        "up-huge" if !stream => {
            return Json(json!({"id": "chatcmpl-up", "object": "chat.completion", "created": 1, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "y".repeat(2 << 20)}, "finish_reason": "stop"}]}))
            .into_response()
        }
        "up-400" => {
            return (StatusCode::BAD_REQUEST, Json(json!({"error": {"message": "context too long", "type": "invalid_request_error", "code": "context_length_exceeded", "param": "messages"}}))).into_response()
        }
        "up-slow-first" => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            vec![]
        }
        // Two sequential rounds: a call until two results are in.
        "up-rounds2" if tool_results(&body) < 2 => {
            if tool_results(&body) == 0 {
                vec![("call_up_1", "read_file", "{\"path\":\"/r1\"}")]
            } else {
                vec![("call_up_2", "read_file", "{\"path\":\"/r2\"}")]
            }
        }
        _ if last["role"] == "tool" => vec![],
        "up-tool" => vec![("call_up_1", "read_file", "{\"path\":\"/x\"}")],
        "up-read" => vec![("call_up_1", "read_file", named.as_str())],
        "up-custom" => vec![("call_up_1", "apply_patch", "{\"input\":\"*** Begin Patch\"}")],
        "up-parallel" | "up-oneshot" => vec![("call_up_1", "read_file", "{\"path\":\"/a\"}"), ("call_up_2", "list_dir", "{\"dir\":\"/b\"}")],
        _ => vec![],
    };
    let text = if last["role"] == "tool" {
        let results: Vec<String> = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| {
                format!(
                    "{}={}",
                    m["tool_call_id"].as_str().unwrap_or(""),
                    m["content"].as_str().unwrap_or("")
                )
            })
            .collect();
        match model.as_str() {
            "up-read" => format!("Tool result: {}", results.join(", ")),
            _ => format!("Results: {}", results.join(", ")),
        }
    } else if model == "up-long" {
        // A summary as long as a model may make one: 256 KiB.
        "s".repeat(256 << 10)
    } else {
        format!("echo: {}", last_user(&body))
    };
    if !stream {
        let message = if model == "up-think" {
            json!({"role": "assistant", "content": text, "reasoning_content": THOUGHT})
        } else if calls.is_empty() {
            json!({"role": "assistant", "content": text})
        } else {
            let tc: Vec<Value> = calls
                .iter()
                .map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}))
                .collect();
            json!({"role": "assistant", "content": null, "tool_calls": tc})
        };
        let finish = match () {
            _ if !calls.is_empty() => "tool_calls",
            _ if model == "up-truncated" => "length",
            _ => "stop",
        };
        let mut answer = json!({"id": "chatcmpl-up", "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}],
            "usage": usage(&model), "x_upstream_extra": {"kept": true}});
        if model == "up-no-usage" {
            answer.as_object_mut().unwrap().remove("usage");
        }
        return Json(answer).into_response();
    }
    let mut parts: Vec<(u64, String)> = vec![(
        0,
        chunk(&model, json!({"role": "assistant", "content": ""}), None),
    )];
    match model.as_str() {
        "up-idle" => {
            parts.push((0, chunk(&model, json!({"content": "partial"}), None)));
            return sse(parts, seen, true);
        }
        "up-endless" => {
            for i in 0..600 {
                parts.push((
                    50,
                    chunk(&model, json!({"content": format!("t{i} ")}), None),
                ));
            }
            return sse(parts, seen, false);
        }
        "up-parallel" if !calls.is_empty() => {
            // Interleaved fragments, ids only on first deltas.
            parts.push((0, chunk(&model, json!({"tool_calls": [{"index": 0, "id": "call_up_1", "type": "function", "function": {"name": "read_file", "arguments": ""}}]}), None)));
            parts.push((0, chunk(&model, json!({"tool_calls": [{"index": 1, "id": "call_up_2", "type": "function", "function": {"name": "list_dir", "arguments": "{\"dir\""}}]}), None)));
            parts.push((0, chunk(&model, json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"path\":\"/a\"}"}}]}), None)));
            parts.push((
                0,
                chunk(
                    &model,
                    json!({"tool_calls": [{"index": 1, "function": {"arguments": ":\"/b\"}"}}]}),
                    None,
                ),
            ));
        }
        "up-oneshot" if !calls.is_empty() => {
            // vLLM/Ollama style: each call whole in one delta, id repeated, no type.
            for (i, (id, name, args)) in calls.iter().enumerate() {
                parts.push((0, chunk(&model, json!({"tool_calls": [{"index": i, "id": id, "function": {"name": name, "arguments": args}}]}), None)));
            }
        }
        _ if !calls.is_empty() => {
            let (id, name, args) = calls[0];
            let (a, b) = args.split_at(args.len() / 2);
            parts.push((0, chunk(&model, json!({"content": null, "tool_calls": [{"index": 0, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}), None)));
            for piece in [a, b] {
                parts.push((
                    0,
                    chunk(
                        &model,
                        json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
                        None,
                    ),
                ));
            }
        }
        _ => {
            if model == "up-think" {
                parts.push((
                    0,
                    chunk(&model, json!({"reasoning_content": THOUGHT}), None),
                ));
            }
            let third = text.len() / 3;
            for piece in [&text[..third], &text[third..2 * third], &text[2 * third..]] {
                parts.push((0, chunk(&model, json!({"content": piece}), None)));
            }
        }
    }
    let finish = match () {
        _ if !calls.is_empty() => "tool_calls",
        _ if model == "up-truncated" => "length",
        _ => "stop",
    };
    parts.push((0, chunk(&model, json!({}), Some(finish))));
    // `up-no-usage` never reports usage, asked or not.
    if include_usage && model != "up-no-usage" {
        let u = json!({"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 1, "model": model, "choices": [], "usage": usage(&model)});
        parts.push((0, format!("data: {u}\n\n")));
    }
    parts.push((0, "data: [DONE]\n\n".to_string()));
    if cut {
        // The first parts, then silence: the gateway's idle timeout breaks the answer off.
        parts.truncate(2);
        return sse(parts, seen, true);
    }
    sse(parts, seen, false)
}

/// The e2e gateway with a fake upstream as backend `up` and `models` (gateway id, the
/// upstream model = the fake's scenario) on it.
pub async fn gateway_on_fake(
    opts: super::Opts,
    models: &'static [(&'static str, &'static str)],
) -> (super::Gateway, FakeUpstream) {
    gateway_on_fake_with(opts, models, String::new()).await
}

/// [`gateway_on_fake`] with `more` appended to the config.
pub async fn gateway_on_fake_with(
    opts: super::Opts,
    models: &'static [(&'static str, &'static str)],
    more: String,
) -> (super::Gateway, FakeUpstream) {
    gateway_on_fake_edited(opts, models, move |s| s + &more).await
}

/// [`gateway_on_fake`] with its config text passed through `edit` first.
pub async fn gateway_on_fake_edited(
    opts: super::Opts,
    models: &'static [(&'static str, &'static str)],
    edit: impl FnOnce(String) -> String,
) -> (super::Gateway, FakeUpstream) {
    let fake = FakeUpstream::start().await;
    let url = fake.url.clone();
    let gw = super::Gateway::start_raw(opts, move |o, dir| {
        let mut s = edit(super::config_text(o, dir));
        s.push_str(&format!(
            "\n[backends.up]\nkind = \"openai\"\nbase_url = \"{url}\"\napi_key_env = \"TURNSTILE_TEST_UPSTREAM_KEY\"\n"
        ));
        for (id, model) in models {
            s.push_str(&format!(
                "\n[[models]]\nid = \"{id}\"\nbackend = \"up\"\nbackend_model = \"{model}\"\n"
            ));
        }
        s
    })
    .await;
    (gw, fake)
}
