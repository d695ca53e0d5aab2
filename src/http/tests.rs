//! Router tests with `oneshot`: routing, extractor failures and error shapes, the console's
//! headers and the activity API, with a gateway that has clients but no backends.

use super::*;
use axum::body::{Body, Bytes};
use axum::http::Request as HttpRequest;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

async fn app() -> (Router, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[server]\nmax_body_bytes = 1024\n[store]\npath = \"t.db\"\n\
         [[clients]]\nid = \"alice\"\nkey_sha256 = \"{}\"\n",
        crate::auth::hash_key("sk-a")
    );
    let cfg = crate::config::from_toml_str(&text, dir.path()).unwrap();
    let gw = Engine::start(cfg, None).await.unwrap();
    (router(gw), dir)
}

async fn send(app: &Router, req: HttpRequest<Body>) -> (StatusCode, Value) {
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

fn chat_req(key: Option<&str>, body: impl Into<Body>) -> HttpRequest<Body> {
    let mut b =
        HttpRequest::post("/v1/chat/completions").header("content-type", "application/json");
    if let Some(k) = key {
        b = b.header("authorization", format!("Bearer {k}"));
    }
    b.body(body.into()).unwrap()
}

#[tokio::test]
async fn unknown_route_and_wrong_method_are_openai_shaped() {
    let (app, _d) = app().await;
    let (s, v) = send(&app, HttpRequest::get("/nope").body(Body::empty()).unwrap()).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(v["error"]["code"], "not_found");
    let (s, v) = send(
        &app,
        HttpRequest::delete("/v1/chat/completions")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(v["error"]["code"], "method_not_allowed");
}

#[tokio::test]
async fn a_surfaces_routes_refuse_in_its_shape_and_a_shared_path_goes_to_its_claimer() {
    let (app, _d) = app().await;
    let req = |method: &str, path: &str, anthropic: bool| {
        let mut b = HttpRequest::builder().method(method).uri(path);
        if anthropic {
            b = b.header("anthropic-version", "2023-06-01");
        }
        b.header("x-api-key", "sk-a").body(Body::empty()).unwrap()
    };
    let anthropic_type = |v: &Value| v["type"] == "error" && v["error"]["type"].is_string();
    // Under `/v1/messages`: Anthropic's 404 and 405, with or without the version header.
    for (method, path, status) in [
        ("GET", "/v1/messages/nope", StatusCode::NOT_FOUND),
        (
            "GET",
            "/v1/messages/count_tokens",
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        ("PUT", "/v1/messages", StatusCode::METHOD_NOT_ALLOWED),
    ] {
        let (s, v) = send(&app, req(method, path, false)).await;
        assert_eq!(s, status, "{method} {path}");
        assert!(anthropic_type(&v), "{method} {path}: {v}");
    }
    // The shared model list: Anthropic's shape for an Anthropic client, OpenAI's otherwise.
    let (s, v) = send(&app, req("GET", "/v1/models", false)).await;
    assert_eq!((s, v["object"].as_str()), (StatusCode::OK, Some("list")));
    let (_, v) = send(&app, req("GET", "/v1/models", true)).await;
    assert_eq!(v["has_more"], false);
    let (s, v) = send(&app, req("GET", "/v1/models/m", true)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "Claude Code's protocol: 400");
    assert!(anthropic_type(&v), "{v}");
    let (s, v) = send(&app, req("GET", "/v1/models/m", false)).await;
    assert_eq!(
        (s, &v["error"]["code"]),
        (StatusCode::NOT_FOUND, &json!("model_not_found"))
    );
    let (s, v) = send(&app, req("DELETE", "/v1/models", true)).await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
    assert!(anthropic_type(&v), "{v}");
    // An OpenAI route's 405 and an unclaimed 404 keep OpenAI's shape.
    let (s, v) = send(&app, req("PUT", "/v1/responses/compact", false)).await;
    assert_eq!(
        (s, &v["error"]["code"]),
        (StatusCode::METHOD_NOT_ALLOWED, &json!("method_not_allowed"))
    );
    let (s, v) = send(&app, req("GET", "/v2/nope", false)).await;
    assert_eq!(
        (s, &v["error"]["code"]),
        (StatusCode::NOT_FOUND, &json!("not_found"))
    );
}

#[tokio::test]
async fn declared_size_then_auth_then_body() {
    let (app, _d) = app().await;
    // A declared length over the limit: 413 from the headers, before the credential.
    let mut declared = chat_req(None, "x".repeat(2000));
    declared.headers_mut().insert("content-length", 2000.into());
    let (s, v) = send(&app, declared).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(v["error"]["code"], "request_too_large");
    // Without a declared length and without a credential: 401 before the body is read.
    let (s, v) = send(&app, chat_req(None, "x".repeat(2000))).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(v["error"]["code"], "invalid_api_key");
    // Without a Content-Length (streamed body) the limit still holds.
    let stream =
        futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from("y".repeat(2000)))]);
    let (s, _) = send(&app, chat_req(Some("sk-a"), Body::from_stream(stream))).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn auth_then_json_then_model() {
    let (app, _d) = app().await;
    let (s, v) = send(&app, chat_req(None, "{bad")).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("invalid_api_key"))
    );
    let (s, v) = send(&app, chat_req(Some("sk-other"), "{}")).await;
    assert_eq!(
        (s, v["error"]["type"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("authentication_error"))
    );
    let (s, v) = send(&app, chat_req(Some("sk-a"), "{bad")).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_request"))
    );
    let (s, _) = send(
        &app,
        chat_req(Some("sk-a"), r#"{"model":"m","messages":[]}"#),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"unknown_field":1}"#;
    let (s, v) = send(&app, chat_req(Some("sk-a"), body)).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("model_not_found"))
    );
    assert_eq!(v["error"]["param"], "model");
}

