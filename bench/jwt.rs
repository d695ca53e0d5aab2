//! JWT verification benchmark (not a test): `cargo bench --bench jwt`.
//!
//! Through the library API, with the committed test keys (RSA 2048, RS256):
//! 1. cold verification (`auth::jwt::verify`: header, issuer pick, signature, claims) for a
//!    PEM issuer and a JWKS issuer;
//! 2. cached verification (`auth::jwt::Cache::verify`: SHA-256 of the token and a map hit);
//! 3. the whole `Authorization` header path (`auth::authenticate_cached`) for a cached JWT
//!    and, for comparison, an API key.
//!
//! Environment: `BENCH_COLD` (default 2000 iterations), `BENCH_CACHED` (default 200000).

// Tests and benchmarks: unwrap is the assertion, and wall-clock time is what they measure.
#![allow(clippy::unwrap_used, clippy::disallowed_types)]

use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::json;
use turnstile::auth::{self, jwt};

fn iters(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `f` `n` times and prints the mean nanoseconds per call.
fn measure(name: &str, n: u64, mut f: impl FnMut()) {
    for _ in 0..n.min(100) {
        f();
    }
    let started = Instant::now();
    for _ in 0..n {
        f();
    }
    let ns = started.elapsed().as_nanos() as f64 / n as f64;
    println!("{name:<44} {ns:>12.0} ns/op   ({n} iterations)");
}

fn main() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/jwt");
    let text = format!(
        r#"
[[auth.jwt]]
issuer = "https://idp-a.test"
audiences = ["turnstile"]
algorithms = ["RS256"]
pem_file = "issuer-public.pem"

[[auth.jwt]]
issuer = "https://idp-b.test"
audiences = ["turnstile"]
algorithms = ["RS256"]
jwks_file = "other-jwks.json"

[[clients]]
id = "keyed"
key_sha256 = "{}"
"#,
        auth::hash_key("sk-bench-key")
    );
    let cfg = turnstile::config::from_toml_str_with(&text, &fixtures, &|p| std::fs::read(p))
        .expect("config");
    let now = auth::jwt_now();
    let sign = |iss: &str, kid: Option<&str>, key: &str| {
        let pem = std::fs::read(fixtures.join(format!("{key}-private.pem"))).expect("key");
        let mut h = Header::new(Algorithm::RS256);
        h.kid = kid.map(str::to_owned);
        let claims = json!({"iss": iss, "sub": "bench", "aud": "turnstile", "exp": now + 3600});
        encode(&h, &claims, &EncodingKey::from_rsa_pem(&pem).expect("pem")).expect("sign")
    };
    let pem_token = sign("https://idp-a.test", None, "issuer");
    let jwks_token = sign("https://idp-b.test", Some("other-1"), "other");
    let cold = iters("BENCH_COLD", 2000);
    let cached = iters("BENCH_CACHED", 200_000);

    println!(
        "JWT verification, RS256 / RSA 2048, {} issuers",
        cfg.jwt.len()
    );
    measure("cold verify (PEM issuer)", cold, || {
        black_box(jwt::verify(&cfg.jwt, black_box(&pem_token)).expect("valid"));
    });
    measure("cold verify (JWKS issuer, kid lookup)", cold, || {
        black_box(jwt::verify(&cfg.jwt, black_box(&jwks_token)).expect("valid"));
    });
    let cache = jwt::Cache::default();
    measure("cached verify (digest + map hit)", cached, || {
        black_box(
            cache
                .verify(&cfg.jwt, black_box(&pem_token), now)
                .expect("valid"),
        );
    });
    let header = format!("Bearer {pem_token}");
    measure("authenticate: cached JWT header", cached, || {
        black_box(
            auth::authenticate_cached(&cfg, Some(&cache), Some(black_box(&header)), now)
                .expect("principal"),
        );
    });
    measure("authenticate: API key header", cached, || {
        black_box(
            auth::authenticate_cached(&cfg, Some(&cache), Some("Bearer sk-bench-key"), now)
                .expect("principal"),
        );
    });
}
