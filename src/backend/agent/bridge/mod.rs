//! The client-tool MCP bridge: the harness's function tools served to an agent as a
//! Streamable HTTP MCP server, one endpoint per agent session, so that any agent that takes
//! an MCP server over HTTP can call the client's tools and have each call held.
//!
//! The protocol is the official MCP SDK's (`rmcp`: its Streamable HTTP server, sessions and
//! SSE keep-alives); the gateway adds what the SDK cannot know: a loopback listener of its own
//! (`[mcp_bridge] listen`), a path and a random bearer per endpoint (the bearer is kept as a
//! SHA-256 digest and compared in constant time; it reaches the agent only inside its
//! `session/new`), and the binding to the execution running on the session at the moment of
//! a call ([`Host`]). A call while no execution runs is refused, a `tools/call` id is used
//! once per execution, and dropping the [`Endpoint`] removes it and ends its MCP sessions and
//! any call still waiting.

#[cfg(test)]
mod tests;

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Weak};

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    InitializeResult, ListToolsResult, PaginatedRequestParams, ServerCapabilities, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::Value;
use subtle::ConstantTimeEq;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::backend::BackendError;
use crate::digest::sha256;

/// The largest MCP request body the bridge reads (a tool call's arguments).
const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// Connections the bridge serves at once per agent session of the backends it serves (an
/// MCP client's requests, its event stream and a reconnect), and at least
/// `MIN_CONNECTIONS`: a local process cannot take the gateway's descriptors through it.
pub const CONNECTIONS_PER_SESSION: usize = 4;
const MIN_CONNECTIONS: usize = 16;

/// Like the public listener's default: a connection that sends no request head within this
/// is closed (idle ones too).
const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The agent session an endpoint serves: what it lists and where its calls go.
pub trait Host: Send + Sync + 'static {
    /// The client's tools of the session, as declared (MCP `Tool` objects).
    fn tools(&self) -> Vec<Value>;
    /// The execution running on the session now, if any.
    fn running(&self) -> Option<u64>;
    /// A call of the client tool `name` by `execution`: held until the client's answer is sent
    /// on `answer`. False when it cannot be held (that execution no longer runs, or no such
    /// tool); `answer` is then dropped.
    fn call(
        &self,
        execution: u64,
        name: &str,
        arguments: String,
        answer: oneshot::Sender<Answered>,
    ) -> bool;
}

/// The client's result for a held call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answered {
    pub text: String,
    pub failed: bool,
    /// Text the client sent beside its results: one more text block each.
    pub beside: Vec<String>,
}

/// The tool result of an answer. A failed one is one text block, the text beside it on lines
/// of its own: an agent may read only the first block of an error (Claude's ACP adapter
/// does), and the text beside it must reach the model all the same.
fn result(a: Answered) -> CallToolResult {
    if a.failed {
        let mut text = a.text;
        for t in a.beside {
            text.push('\n');
            text.push_str(&t);
        }
        return CallToolResult::error(vec![ContentBlock::text(text)]);
    }
    let mut content = vec![ContentBlock::text(a.text)];
    content.extend(a.beside.into_iter().map(ContentBlock::text));
    CallToolResult::success(content)
}

/// The open endpoints, by path.
type Endpoints = Arc<Mutex<HashMap<String, Arc<Shared>>>>;

/// One bridge listener, shared by every backend configured with the same address.
pub struct Bridge {
    /// The address the listener is bound to (the configured one, with its port resolved).
    pub addr: SocketAddr,
    endpoints: Endpoints,
    /// Its connections' places, grown by each backend that shares it.
    places: Arc<tokio::sync::Semaphore>,
    shutdown: CancellationToken,
}

/// The bridges running, by configured address.
static RUNNING: Mutex<Vec<(SocketAddr, Weak<Bridge>)>> = Mutex::new(Vec::new());

impl Bridge {
    /// The bridge on `listen` (the running one, else a new listener), with places for the
    /// connections of `sessions` more agent sessions.
    pub fn shared(listen: SocketAddr, sessions: usize) -> Result<Arc<Bridge>, BackendError> {
        let connections = sessions.saturating_mul(CONNECTIONS_PER_SESSION);
        let mut running = RUNNING.lock();
        running.retain(|(_, b)| b.strong_count() > 0);
        if let Some(b) = running.iter().find(|(a, _)| *a == listen) {
            if let Some(b) = b.1.upgrade() {
                b.places.add_permits(connections);
                return Ok(b);
            }
        }
        let bridge = Arc::new(Bridge::bind(listen, connections.max(MIN_CONNECTIONS))?);
        running.push((listen, Arc::downgrade(&bridge)));
        Ok(bridge)
    }