#[tokio::test]
async fn messages_routes_speak_anthropic_errors_and_take_x_api_key() {
    let (app, _d) = app().await;
    let post = |key: Option<&str>, path: &str, body: &'static str| {
        let mut b = HttpRequest::post(path).header("content-type", "application/json");
        if let Some(k) = key {
            b = b.header("x-api-key", k);
        }
        b.body(Body::from(body)).unwrap()
    };
    let (s, v) = send(&app, post(None, "/v1/messages?beta=true", "{}")).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "authentication_error");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("invalid_api_key: "));
    // A model the caller may not use (here: none) is 400, as Claude Code's gateway protocol
    // says, on both routes.
    let body = r#"{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#;
    let (s, v) = send(&app, post(Some("sk-a"), "/v1/messages", body)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("model_not_found: "));
    let (s, v) = send(&app, post(Some("sk-a"), "/v1/messages/count_tokens", body)).await;
    assert_eq!(
        (s, v["error"]["type"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_request_error"))
    );
    let (s, v) = send(
        &app,
        post(Some("sk-a"), "/v1/messages", "x".repeat(2000).leak()),
    )
    .await;
    assert_eq!(
        (s, v["error"]["type"].as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, Some("request_too_large"))
    );
    let req = HttpRequest::get("/v1/models")
        .header("x-api-key", "sk-a")
        .header("anthropic-version", "2023-06-01")
        .body(Body::empty())
        .unwrap();
    let (s, v) = send(&app, req).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        v,
        json!({"data": [], "has_more": false, "first_id": null, "last_id": null})
    );
}

#[tokio::test]
async fn anthropic_model_list_pages_by_limit_and_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = format!(
        "[store]\npath = \"t.db\"\n[[clients]]\nid = \"alice\"\nkey_sha256 = \"{}\"\nmodels = [\"m*\"]\n\
         [backends.up]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:9/v1\"\n",
        crate::auth::hash_key("sk-a")
    );
    for m in ["m1", "m2", "m3", "other"] {
        text.push_str(&format!("[[models]]\nid = \"{m}\"\nbackend = \"up\"\n"));
    }
    let cfg = crate::config::from_toml_str(&text, dir.path()).unwrap();
    let app = router(Engine::start(cfg, None).await.unwrap());
    let page = |q: &str| {
        HttpRequest::get(format!("/v1/models{q}"))
            .header("x-api-key", "sk-a")
            .header("anthropic-version", "2023-06-01")
            .body(Body::empty())
            .unwrap()
    };
    let ids = |v: &Value| -> Vec<String> {
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect()
    };
    let (s, v) = send(&app, page("?limit=1000")).await;
    assert_eq!(
        (s, ids(&v)),
        (StatusCode::OK, vec!["m1".into(), "m2".into(), "m3".into()])
    );
    assert_eq!(v["data"][0]["type"], "model");
    let (_, v) = send(&app, page("?limit=2")).await;
    assert_eq!(
        (ids(&v), &v["has_more"], &v["last_id"]),
        (vec!["m1".into(), "m2".into()], &json!(true), &json!("m2"))
    );
    let (_, v) = send(&app, page("?limit=2&after_id=m2")).await;
    assert_eq!(
        (ids(&v), &v["has_more"]),
        (vec!["m3".into()], &json!(false))
    );
    let (_, v) = send(&app, page("?limit=1&before_id=m3")).await;
    assert_eq!(
        (ids(&v), &v["has_more"], &v["first_id"]),
        (vec!["m2".into()], &json!(true), &json!("m2"))
    );
    // A model the caller may not use is no cursor.
    let (_, v) = send(&app, page("?after_id=other")).await;
    assert_eq!(ids(&v), Vec::<String>::new());
    for bad in [
        "?limit=0",
        "?limit=1001",
        "?limit=x",
        "?after_id=m1&before_id=m2",
    ] {
        let (s, v) = send(&app, page(bad)).await;
        assert_eq!(
            (s, v["type"].as_str()),
            (StatusCode::BAD_REQUEST, Some("error")),
            "{bad}"
        );
    }
}

