//! Principals and API-key authentication.
//!
//! A bearer key is never stored or compared as text: it is hashed with SHA-256 and the digest is
//! compared in constant time against every configured client (no early exit), so neither the
//! key nor which client almost matched leaks through timing. The principal is the client id.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{ClientConfig, Config};
use crate::error::ApiError;

/// The authenticated caller. Cheap to clone; compared by id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub id: String,
    pub approver: bool,
}

pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Lowercase hex SHA-256 of a key, as `turnstile hash-key` prints and `key_sha256` expects.
pub fn hash_key(key: &str) -> String {
    hex::encode(sha256(key.as_bytes()))
}

/// Extracts the bearer key from an `Authorization` header value.
fn bearer(header: Option<&str>) -> Option<&str> {
    let value = header?.trim();
    let (scheme, key) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let key = key.trim();
    (!key.is_empty()).then_some(key)
}

/// Finds the client whose key digest matches, comparing against all of them in constant time.
pub fn find_client<'a>(cfg: &'a Config, authorization: Option<&str>) -> Option<&'a ClientConfig> {
    let key = bearer(authorization)?;
    let digest = sha256(key.as_bytes());
    let mut found = None;
    for client in &cfg.clients {
        if bool::from(client.key_digest.ct_eq(&digest)) {
            found = Some(client);
        }
    }
    found
}

pub fn authenticate(cfg: &Config, authorization: Option<&str>) -> Result<Principal, ApiError> {
    let client = find_client(cfg, authorization).ok_or_else(ApiError::unauthenticated)?;
    Ok(Principal {
        id: client.id.clone(),
        approver: client.roles.iter().any(|r| r == "approver"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn cfg() -> Config {
        let text = format!(
            "[[clients]]\nid = \"alice\"\nkey_sha256 = \"{}\"\nmodels = [\"demo-*\"]\n\
             [[clients]]\nid = \"bob\"\nkey_sha256 = \"{}\"\nroles = [\"approver\"]\n",
            hash_key("sk-alice"),
            hash_key("sk-bob")
        );
        crate::config::from_toml_str(&text, Path::new(".")).unwrap()
    }

    #[test]
    fn hash_key_is_sha256_hex() {
        assert_eq!(
            hash_key("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn keys_match_by_digest() {
        let cfg = cfg();
        let p = authenticate(&cfg, Some("Bearer sk-alice")).unwrap();
        assert_eq!(p.id, "alice");
        assert!(!p.approver);
        let p = authenticate(&cfg, Some("bearer   sk-bob ")).unwrap();
        assert_eq!(p.id, "bob");
        assert!(p.approver);
    }

    #[test]
    fn bad_credentials_are_one_error() {
        let cfg = cfg();
        for h in [
            None,
            Some(""),
            Some("Bearer"),
            Some("Basic sk-alice"),
            Some("Bearer sk-nope"),
        ] {
            let e = authenticate(&cfg, h).unwrap_err();
            assert_eq!(e, ApiError::unauthenticated());
        }
    }

    #[test]
    fn model_globs() {
        let cfg = cfg();
        let alice = cfg.client("alice").unwrap();
        assert!(alice.may_use("demo-echo"));
        assert!(!alice.may_use("demo"));
        assert!(!alice.may_use("codex"));
        assert!(cfg.client("bob").unwrap().may_use("anything"));
    }
}
