//! Principals: API keys and JWT bearer tokens.
//!
//! A bearer key is never stored or compared as text: it is hashed with SHA-256 and the digest is
//! compared in constant time against every configured client (no early exit), so neither the
//! key nor which client almost matched leaks through timing. The principal is the client id.
//!
//! A bearer value shaped like a JWT (exactly two dots), when issuers are configured, is verified
//! by [`jwt`]; one that fails is still tried as an API key, so every failure ends in the same
//! 401. A verified (`iss`, `sub`) is the client a `[[clients]]` entry names with
//! `jwt = { issuer, subject }` (its id), or else the principal `jwt:<iss>#<sub>` with its
//! issuer's defaults.

pub mod grant;
pub mod jwt;
pub mod oidc;

use subtle::ConstantTimeEq;

use self::grant::{Groups, Role};
use crate::config::{ClientConfig, Config, Credential};
use crate::error::ApiError;

/// The authenticated caller. Cheap to clone; compared by id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Shared with its client entry and with every execution it starts.
    pub id: std::sync::Arc<str>,
    pub approver: bool,
    /// The groups its token named (empty for an API key): what it may do is its entry's and
    /// the configured groups' among these, under the current config.
    pub groups: Groups,
}

impl Principal {
    /// An API key's principal, or any without groups.
    pub fn new(id: impl Into<std::sync::Arc<str>>, approver: bool) -> Principal {
        Principal {
            id: id.into(),
            approver,
            groups: Groups::default(),
        }
    }
}

pub use crate::digest::sha256;

/// Lowercase hex SHA-256 of a key, as `turnstile hash-key` prints and `key_sha256` expects.
pub fn hash_key(key: &str) -> String {
    hex::encode(sha256(key.as_bytes()))
}

/// Extracts the bearer key from an `Authorization` header value.
fn bearer(header: Option<&str>) -> Option<&str> {
    // A header value is visible ASCII: ASCII whitespace is all there is to trim.
    let value = header?.trim_ascii();
    // The scheme, then one space (a search for the space costs more than the whole check).
    let (scheme, key) = value.split_at_checked("bearer".len())?;
    if !scheme.eq_ignore_ascii_case("bearer") || !key.starts_with(' ') {
        return None;
    }
    let key = key.trim_ascii();
    (!key.is_empty()).then_some(key)
}

/// Finds the client whose key digest matches, comparing against all of them in constant time.
pub fn find_client<'a>(cfg: &'a Config, authorization: Option<&str>) -> Option<&'a ClientConfig> {
    let key = bearer(authorization)?;
    let digest = sha256(key.as_bytes());
    let mut found = None;
    for client in &cfg.clients {
        if let Credential::Key(d) = &client.credential {
            if bool::from(d.ct_eq(&digest)) {
                found = Some(client);
            }
        }
    }
    found
}

/// API keys only, or JWTs verified without a cache.
pub fn authenticate(cfg: &Config, authorization: Option<&str>) -> Result<Principal, ApiError> {
    authenticate_cached(cfg, None, authorization, jwt_now())
}

/// Seconds since the epoch, the clock of JWT `exp`/`nbf`.
pub fn jwt_now() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

/// Authentication in front of the engine: the principal behind a credential under a config,
/// with the JWTs it verified remembered by digest (each entry bound to the config generation
/// that verified it).
#[derive(Default)]
pub struct Authenticator {
    jwt: jwt::Cache,
    /// The gateway's own access tokens, when it serves sign-in.
    sso: Option<std::sync::Arc<crate::sso::Sso>>,
}

impl Authenticator {
    pub fn with_sso(sso: std::sync::Arc<crate::sso::Sso>) -> Authenticator {
        Authenticator {
            jwt: jwt::Cache::default(),
            sso: Some(sso),
        }
    }

    /// Without waiting: a gateway access token passes only while its session's state read
    /// within the last seconds admits it ([`Authenticator::authenticate_fetching`] reads it).
    pub fn authenticate(
        &self,
        cfg: &Config,
        authorization: Option<&str>,
    ) -> Result<Principal, ApiError> {
        if let Some((sso, token)) = self.gateway_token(authorization) {
            return (sso.credential_now(cfg, token)).ok_or_else(ApiError::unauthenticated);
        }
        authenticate_cached(cfg, Some(&self.jwt), authorization, jwt_now())
    }

    /// The bearer value, when it is one of the gateway's own access tokens or a console
    /// session's cookie, and what verifies it.
    fn gateway_token<'a>(
        &self,
        authorization: Option<&'a str>,
    ) -> Option<(&crate::sso::Sso, &'a str)> {
        let sso = self.sso.as_deref()?;
        let token = bearer(authorization).filter(|t| crate::sso::is_own(t))?;
        Some((sso, token))
    }

    /// [`Authenticator::authenticate`]; when that fails on a token of an OpenID provider
    /// whose kept keys lack the token's `kid` (the provider rotated its keys), once more after
    /// fetching them (at most once per [`oidc::MIN_REFETCH`] per provider).
    pub async fn authenticate_fetching(
        &self,
        cfg: &Config,
        authorization: Option<&str>,
    ) -> Result<Principal, ApiError> {
        if let Some((sso, token)) = self.gateway_token(authorization) {
            return (sso.credential(cfg, token).await).ok_or_else(ApiError::unauthenticated);
        }
        let first = self.authenticate(cfg, authorization);
        let token = bearer(authorization).filter(|t| jwt::looks_like_jwt(t));
        let (Err(_), Some(token)) = (&first, token) else {
            return first;
        };
        let Some(remote) = jwt::unknown_remote_kid(&cfg.jwt, token) else {
            return first;
        };
        if !remote.refetch(jwt_now()).await {
            return first;
        }
        self.authenticate(cfg, authorization)
    }
}

