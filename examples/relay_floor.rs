//! The relay's floor (a benchmark baseline, not part of the product): the same two HTTP hops
//! as the gateway's plain relay, built from the same crates (axum's server, hyper_util's
//! pooled client, tokio's multi-threaded runtime), with none of the gateway's work: no
//! authentication, parsing, model routing, metering, access log or response framing. Run as
//! the gateway is (`relay_floor serve --config FILE`, announcing `listening on URL`), so the
//! benchmarks measure it in the gateway's place:
//!
//! ```sh
//! cargo build --release --example relay_floor
//! BENCH_GATEWAY=target/release/examples/relay_floor bench/instructions.sh chat
//! ```
//!
//! A request goes to the config's `backends.json.base_url` (or `backends.sse`'s when its body
//! names the model `mock-sse`) with `/v1` taken off its path, and the answer streams back.

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use http_body_util::Full;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

/// The gateway's allocator, so that the difference is the gateway's work alone.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Clone)]
struct Floor {
    client: Client<HttpConnector, Full<Bytes>>,
    json: String,
    sse: String,
}

fn base_url(config: &toml::Table, backend: &str) -> String {
    config["backends"][backend]["base_url"]
        .as_str()
        .unwrap_or_else(|| panic!("backends.{backend}.base_url"))
        .to_string()
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = match args.as_slice() {
        [_, serve, flag, path] if serve == "serve" && flag == "--config" => path,
        _ => panic!("usage: relay_floor serve --config FILE"),
    };
    let text = std::fs::read_to_string(path).expect("config");
    let config: toml::Table = text.parse().expect("config TOML");
    let floor = Floor {
        client: Client::builder(TokioExecutor::new()).build_http(),
        json: base_url(&config, "json"),
        sse: base_url(&config, "sse"),
    };
    let app = Router::new().fallback(relay).with_state(floor);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    println!(
        "listening on http://{}",
        listener.local_addr().expect("addr")
    );
    axum::serve(listener, app).await.expect("serve");
}

async fn relay(State(f): State<Floor>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    let Ok(body) = axum::body::to_bytes(req.into_body(), 16 << 20).await else {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    };
    let sse = body.windows(10).any(|w| w == b"\"mock-sse\"");
    let base = if sse { &f.sse } else { &f.json };
    let url = format!("{base}{}", path.strip_prefix("/v1").unwrap_or(&path));
    let up = hyper::Request::post(url)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))
        .expect("request");
    match f.client.request(up).await {
        Ok(resp) => {
            let (parts, body) = resp.into_parts();
            Response::from_parts(parts, Body::new(body))
        }
        Err(_) => StatusCode::BAD_GATEWAY.into_response(),
    }
}
