use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

fn client_config(port: u16, first_byte_ms: u64) -> UpstreamConfig {
    UpstreamConfig {
        base_url: format!("http://127.0.0.1:{port}/v1"),
        api_key_env: None,
        ca_file: None,
        connect_timeout: Duration::from_secs(5),
        first_byte_timeout: Duration::from_millis(first_byte_ms),
        idle_timeout: Duration::from_secs(5),
        total_timeout: Duration::from_secs(5),
        max_idle_connections: 1,
        max_response_bytes: 16,
    }
}

fn client(port: u16, first_byte_ms: u64) -> Client {
    Client::new("up", &client_config(port, first_byte_ms)).unwrap()
}

/// A loopback upstream that answers one request with `answer` (None: never answers).
async fn upstream(answer: Option<&'static str>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let _ = conn.read(&mut buf).await;
        match answer {
            Some(a) => {
                let _ = conn.write_all(a.as_bytes()).await;
                let _ = conn.shutdown().await;
            }
            None => std::future::pending::<()>().await,
        }
    });
    port
}

#[tokio::test]
async fn a_refused_connection_is_unavailable() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let e = client(port, 5_000)
        .send(Bytes::from("{}"), None)
        .await
        .unwrap_err();
    assert!(matches!(e, BackendError::Unavailable(_)), "{e:?}");
}

/// A TLS upstream on loopback whose certificate (for `127.0.0.1`) a self-signed CA
/// issued: the CA's PEM and the port. It completes handshakes and answers nothing.
async fn tls_upstream() -> (String, u16) {
    use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca, rcgen::KeyPair::generate().unwrap()).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    let cert = leaf.signed_by(&key, &ca).unwrap();
    let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let provider = tokio_rustls::rustls::crypto::ring::default_provider();
    let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider.into())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], der)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(mut tls) = acceptor.accept(tcp).await {
                    let _ = tls.read(&mut [0u8; 4096]).await;
                    std::future::pending::<()>().await
                }
            });
        }
    });
    (ca.pem(), port)
}

#[tokio::test]
async fn an_untrusted_certificate_fails_the_handshake_with_its_reason() {
    let (ca_pem, port) = tls_upstream().await;
    let mut c = client(port, 5_000);
    c.uri = format!("https://127.0.0.1:{port}/v1/chat/completions")
        .parse()
        .unwrap();
    let req = hyper::Request::post(c.uri.clone())
        .body(Full::new(Bytes::from("{}")))
        .unwrap();
    let e = c.client.request(req).await.unwrap_err();
    let reason = cause(&e);
    assert!(reason.contains("UnknownIssuer"), "{reason}");
    assert!(!timed_out(&e), "{reason}");
    let e = c.send(Bytes::from("{}"), None).await.unwrap_err();
    assert!(matches!(e, BackendError::Unavailable(_)), "{e:?}");

    // Trusted through `ca_file`, the handshake completes (the request then waits).
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca_pem).unwrap();
    let cfg = UpstreamConfig {
        base_url: format!("https://127.0.0.1:{port}/v1"),
        ca_file: Some(ca_file),
        first_byte_timeout: Duration::from_millis(300),
        ..client_config(port, 300)
    };
    let e = Client::new("up", &cfg)
        .unwrap()
        .send(Bytes::from("{}"), None)
        .await
        .unwrap_err();
    assert!(matches!(e, BackendError::Timeout), "{e:?}");
}

#[tokio::test(start_paused = true)]
async fn an_upstream_without_headers_times_out_at_the_first_byte() {
    let port = upstream(None).await;
    let e = client(port, 200)
        .send(Bytes::from("{}"), None)
        .await
        .unwrap_err();
    assert!(matches!(e, BackendError::Timeout), "{e:?}");
}

#[tokio::test]
async fn bodies_over_the_bound_are_refused_declared_or_not() {
    let declared = "HTTP/1.1 200 OK\r\ncontent-length: 17\r\n\r\n{\"a\":\"xxxxxxxxx\"}";
    let port = upstream(Some(declared)).await;
    let resp = client(port, 5_000)
        .send(Bytes::from("{}"), None)
        .await
        .unwrap();
    assert_eq!(bounded(resp, 16).await, Err(Unread::Over));
    let chunked = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n9\r\n{\"a\":\"xxx\r\n9\r\nxxxxxxx\"}\r\n0\r\n\r\n";
    let port = upstream(Some(chunked)).await;
    let resp = client(port, 5_000)
        .send(Bytes::from("{}"), None)
        .await
        .unwrap();
    assert_eq!(bounded(resp, 16).await, Err(Unread::Over));
    let small = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
    let port = upstream(Some(small)).await;
    let resp = client(port, 5_000)
        .send(Bytes::from("{}"), None)
        .await
        .unwrap();
    assert_eq!(bounded(resp, 16).await.unwrap(), Bytes::from("{}"));
}

#[tokio::test]
async fn an_upstream_4xx_is_relayed_and_a_refused_key_is_not() {
    let body = r#"{"error":{"message":"too long","type":"invalid_request_error","code":"ctx","param":"messages"}}"#;
    let answer: &'static str = Box::leak(
        format!(
            "HTTP/1.1 400 Bad Request\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_boxed_str(),
    );
    let port = upstream(Some(answer)).await;
    let mut c = client(port, 5_000);
    c.max_response_bytes = 1024;
    let Err(BackendError::Refused(r)) = c.send(Bytes::from("{}"), None).await else {
        panic!()
    };
    assert_eq!((r.status, r.message.as_str()), (400, "too long"));
    let port = upstream(Some(
        "HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n",
    ))
    .await;
    let e = client(port, 5_000)
        .send(Bytes::from("{}"), None)
        .await
        .unwrap_err();
    assert!(matches!(e, BackendError::Unavailable(_)), "{e:?}");
}