#[tokio::test]
async fn models_health_and_readiness() {
    let (app, _d) = app().await;
    let req = HttpRequest::get("/v1/models")
        .header("authorization", "Bearer sk-a")
        .body(Body::empty())
        .unwrap();
    let (s, v) = send(&app, req).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v, json!({"object": "list", "data": []}));
    let (s, _) = send(
        &app,
        HttpRequest::get("/v1/models").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, v) = send(
        &app,
        HttpRequest::get("/healthz").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!((s, v["status"].as_str()), (StatusCode::OK, Some("ok")));
    let (s, _) = send(
        &app,
        HttpRequest::get("/readyz").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
}

fn get_req(path: &str, key: Option<&str>) -> HttpRequest<Body> {
    let mut b = HttpRequest::get(path);
    if let Some(k) = key {
        b = b.header("authorization", format!("Bearer {k}"));
    }
    b.body(Body::empty()).unwrap()
}

#[tokio::test]
async fn console_assets_carry_a_strict_csp_and_no_inline_script() {
    let (app, _d) = app().await;
    for (path, kind) in [
        ("/console", "text/html"),
        ("/console/", "text/html"),
        ("/console/app.js", "text/javascript"),
        ("/console/api.js", "text/javascript"),
        ("/console/dom.js", "text/javascript"),
        ("/console/queue.js", "text/javascript"),
        ("/console/views.js", "text/javascript"),
        ("/console/notifications.js", "text/javascript"),
        ("/console/app.css", "text/css"),
        ("/console/icon.svg", "image/svg+xml"),
    ] {
        let resp = app.clone().oneshot(get_req(path, None)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        let h = resp.headers();
        let ct = h[header::CONTENT_TYPE].to_str().unwrap();
        assert!(ct.starts_with(kind), "{path}: {ct}");
        let csp = h[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        for part in [
            "default-src 'none'",
            "script-src 'self'",
            "connect-src 'self'",
        ] {
            assert!(csp.contains(part), "{path}: {csp}");
        }
        assert!(!csp.contains("unsafe"), "{csp}");
        assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert_eq!(h[header::X_FRAME_OPTIONS], "DENY");
    }
    let resp = app.oneshot(get_req("/console", None)).await.unwrap();
    let html = resp.into_body().collect().await.unwrap().to_bytes();
    let html = String::from_utf8(html.to_vec()).unwrap();
    // Every script is a file of this origin; no inline handler or style.
    for tag in html.split("<script").skip(1) {
        let open = &tag[..tag.find('>').unwrap()];
        assert!(open.contains("src=\"/console/"), "inline script: {open}");
    }
    assert!(!html.contains(" onclick=") && !html.contains(" style="));
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "an external URL"
    );
}

#[tokio::test]
async fn activity_api_needs_a_credential_and_answers_lists() {
    let (app, _d) = app().await;
    for path in [
        "/v1/whoami",
        "/v1/activity/executions",
        "/v1/activity/threads",
        "/v1/activity/backends",
    ] {
        let (s, v) = send(&app, get_req(path, None)).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{path}");
        assert_eq!(v["error"]["code"], "invalid_api_key", "{path}");
        let (s, _) = send(&app, get_req(path, Some("sk-wrong"))).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{path}");
    }
    let (s, v) = send(&app, get_req("/v1/whoami", Some("sk-a"))).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        v,
        serde_json::json!({"object": "principal", "id": "alice", "approver": false, "groups": [], "models": []})
    );
    for path in [
        "/v1/activity/executions",
        "/v1/activity/threads",
        "/v1/activity/backends",
    ] {
        let (s, v) = send(&app, get_req(path, Some("sk-a"))).await;
        assert_eq!(s, StatusCode::OK, "{path}");
        assert_eq!(
            v,
            serde_json::json!({"object": "list", "data": []}),
            "{path}"
        );
    }
}

#[tokio::test]
async fn approvals_filter_by_reason_and_refuse_an_unknown_one() {
    let (app, _d) = app().await;
    let (s, v) = send(
        &app,
        get_req("/v1/approvals?state=denied&reason=expired", Some("sk-a")),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["data"], serde_json::json!([]));
    let (s, v) = send(&app, get_req("/v1/approvals?reason=bored", Some("sk-a"))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(v["error"]["param"], "reason");
}

/// Claude Code's gateway protocol, the rows a router without backends can answer: a 401 it
/// must not retry, `max_tokens` required (not on `count_tokens`), `safeguards` refused by
/// name, unknown body fields and betas never the reason for a refusal.
#[tokio::test]
async fn messages_follow_the_claude_code_gateway_protocol() {
    let (app, _d) = app().await;
    let post = |key: Option<&str>, path: &str, body: &'static str| {
        let mut b = HttpRequest::post(path)
            .header("content-type", "application/json")
            .header("anthropic-beta", "some-future-beta-2099-01-01,another")
            .header("x-stainless-retry-count", "0");
        if let Some(k) = key {
            b = b.header("x-api-key", k);
        }
        b.body(Body::from(body)).unwrap()
    };
    let resp = app
        .clone()
        .oneshot(post(Some("sk-wrong"), "/v1/messages", "{}"))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(resp.headers()["x-should-retry"], "false");
    let body =
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"future_field":{"a":1}}"#;
    let (s, v) = send(&app, post(Some("sk-a"), "/v1/messages", body)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(
        v["error"]["message"],
        "invalid_request: max_tokens: Field required"
    );
    // `count_tokens` takes no `max_tokens`: the same body gets as far as the model.
    let (_, v) = send(&app, post(Some("sk-a"), "/v1/messages/count_tokens", body)).await;
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("model_not_found: "));
    let body = r#"{"model":"m","max_tokens":8,"safeguards":{"auto_mode":{}},
                   "messages":[{"role":"user","content":"hi"}]}"#;
    let (s, v) = send(&app, post(Some("sk-a"), "/v1/messages", body)).await;
    assert_eq!(
        (s, v["error"]["type"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_request_error"))
    );
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("safeguards"));
}

