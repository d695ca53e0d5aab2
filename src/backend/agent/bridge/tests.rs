use super::*;

use serde_json::json;

/// A held call: (execution, name, arguments, where its answer goes).
type Call = (u64, String, String, oneshot::Sender<Answered>);

/// A session whose running execution the test sets, recording the calls it holds.
#[derive(Default)]
struct FakeHost {
    running: Mutex<Option<u64>>,
    calls: Mutex<Vec<Call>>,
    arrived: tokio::sync::Notify,
}

impl Host for FakeHost {
    fn tools(&self) -> Vec<Value> {
        vec![json!({"name": "read_file", "description": "reads a file",
            "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}},
            "annotations": {"readOnlyHint": true}})]
    }
    fn running(&self) -> Option<u64> {
        *self.running.lock()
    }
    fn call(
        &self,
        execution: u64,
        name: &str,
        arguments: String,
        answer: oneshot::Sender<Answered>,
    ) -> bool {
        if *self.running.lock() != Some(execution) || name != "read_file" {
            return false;
        }
        self.calls
            .lock()
            .push((execution, name.to_string(), arguments, answer));
        self.arrived.notify_one();
        true
    }
}

struct Client {
    http: reqwest::Client,
    url: String,
    authorization: String,
    session: Option<String>,
}

impl Client {
    /// A client of `endpoint`, its MCP session initialized.
    async fn connect(endpoint: &Endpoint) -> Client {
        let mut c = Client {
            http: reqwest::Client::new(),
            url: endpoint.url.clone(),
            authorization: endpoint.authorization(),
            session: None,
        };
        let (status, session, messages) = c
            .post(
                json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "test", "version": "0"}}}),
            )
            .await;
        assert_eq!(status, 200, "{messages:?}");
        assert_eq!(messages[0]["result"]["serverInfo"]["name"], "turnstile");
        c.session = session;
        let (status, _, _) = c
            .post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        assert_eq!(status, 202);
        c
    }

    /// One POST: its status, the MCP session it names and the JSON-RPC messages of its body.
    async fn post(&self, body: Value) -> (u16, Option<String>, Vec<Value>) {
        let mut req = self
            .http
            .post(&self.url)
            .header("authorization", &self.authorization)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18")
            .json(&body);
        if let Some(s) = &self.session {
            req = req.header("mcp-session-id", s);
        }
        let resp = tokio::time::timeout(std::time::Duration::from_secs(30), req.send())
            .await
            .expect("an answer")
            .expect("sent");
        let status = resp.status().as_u16();
        let session = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let text = tokio::time::timeout(std::time::Duration::from_secs(30), resp.text())
            .await
            .expect("a whole body")
            .unwrap_or_default();
        let messages = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .chain(text.starts_with('{').then_some(text.as_str()))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect();
        (status, session, messages)
    }

    async fn call(&self, id: u64, path: &str) -> Value {
        let (status, _, messages) = self
            .post(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "read_file", "arguments": {"path": path}}}))
            .await;
        assert_eq!(status, 200, "{messages:?}");
        messages
            .into_iter()
            .find(|m| m["id"] == id)
            .expect("its answer")
    }
}

async fn setup() -> (Arc<Bridge>, Arc<FakeHost>, Endpoint) {
    let bridge = Arc::new(Bridge::bind("127.0.0.1:0".parse().unwrap(), 16).unwrap());
    let host = Arc::new(FakeHost::default());
    let weak: Weak<dyn Host> = Arc::downgrade(&(host.clone() as Arc<dyn Host>));
    let endpoint = bridge.open(weak);
    (bridge, host, endpoint)
}

async fn next_call(host: &FakeHost) -> Call {
    loop {
        let notified = host.arrived.notified();
        if let Some(c) = host.calls.lock().pop() {
            return c;
        }
        tokio::time::timeout(std::time::Duration::from_secs(30), notified)
            .await
            .expect("a call arrives");
    }
}

#[tokio::test]
async fn a_call_is_held_until_the_client_answers() {
    let (_bridge, host, endpoint) = setup().await;
    *host.running.lock() = Some(7);
    let client = Arc::new(Client::connect(&endpoint).await);
    let (_, _, listed) = client
        .post(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .await;
    let tools = &listed[0]["result"]["tools"];
    assert_eq!(tools[0]["name"], "read_file");
    assert_eq!(tools[0]["annotations"]["readOnlyHint"], true);
    let c = client.clone();
    let waiting = tokio::spawn(async move { c.call(2, "a.txt").await });
    let (execution, name, arguments, answer) = next_call(&host).await;
    assert_eq!((execution, name.as_str()), (7, "read_file"));
    assert_eq!(
        serde_json::from_str::<Value>(&arguments).unwrap(),
        json!({"path": "a.txt"})
    );
    answer
        .send(Answered {
            text: "contents of a".into(),
            failed: false,
            beside: vec!["and more".into()],
        })
        .unwrap();
    let result = waiting.await.unwrap();
    assert_eq!(result["result"]["content"][0]["text"], "contents of a");
    assert_eq!(result["result"]["content"][1]["text"], "and more");
    assert_eq!(result["result"]["isError"], false);
    // A failed result is an error result.
    let c = client.clone();
    let waiting = tokio::spawn(async move { c.call(3, "b.txt").await });
    let (_, _, _, answer) = next_call(&host).await;
    let failed = Answered {
        text: "no such file".into(),
        failed: true,
        beside: vec!["and more".into()],
    };
    answer.send(failed).unwrap();
    let result = waiting.await.unwrap();
    assert_eq!(result["result"]["isError"], true);
    // One block, the text beside it on its own line.
    let content = result["result"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 1, "{result}");
    assert_eq!(content[0]["text"], "no such file\nand more");
}

#[tokio::test]
async fn a_strangers_bearer_and_an_unknown_endpoint_are_refused_alike() {
    let (bridge, host, endpoint) = setup().await;
    *host.running.lock() = Some(1);
    let other = bridge.open(Arc::downgrade(&(host.clone() as Arc<dyn Host>)));
    let body = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}});
    let mut answers = Vec::new();
    for (url, authorization) in [
        // Another session's bearer.
        (endpoint.url.clone(), other.authorization()),
        (endpoint.url.clone(), "Bearer mcpb-0123".to_string()),
        (endpoint.url.clone(), String::new()),
        // The right bearer at an endpoint that does not exist.
        (
            format!("http://{}/mcp/nothing-here", bridge.addr),
            endpoint.authorization(),
        ),
    ] {
        let client = Client {
            http: reqwest::Client::new(),
            url,
            authorization,
            session: None,
        };
        let resp = client
            .http
            .post(&client.url)
            .header("authorization", &client.authorization)
            .header("accept", "application/json, text/event-stream")
            .json(&body)
            .send()
            .await
            .unwrap();
        answers.push((resp.status().as_u16(), resp.text().await.unwrap()));
    }
    assert!(answers.iter().all(|a| *a == answers[0]), "{answers:?}");
    assert_eq!(answers[0].0, 401);
    assert!(host.calls.lock().is_empty());
    // The owner's bearer works.
    Client::connect(&endpoint).await;
}