/// The principal behind an `Authorization` header; `cache` remembers verified JWTs.
pub fn authenticate_cached(
    cfg: &Config,
    cache: Option<&jwt::Cache>,
    authorization: Option<&str>,
    now: u64,
) -> Result<Principal, ApiError> {
    let value = bearer(authorization).ok_or_else(ApiError::unauthenticated)?;
    if !cfg.jwt.is_empty() && jwt::looks_like_jwt(value) {
        let verified = match cache {
            Some(c) => c.verify(&cfg.jwt, value, now),
            None => jwt::verify(&cfg.jwt, value),
        };
        match verified {
            Ok(v) => return Ok(jwt_principal(cfg, &v)),
            // Never logged with the token; the client sees the API-key failure below.
            Err(e) => tracing::debug!(reason = %e, "JWT refused"),
        }
    }
    let client = find_client(cfg, authorization).ok_or_else(ApiError::unauthenticated)?;
    Ok(Principal::new(
        client.id.clone(),
        client.roles.contains(&Role::Approver),
    ))
}

fn jwt_principal(cfg: &Config, v: &jwt::Verified) -> Principal {
    subject_principal(cfg, &v.issuer.issuer, &v.subject, v.groups.clone())
}

/// The principal of `subject` of `issuer`, a member of `groups`: the client entry naming
/// it, or the issuer's subject; an approver when its entry or one of its configured groups
/// says so.
pub fn subject_principal(cfg: &Config, issuer: &str, subject: &str, groups: Groups) -> Principal {
    let id: std::sync::Arc<str> = match cfg.jwt_client(issuer, subject) {
        Some(client) => client.id.clone(),
        None => jwt::principal_id(issuer, subject).into(),
    };
    let approver = cfg.grant(&id, &groups).is_some_and(|g| g.approver());
    Principal {
        id,
        approver,
        groups,
    }
}

/// The (issuer, subject) behind principal `id`: a JWT subject's, or the one its client entry
/// names; None for an API key's.
pub fn subject_of<'c>(cfg: &'c Config, id: &'c str) -> Option<(&'c str, &'c str)> {
    match cfg.client(id).map(|c| &c.credential) {
        Some(Credential::Jwt { issuer, subject }) => Some((issuer, subject)),
        Some(Credential::Key(_)) => None,
        None => jwt::split_principal(id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_bearer_scheme_is_any_case_then_one_space() {
        assert_eq!(bearer(Some("Bearer sk-1")), Some("sk-1"));
        assert_eq!(bearer(Some("  bEARER   sk-1  ")), Some("sk-1"));
        for bad in [
            "Bearer",
            "Bearer ",
            "Bearer\tsk-1",
            "Bearersk-1",
            "Basic sk-1",
            "Bé sk",
            "",
        ] {
            assert_eq!(bearer(Some(bad)), None, "{bad:?}");
        }
        assert_eq!(bearer(None), None);
    }

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
        assert_eq!(&*p.id, "alice");
        assert!(!p.approver);
        let p = authenticate(&cfg, Some("bearer   sk-bob ")).unwrap();
        assert_eq!(&*p.id, "bob");
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

    mod with_jwt {
        use super::super::*;
        use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
        use serde_json::json;
        use std::path::Path;

        const PRIVATE: &str = include_str!("../../fixtures/jwt/issuer-private.pem");
        const PUBLIC: &str = include_str!("../../fixtures/jwt/issuer-public.pem");

        fn cfg() -> Config {
            let text = format!(
                "[[auth.jwt]]\nissuer = \"https://idp.test\"\naudiences = [\"t\"]\n\
                 algorithms = [\"RS256\"]\npem_file = \"idp.pem\"\nroles = [\"approver\"]\n\
                 [[clients]]\nid = \"sam\"\njwt = {{ issuer = \"https://idp.test\", subject = \"sam-1\" }}\n\
                 [[clients]]\nid = \"dotted\"\nkey_sha256 = \"{}\"\n",
                hash_key("sk.with.dots")
            );
            crate::config::from_toml_str_with(&text, Path::new("/k"), &|_| Ok(PUBLIC.into()))
                .unwrap()
        }

        fn token(sub: &str, aud: &str) -> String {
            let claims = json!({"iss": "https://idp.test", "sub": sub, "aud": aud,
                                "exp": jwt_now() + 600});
            let key = EncodingKey::from_rsa_pem(PRIVATE.as_bytes()).unwrap();
            encode(&Header::new(Algorithm::RS256), &claims, &key).unwrap()
        }

        #[test]
        fn verified_subjects_become_principals() {
            let cfg = cfg();
            let cache = jwt::Cache::default();
            let auth = |t: &str| {
                authenticate_cached(&cfg, Some(&cache), Some(&format!("Bearer {t}")), jwt_now())
            };
            // Named by a client entry: that client's id and roles (none here).
            let p = auth(&token("sam-1", "t")).unwrap();
            assert_eq!((&*p.id, p.approver), ("sam", false));
            // Not named: jwt:<iss>#<sub> with the issuer's roles; the same from the cache.
            for _ in 0..2 {
                let p = auth(&token("bob", "t")).unwrap();
                assert_eq!(&*p.id, "jwt:https://idp.test#bob");
                assert!(p.approver);
            }
            // A refused token is exactly the bad-key error.
            assert_eq!(
                auth(&token("bob", "other")).unwrap_err(),
                ApiError::unauthenticated()
            );
            // A JWT-shaped API key still authenticates as a key.
            assert_eq!(&*auth("sk.with.dots").unwrap().id, "dotted");
        }
    }
}
