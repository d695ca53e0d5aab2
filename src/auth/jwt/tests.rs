//! JWT verification tests: the RFC 8725 attack matrix, key rotation and the cache.

use super::*;
use crate::config::{from_toml_str_with, Config};
use jsonwebtoken::{encode, EncodingKey, Header};
use serde_json::json;
use std::path::Path;

const PRIVATE: &str = include_str!("../../../fixtures/jwt/issuer-private.pem");
const PUBLIC: &str = include_str!("../../../fixtures/jwt/issuer-public.pem");
const OTHER_PRIVATE: &str = include_str!("../../../fixtures/jwt/other-private.pem");
const OTHER_JWKS: &str = include_str!("../../../fixtures/jwt/other-jwks.json");
const ISS: &str = "https://idp.test";
const ISS2: &str = "https://other.test";

fn files(p: &Path) -> std::io::Result<Vec<u8>> {
    match p.file_name().and_then(|n| n.to_str()) {
        Some("issuer-public.pem") => Ok(PUBLIC.as_bytes().to_vec()),
        Some("other-jwks.json") => Ok(OTHER_JWKS.as_bytes().to_vec()),
        _ => Err(std::io::Error::from(std::io::ErrorKind::NotFound)),
    }
}

fn cfg(extra: &str) -> Config {
    let text = format!(
        r#"
[[auth.jwt]]
issuer = "{ISS}"
audiences = ["turnstile"]
algorithms = ["RS256"]
pem_file = "keys/issuer-public.pem"
leeway_seconds = 30
{extra}
[[auth.jwt]]
issuer = "{ISS2}"
audiences = ["turnstile"]
algorithms = ["RS256", "PS256"]
jwks_file = "other-jwks.json"
"#
    );
    from_toml_str_with(&text, Path::new("/etc/t"), &files).unwrap()
}

fn now() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

fn claims() -> Value {
    json!({"iss": ISS, "sub": "alice", "aud": "turnstile", "exp": now() + 600})
}

fn sign(header: &Header, claims: &Value, pem: &str) -> String {
    encode(
        header,
        claims,
        &EncodingKey::from_rsa_pem(pem.as_bytes()).unwrap(),
    )
    .unwrap()
}

fn rs256(claims: &Value) -> String {
    sign(&Header::new(Algorithm::RS256), claims, PRIVATE)
}