#[tokio::test]
async fn no_call_is_held_while_no_execution_runs() {
    let (_bridge, host, endpoint) = setup().await;
    let client = Client::connect(&endpoint).await;
    // Listing works (agents list at session start, before any turn)...
    let (_, _, listed) = client
        .post(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .await;
    assert_eq!(listed[0]["result"]["tools"][0]["name"], "read_file");
    // ...a call does not.
    let refused = client.call(2, "a.txt").await;
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no execution"),
        "{refused}"
    );
    // An execution that ended: the host no longer holds calls for it.
    *host.running.lock() = Some(4);
    let waiting = {
        let client = Arc::new(client);
        let c = client.clone();
        let w = tokio::spawn(async move { c.call(3, "a.txt").await });
        let (_, _, _, answer) = next_call(&host).await;
        *host.running.lock() = None;
        drop(answer);
        let ended = w.await.unwrap();
        assert!(ended["error"].is_object(), "{ended}");
        client
    };
    let refused = waiting.call(4, "a.txt").await;
    assert!(refused["error"].is_object(), "{refused}");
    assert!(host.calls.lock().is_empty());
}

#[tokio::test]
async fn a_replayed_call_id_is_refused_and_the_first_call_still_answered() {
    let (_bridge, host, endpoint) = setup().await;
    *host.running.lock() = Some(1);
    let client = Arc::new(Client::connect(&endpoint).await);
    let c = client.clone();
    let first = tokio::spawn(async move { c.call(9, "a.txt").await });
    let (_, _, _, answer) = next_call(&host).await;
    let replay = client.call(9, "a.txt").await;
    assert!(
        replay["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("already used"),
        "{replay}"
    );
    assert!(host.calls.lock().is_empty(), "the replay was not held");
    answer
        .send(Answered {
            text: "once".into(),
            failed: false,
            beside: vec![],
        })
        .unwrap();
    assert_eq!(first.await.unwrap()["result"]["content"][0]["text"], "once");
    // Answered, the id stays used for this execution.
    let again = client.call(9, "a.txt").await;
    assert!(again["error"].is_object(), "{again}");
}

#[tokio::test]
async fn a_released_endpoint_is_gone_with_its_waiting_calls() {
    let (bridge, host, endpoint) = setup().await;
    *host.running.lock() = Some(1);
    let client = Arc::new(Client::connect(&endpoint).await);
    let c = client.clone();
    let waiting = tokio::spawn(async move {
        c.post(json!({"jsonrpc": "2.0", "id": 5,
        "method": "tools/call", "params": {"name": "read_file", "arguments": {}}}))
            .await
    });
    let _held = next_call(&host).await;
    assert_eq!(bridge.endpoints(), 1);
    drop(endpoint);
    assert_eq!(bridge.endpoints(), 0);
    let (_, _, messages) = waiting.await.unwrap();
    assert!(
        !messages.iter().any(|m| m["result"].is_object()),
        "{messages:?}"
    );
    let (status, _, _) = client
        .post(json!({"jsonrpc": "2.0", "id": 6, "method": "tools/list"}))
        .await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn the_listener_bounds_its_connections_and_closes_idle_ones() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let wait = std::time::Duration::from_secs(15);
    let header_timeout = std::time::Duration::from_millis(300);
    let loopback = "127.0.0.1:0".parse().unwrap();
    let bridge = Bridge::bind_with(loopback, 4, header_timeout).unwrap();
    // Four connections that send nothing take every place.
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(tokio::net::TcpStream::connect(bridge.addr).await.unwrap());
    }
    // A fifth waits for a place: its request is answered only once an idle one was closed.
    let asked = tokio::time::Instant::now();
    let mut fifth = tokio::net::TcpStream::connect(bridge.addr).await.unwrap();
    fifth
        .write_all(b"POST /mcp/nobody HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        .await
        .unwrap();
    let mut answer = [0u8; 12];
    tokio::time::timeout(wait, fifth.read_exact(&mut answer))
        .await
        .expect("the fifth is answered")
        .unwrap();
    assert_eq!(&answer, b"HTTP/1.1 401");
    assert!(
        asked.elapsed() >= header_timeout,
        "served beside four connections"
    );
    // The idle ones were closed by the header-read timeout.
    for mut c in idle {
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(wait, c.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "an idle connection stayed open"
        );
    }
}