    /// A new listener on `listen` (loopback only: the config refuses any other address),
    /// serving at most `connections` at once.
    pub fn bind(listen: SocketAddr, connections: usize) -> Result<Bridge, BackendError> {
        Bridge::bind_with(listen, connections, HEADER_READ_TIMEOUT)
    }

    fn bind_with(
        listen: SocketAddr,
        connections: usize,
        header_read_timeout: std::time::Duration,
    ) -> Result<Bridge, BackendError> {
        let unavailable = |e: std::io::Error| {
            BackendError::Unavailable(format!("mcp_bridge.listen {listen}: {e}"))
        };
        let std_listener = std::net::TcpListener::bind(listen).map_err(unavailable)?;
        std_listener.set_nonblocking(true).map_err(unavailable)?;
        let addr = std_listener.local_addr().map_err(unavailable)?;
        let listener = tokio::net::TcpListener::from_std(std_listener).map_err(unavailable)?;
        let endpoints: Endpoints = Arc::default();
        let shutdown = CancellationToken::new();
        let app = axum::Router::new()
            .route("/mcp/{endpoint}", any(serve))
            .with_state(endpoints.clone());
        let places = Arc::new(tokio::sync::Semaphore::new(connections));
        // The public listener's accept loop: its connection bound and header-read timeout.
        let bounds = crate::server::Bounds {
            places: places.clone(),
            header_read_timeout,
            drain: std::time::Duration::from_secs(1),
        };
        let stop = shutdown.clone().cancelled_owned();
        tokio::spawn(crate::server::accept(listener, app, bounds, stop));
        tracing::info!(%addr, connections, "MCP bridge listening");
        Ok(Bridge {
            addr,
            endpoints,
            places,
            shutdown,
        })
    }

    /// A new endpoint serving `host`, until the returned handle drops.
    pub fn open(self: &Arc<Self>, host: Weak<dyn Host>) -> Endpoint {
        let id = crate::ids::new_id("");
        let bearer = crate::ids::new_id("mcpb-");
        let closed = self.shutdown.child_token();
        let shared = Arc::new_cyclic(|me: &Weak<Shared>| {
            let handler = Handler { shared: me.clone() };
            // MCP sessions live as long as the endpoint: an agent session kept idle for hours
            // still reaches its tools.
            let mut sessions = LocalSessionManager::default();
            sessions.session_config.keep_alive = None;
            // No SSE priming event (an empty `data:` line): Gemini CLI's MCP client parses it
            // as a message, fails, and drops the server's tools.
            sessions.session_config.sse_retry = None;
            let config = StreamableHttpServerConfig::default()
                .with_sse_retry(None)
                .with_cancellation_token(closed.clone())
                .with_max_request_body_bytes(MAX_BODY_BYTES);
            Shared {
                digest: sha256(bearer.as_bytes()),
                host,
                service: StreamableHttpService::new(
                    move || Ok(handler.clone()),
                    Arc::new(sessions),
                    config,
                ),
                closed,
                seen: Mutex::new((0, HashSet::new())),
            }
        });
        self.endpoints.lock().insert(id.clone(), shared);
        Endpoint {
            url: format!("http://{}/mcp/{id}", self.addr),
            bridge: self.clone(),
            id,
            bearer,
        }
    }