/// base64url without padding, so the tests can forge tokens by hand.
fn b64(input: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

fn verify_one(cfg: &Config, token: &str) -> Result<Verified, JwtError> {
    verify(&cfg.jwt, token)
}

#[test]
fn principal_ids_split_at_the_first_hash() {
    let id = principal_id("https://idp.test", "a#b");
    assert_eq!(id, "jwt:https://idp.test#a#b");
    assert_eq!(split_principal(&id), Some(("https://idp.test", "a#b")));
    assert_ne!(principal_id(ISS, "alice"), principal_id(ISS2, "alice"));
    assert_eq!(split_principal("alice"), None);
    assert!(looks_like_jwt("a.b.c") && !looks_like_jwt("sk-a.b") && !looks_like_jwt("a.b.c.d"));
}

#[test]
fn a_good_token_verifies_to_its_subject() {
    let cfg = cfg("");
    let v = verify_one(&cfg, &rs256(&claims())).unwrap();
    assert_eq!(
        (v.issuer.issuer.as_str(), v.subject.as_str()),
        (ISS, "alice")
    );
    // `aud` as a list containing ours is fine too.
    let mut c = claims();
    c["aud"] = json!(["other", "turnstile"]);
    assert!(verify_one(&cfg, &rs256(&c)).is_ok());
}

#[test]
fn the_attack_matrix_fails_closed() {
    let cfg = cfg("");
    let cases: Vec<(&str, String, JwtError)> = vec![
        {
            // alg:none, no signature.
            let h = b64(br#"{"alg":"none","typ":"JWT"}"#);
            let p = b64(claims().to_string().as_bytes());
            ("alg none", format!("{h}.{p}."), JwtError::Malformed)
        },
        {
            // HS256 with the RSA public key bytes as the HMAC secret.
            let t = encode(
                &Header::new(Algorithm::HS256),
                &claims(),
                &EncodingKey::from_secret(PUBLIC.as_bytes()).unwrap(),
            )
            .unwrap();
            ("HS256 with the public key", t, JwtError::Algorithm)
        },
        {
            let mut c = claims();
            c["exp"] = json!(now() - 120);
            ("expired beyond leeway", rs256(&c), JwtError::Expired)
        },
        {
            let mut c = claims();
            c["nbf"] = json!(now() + 120);
            ("nbf in the future", rs256(&c), JwtError::NotYetValid)
        },
        {
            let mut c = claims();
            c["aud"] = json!("someone-else");
            ("wrong aud", rs256(&c), JwtError::Audience)
        },
        {
            let mut c = claims();
            c["iss"] = json!("https://evil.test");
            ("unknown iss", rs256(&c), JwtError::UnknownIssuer)
        },
        {
            let t = sign(&Header::new(Algorithm::RS256), &claims(), OTHER_PRIVATE);
            ("bad signature", t, JwtError::Signature)
        },
        {
            let mut c = claims();
            c.as_object_mut().unwrap().remove("exp");
            (
                "missing exp",
                rs256(&c),
                JwtError::MissingClaim("exp".into()),
            )
        },
        {
            let mut c = claims();
            c.as_object_mut().unwrap().remove("sub");
            (
                "missing sub",
                rs256(&c),
                JwtError::MissingClaim("sub".into()),
            )
        },
        {
            let mut c = claims();
            c["sub"] = json!("a\nb");
            ("control character in sub", rs256(&c), JwtError::Subject)
        },
        {
            let t = sign(&Header::new(Algorithm::RS512), &claims(), PRIVATE);
            ("alg outside the allow-list", t, JwtError::Algorithm)
        },
        {
            // A tampered payload under a valid signature.
            let t = rs256(&claims());
            let parts: Vec<&str> = t.split('.').collect();
            let mut c = claims();
            c["sub"] = json!("root");
            let forged = format!(
                "{}.{}.{}",
                parts[0],
                b64(c.to_string().as_bytes()),
                parts[2]
            );
            ("tampered payload", forged, JwtError::Signature)
        },
    ];
    for (name, token, want) in cases {
        assert_eq!(verify_one(&cfg, &token).unwrap_err(), want, "case: {name}");
    }
}

#[test]
fn leeway_accepts_a_token_just_expired() {
    let cfg = cfg("");
    let mut c = claims();
    c["exp"] = json!(now() - 10);
    assert!(verify_one(&cfg, &rs256(&c)).is_ok());
    c["nbf"] = json!(now() + 10);
    assert!(verify_one(&cfg, &rs256(&c)).is_ok());
}

#[test]
fn jwks_selects_by_kid_and_honours_the_key_alg() {
    let cfg = cfg("");
    let mut c = claims();
    c["iss"] = json!(ISS2);
    let mut h = Header::new(Algorithm::RS256);
    h.kid = Some("other-1".into());
    let v = verify_one(&cfg, &sign(&h, &c, OTHER_PRIVATE)).unwrap();
    assert_eq!(v.issuer.issuer, ISS2);
    h.kid = Some("../../etc/passwd' OR 1=1".into());
    assert_eq!(
        verify_one(&cfg, &sign(&h, &c, OTHER_PRIVATE)).unwrap_err(),
        JwtError::UnknownKey
    );
    h.kid = None;
    assert_eq!(
        verify_one(&cfg, &sign(&h, &c, OTHER_PRIVATE)).unwrap_err(),
        JwtError::UnknownKey
    );
    // PS256 is allowed for the issuer, but the JWK says RS256.
    let mut h = Header::new(Algorithm::PS256);
    h.kid = Some("other-1".into());
    assert_eq!(
        verify_one(&cfg, &sign(&h, &c, OTHER_PRIVATE)).unwrap_err(),
        JwtError::Algorithm
    );
    // The right key of the wrong issuer.
    let mut h = Header::new(Algorithm::RS256);
    h.kid = Some("other-1".into());
    assert_eq!(
        verify_one(&cfg, &sign(&h, &c, PRIVATE)).unwrap_err(),
        JwtError::Signature
    );
}

#[test]
fn required_claims_and_typ() {
    let cfg = cfg("require = [\"tenant\"]\ntyp = \"at+jwt\"");
    let mut h = Header::new(Algorithm::RS256);
    h.typ = Some("at+jwt".into());
    let mut c = claims();
    assert_eq!(
        verify_one(&cfg, &sign(&h, &c, PRIVATE)).unwrap_err(),
        JwtError::MissingClaim("tenant".into())
    );
    c["tenant"] = json!("t1");
    assert!(verify_one(&cfg, &sign(&h, &c, PRIVATE)).is_ok());
    h.typ = Some("application/AT+JWT".into());
    assert!(verify_one(&cfg, &sign(&h, &c, PRIVATE)).is_ok());
    // An ID token (typ JWT) is not an access token.
    h.typ = Some("JWT".into());
    assert_eq!(
        verify_one(&cfg, &sign(&h, &c, PRIVATE)).unwrap_err(),
        JwtError::Type
    );
}

#[test]
fn cache_serves_only_live_entries_of_the_current_generation() {
    let cfg = cfg("");
    let cache = Cache::with_capacity(2);
    let t = rs256(&claims());
    let a = cache.verify(&cfg.jwt, &t, now()).unwrap();
    let b = cache.verify(&cfg.jwt, &t, now()).unwrap();
    assert_eq!((a.subject.as_str(), b.subject.as_str()), ("alice", "alice"));
    assert_eq!(cache.len(), 1);

    // An expired token planted as if verified earlier: the cache answers while the entry
    // is live, and never past its `valid_until` or for another config generation.
    let mut c = claims();
    c["exp"] = json!(now() - 120);
    let expired = rs256(&c);
    let plant = |cache: &Cache| {
        cache.entries.lock().insert(
            crate::auth::sha256(expired.as_bytes()),
            Entry {
                issuer: Arc::downgrade(&cfg.jwt[0]),
                subject: "alice".into(),
                groups: Default::default(),
                valid_until: now() + 1000,
            },
        );
    };
    plant(&cache);
    assert!(cache.verify(&cfg.jwt, &expired, now()).is_ok());
    assert_eq!(
        cache.verify(&cfg.jwt, &expired, now() + 1001).unwrap_err(),
        JwtError::Expired,
        "past valid_until the token is verified afresh"
    );
    plant(&cache);
    let reloaded = self::cfg("");
    assert_eq!(
        cache.verify(&reloaded.jwt, &expired, now()).unwrap_err(),
        JwtError::Expired,
        "a reload never answers from an older generation"
    );

    // The bound holds; no token text is kept (keys are digests).
    for sub in ["b", "c", "d"] {
        let mut c = claims();
        c["sub"] = json!(sub);
        cache.verify(&cfg.jwt, &rs256(&c), now()).unwrap();
    }
    assert!(cache.len() <= 2);
}

#[test]
fn a_providers_jwks_keeps_only_the_keys_it_can_use() {
    let set: Value =
        serde_json::from_str(include_str!("../../../fixtures/jwt/other-jwks.json")).unwrap();
    let rsa = set["keys"][0].clone();
    let mut enc = rsa.clone();
    enc["use"] = json!("enc");
    enc["kid"] = json!("enc-1");
    let mut twin = rsa.clone();
    twin["kid"] = json!("twin");
    let secret = json!({"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"});
    let doc = json!({"keys": [rsa, enc, twin.clone(), twin, secret, {"kty": "RSA"}]});
    let keys = usable_jwks(doc.to_string().as_bytes(), &[Algorithm::RS256]).unwrap();
    let kids: Vec<&str> = keys.iter().map(|k| k.kid.as_str()).collect();
    assert_eq!(kids, ["other-1"], "a repeated kid is dropped, both copies");
    assert!(usable_jwks(doc.to_string().as_bytes(), &[Algorithm::ES256]).is_err());
    assert!(usable_jwks(b"[]", &[Algorithm::RS256]).is_err());
}

#[test]
fn the_groups_claim_names_the_subjects_groups() {
    let groups = |extra: &str, claim: Value| {
        let cfg = cfg(extra);
        let mut c = claims();
        let mut path: Vec<&str> = cfg.jwt[0].groups_claim.split('.').collect();
        let last = path.pop().unwrap();
        let mut at = &mut c;
        for p in path {
            at[p] = json!({});
            at = &mut at[p];
        }
        at[last] = claim;
        let token = rs256(&c);
        let g = verify_one(&cfg, &token).unwrap().groups;
        // The cache keeps them.
        let cache = Cache::default();
        cache.verify(&cfg.jwt, &token, now()).unwrap();
        assert_eq!(cache.verify(&cfg.jwt, &token, now()).unwrap().groups, g);
        g.to_vec()
    };
    assert_eq!(groups("", json!(["dev", "ops"])), ["dev", "ops"]);
    assert_eq!(groups("", json!("dev")), ["dev"], "one group as a string");
    assert!(groups("", json!({"dev": true})).is_empty(), "another type");
    assert_eq!(
        groups("", json!(["dev", 7, "", "a\u{7}b", "x".repeat(300), "ops"])),
        ["dev", "ops"],
        "what is not a usable name is ignored"
    );
    let many: Vec<String> = (0..300).map(|i| format!("g{i}")).collect();
    assert_eq!(groups("", json!(many)).len(), MAX_GROUPS);
    assert_eq!(
        groups("groups_claim = \"realm_access.roles\"", json!(["admin"])),
        ["admin"],
        "a dotted path walks into objects"
    );
    // No claim: no groups.
    let cfg = cfg("");
    assert!(verify_one(&cfg, &rs256(&claims()))
        .unwrap()
        .groups
        .is_empty());
}