#[tokio::test]
async fn managed_agents_routes_need_the_beta_and_answer_in_anthropics_shape() {
    let (app, _dir) = app().await;
    let req = |path: &str, key: Option<&str>, beta: bool| {
        let mut b = HttpRequest::get(path);
        if let Some(k) = key {
            b = b.header("x-api-key", k);
        }
        if beta {
            b = b.header("anthropic-beta", "managed-agents-2026-04-01");
        }
        b.body(Body::empty()).unwrap()
    };
    let cases = [
        (req("/v1/sessions", None, true), 401, "authentication_error"),
        (
            req("/v1/sessions", Some("sk-a"), false),
            400,
            "invalid_request_error",
        ),
        (
            req("/v1/sessions/sesn_0", Some("sk-a"), true),
            404,
            "not_found_error",
        ),
        (
            req("/v1/agents/agent_0", Some("sk-a"), true),
            404,
            "not_found_error",
        ),
        (
            req("/v1/sessions/sesn_0/events/stream", Some("sk-a"), true),
            404,
            "not_found_error",
        ),
        (
            req("/v1/sessions?limit=0", Some("sk-a"), true),
            400,
            "invalid_request_error",
        ),
        (
            req("/v1/sessions?agent_id=agent_0", Some("sk-a"), true),
            400,
            "invalid_request_error",
        ),
    ];
    for (r, status, kind) in cases {
        let path = r.uri().to_string();
        let (s, v) = send(&app, r).await;
        assert_eq!(
            (s.as_u16(), v["error"]["type"].as_str()),
            (status, Some(kind)),
            "{path}: {v}"
        );
        assert_eq!(v["type"], "error", "{path}: {v}");
    }
    let (s, v) = send(&app, req("/v1/sessions", Some("sk-a"), true)).await;
    assert_eq!(
        (s, &v["data"], &v["next_page"]),
        (StatusCode::OK, &serde_json::json!([]), &Value::Null)
    );
}