    /// Endpoints open now.
    pub fn endpoints(&self) -> usize {
        self.endpoints.lock().len()
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// One agent session's endpoint; dropped, it is gone (its MCP sessions and waiting calls end).
pub struct Endpoint {
    pub url: String,
    bridge: Arc<Bridge>,
    id: String,
    bearer: String,
}

impl Endpoint {
    /// The `Authorization` header value the agent must send (only for its `session/new`).
    pub fn authorization(&self) -> String {
        format!("Bearer {}", self.bearer)
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint").field("url", &self.url).finish()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(shared) = self.bridge.endpoints.lock().remove(&self.id) {
            shared.closed.cancel();
        }
    }
}

struct Shared {
    digest: [u8; 32],
    host: Weak<dyn Host>,
    service: StreamableHttpService<Handler, LocalSessionManager>,
    closed: CancellationToken,
    /// The `tools/call` ids seen for the execution running (by MCP session): each is used once.
    seen: Mutex<(u64, HashSet<String>)>,
}

/// Every request: the endpoint and its bearer first (an unknown endpoint and a wrong bearer
/// get the same answer), then the MCP SDK's service.
async fn serve(
    State(endpoints): State<Endpoints>,
    Path(endpoint): Path<String>,
    req: Request,
) -> Response {
    let shared = endpoints.lock().get(&endpoint).cloned();
    let bearer = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let authorized = match (&shared, bearer) {
        (Some(s), Some(b)) => bool::from(sha256(b.as_bytes()).ct_eq(&s.digest)),
        _ => false,
    };
    let Some(shared) = shared.filter(|_| authorized) else {
        return (
            StatusCode::UNAUTHORIZED,
            [(axum::http::header::WWW_AUTHENTICATE, "Bearer")],
            "unauthorized",
        )
            .into_response();
    };
    // No stream of server-initiated messages: the bridge sends none, and an agent that sees
    // such a stream end may drop the server's tools.
    if req.method() == axum::http::Method::GET {
        return (
            StatusCode::METHOD_NOT_ALLOWED,
            [(axum::http::header::ALLOW, "POST, DELETE")],
        )
            .into_response();
    }
    let (parts, body) = req.into_parts();
    let Ok(body) = axum::body::to_bytes(body, MAX_BODY_BYTES).await else {
        return (StatusCode::PAYLOAD_TOO_LARGE, "too large").into_response();
    };
    if let Some(refusal) = replayed(&shared, &parts, &body) {
        return refusal;
    }
    let service = shared.service.clone();
    drop(shared);
    let req = Request::from_parts(parts, Body::from(body));
    match service.oneshot(req).await {
        Ok(response) => response.map(Body::new),
        Err(never) => match never {},
    }
}

/// A `tools/call` whose id its MCP session already used while the same execution runs: refused
/// before the MCP service sees it (which would otherwise answer the two on one stream).
fn replayed(shared: &Shared, parts: &axum::http::request::Parts, body: &[u8]) -> Option<Response> {
    let msg: Value = serde_json::from_slice(body).ok()?;
    if msg["method"] != "tools/call" {
        return None;
    }
    let execution = shared.host.upgrade()?.running()?;
    let mcp_session = parts
        .headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let key = format!("{mcp_session} {}", msg["id"]);
    let mut seen = shared.seen.lock();
    if seen.0 != execution {
        *seen = (execution, HashSet::new());
    }
    if seen.1.insert(key) {
        return None;
    }
    let error = serde_json::json!({"jsonrpc": "2.0", "id": msg["id"],
        "error": {"code": -32600, "message": "this tools/call id was already used"}});
    Some(
        (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            error.to_string(),
        )
            .into_response(),
    )
}

#[derive(Clone)]
struct Handler {
    shared: Weak<Shared>,
}

impl Handler {
    fn host(&self) -> Result<(Arc<Shared>, Arc<dyn Host>), McpError> {
        let gone = || McpError::invalid_request("this session has ended", None);
        let shared = self.shared.upgrade().ok_or_else(gone)?;
        let host = shared.host.upgrade().ok_or_else(gone)?;
        Ok((shared, host))
    }
}

impl ServerHandler for Handler {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("turnstile", env!("CARGO_PKG_VERSION")))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let (_, host) = self.host()?;
        let tools = host
            .tools()
            .into_iter()
            .filter_map(|t| serde_json::from_value::<Tool>(t).ok())
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let (shared, host) = self.host()?;
        let Some(execution) = host.running() else {
            return Err(McpError::invalid_request(
                "no execution is running on this session",
                None,
            ));
        };
        let arguments = match request.arguments {
            Some(a) => Value::Object(a).to_string(),
            None => "{}".to_string(),
        };
        let (tx, rx) = oneshot::channel();
        if !host.call(execution, &request.name, arguments, tx) {
            return Err(McpError::invalid_params(
                format!("`{}` cannot be called now", request.name),
                None,
            ));
        }
        drop(host);
        let closed = shared.closed.clone();
        drop(shared);
        tokio::select! {
            answer = rx => match answer {
                Ok(a) => Ok(result(a).into()),
                Err(_) => Err(McpError::internal_error("the turn ended before the call was answered", None)),
            },
            () = context.ct.cancelled() => Err(McpError::internal_error("the call was cancelled", None)),
            () = closed.cancelled() => Err(McpError::internal_error("this session has ended", None)),
        }
    }
}
