//! JWT bearer tokens, verified along RFC 8725 against issuers named in the config.
//!
//! What decides, and what never does:
//! - The **configuration** decides the algorithm: a token's header `alg` must be in its issuer's
//!   `algorithms` allow-list, every algorithm of one issuer belongs to the family of that
//!   issuer's key material, and only public-key families are accepted. `alg:none` does not
//!   parse, and an `HS256` token "signed" with an RSA public key's bytes can never verify,
//!   because no HMAC algorithm and no shared secret exist here.
//! - Key material comes only from files read at config load (`pem_file`, `jwks_file`) or,
//!   for an `[[auth.oidc]]` provider, from its own discovery document (`super::oidc`). The
//!   header's `jku`, `x5u`, `jwk` and `x5c` are never followed or used; `kid` is only a lookup
//!   key into the issuer's own JWKS.
//! - The unverified `iss` claim only *selects* the issuer entry; after the signature check the
//!   issuer, audience, `exp` (always required), `nbf` (checked when present), the issuer's
//!   `require`d claims and `sub` are validated.
//!
//! Every failure is one [`JwtError`] that callers turn into the same 401 as a bad API key; the
//! reason is for debug logs only. The principal is the (`iss`, `sub`) pair: see
//! [`principal_id`]. A [`Cache`] remembers verified tokens by the SHA-256 of their text (never
//! the text) until `exp` plus leeway, and only for the issuer entry (the exact config
//! generation) that verified them, so a reload re-verifies everything.
//!
//! This module does no IO and does not import `config` (only its tests do): `config::load`
//! reads the key files, hands their bytes here and builds each [`JwtIssuer`].

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet, PublicKeyUse};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, Validation};
use serde_json::{Map, Value};

use super::grant::{ClientLimits, Groups, Models, Role, MAX_GROUPS, MAX_GROUP_NAME_BYTES};

/// Verified tokens remembered at most (by digest), whatever their lifetimes.
pub const CACHE_CAPACITY: usize = 10_000;

/// Longest accepted `sub`, in bytes: it becomes part of the principal id (logs, store).
pub const MAX_SUBJECT_BYTES: usize = 256;

/// Prefix of the principal id of a JWT subject not named in `[[clients]]`; client ids may
/// not start with it.
pub const PRINCIPAL_PREFIX: &str = "jwt:";

/// The principal id of (`iss`, `sub`): `jwt:<iss>#<sub>`. Configured issuers never contain
/// `#`, so the first `#` splits the pair unambiguously: the same `sub` under another issuer is
/// another principal, and every token of the same pair is the same one.
pub fn principal_id(issuer: &str, subject: &str) -> String {
    format!("{PRINCIPAL_PREFIX}{issuer}#{subject}")
}

/// The (`iss`, `sub`) of a principal id made by [`principal_id`].
pub fn split_principal(id: &str) -> Option<(&str, &str)> {
    id.strip_prefix(PRINCIPAL_PREFIX)?.split_once('#')
}

/// A bearer value with exactly two dots is handled as a JWT; anything else is an API key.
pub fn looks_like_jwt(bearer: &str) -> bool {
    bearer.bytes().filter(|&b| b == b'.').count() == 2
}

/// Why a token was refused. Never shown to the client (all of them are one 401).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    #[error("malformed token")]
    Malformed,
    #[error("no configured issuer matches `iss`")]
    UnknownIssuer,
    #[error("header `alg` is not allowed for this issuer")]
    Algorithm,
    #[error("header `typ` is not the one the issuer requires")]
    Type,
    #[error("no key of the issuer matches the header `kid`")]
    UnknownKey,
    #[error("bad signature")]
    Signature,
    #[error("expired")]
    Expired,
    #[error("not valid yet (`nbf`)")]
    NotYetValid,
    #[error("wrong audience")]
    Audience,
    #[error("wrong issuer")]
    Issuer,
    #[error("missing or null claim `{0}`")]
    MissingClaim(String),
    #[error("`sub` is not a usable subject")]
    Subject,
    #[error("the provider's keys were never fetched or are too old")]
    NoKeys,
}

/// The key material of one issuer, already checked against its algorithm family.
#[derive(Debug, Clone)]
pub enum Keys {
    /// `pem_file`: one public key; the header `kid` is ignored.
    Pem(DecodingKey),
    /// `jwks_file`: signing keys by `kid`; a token must name one of them.
    Jwks(Vec<JwkKey>),
    /// `[[auth.oidc]]`: the provider's keys as last fetched; a token must name one of them.
    Remote(Arc<super::oidc::Remote>),
}

#[derive(Debug, Clone)]
pub struct JwkKey {
    pub kid: String,
    /// The JWK's own `alg`, when it states one: the header `alg` must then equal it.
    pub alg: Option<Algorithm>,
    pub key: DecodingKey,
}

/// One `[[auth.jwt]]` issuer: how its tokens are verified, and what its subjects that no
/// `[[clients]]` entry names may do. Built (and validated) by `config`.
#[derive(Debug)]
pub struct JwtIssuer {
    pub issuer: String,
    pub audiences: Vec<String>,
    /// The allow-list; all of one key family, never `none` or `HS*`.
    pub algorithms: Vec<Algorithm>,
    pub keys: Keys,
    pub leeway_seconds: u64,
    /// Claims that must be present (and not null) besides `exp`, `iss`, `aud` and `sub`.
    pub require: Vec<String>,
    /// When set, the header `typ` must equal it (e.g. `at+jwt`).
    pub typ: Option<String>,
    /// The claim naming the subject's groups (a dotted path walks into objects).
    pub groups_claim: String,
    pub models: Models,
    pub roles: Vec<Role>,
    pub limits: ClientLimits,
}

impl JwtIssuer {
    /// Its provider and how users sign in through it, when the gateway is its client.
    pub fn sign_in(&self) -> Option<(&super::oidc::Remote, &super::oidc::SignIn)> {
        match &self.keys {
            Keys::Remote(r) => Some((r, r.sign_in.as_ref()?)),
            _ => None,
        }
    }
}

/// Parses one configured algorithm name. `none` and the shared-secret `HS*` family are refused:
/// key material here is public, and an HMAC "secret" taken from it would be public too.
pub fn parse_algorithm(name: &str) -> Result<Algorithm, String> {
    if name.eq_ignore_ascii_case("none") {
        return Err("`none` is never accepted".into());
    }
    let alg: Algorithm = name.parse().map_err(|_| {
        format!(
            "unknown algorithm `{name}` (known: RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA)"
        )
    })?;
    if alg.family() == AlgorithmFamily::Hmac {
        return Err(format!(
            "`{name}` needs a shared secret; only public-key algorithms are accepted"
        ));
    }
    Ok(alg)
}

pub fn family_name(f: AlgorithmFamily) -> &'static str {
    match f {
        AlgorithmFamily::Hmac => "HMAC",
        AlgorithmFamily::Rsa => "RSA",
        AlgorithmFamily::Ec => "EC",
        AlgorithmFamily::Ed => "EdDSA",
    }
}

/// A public key PEM for `family`. Private keys are refused: a gateway only verifies.
pub fn pem_keys(pem: &[u8], family: AlgorithmFamily) -> Result<Keys, String> {
    let text = String::from_utf8_lossy(pem);
    if text.contains("PRIVATE KEY") {
        return Err("holds a private key; give the public key (openssl pkey -pubout)".into());
    }
    let key = match family {
        AlgorithmFamily::Rsa => DecodingKey::from_rsa_pem(pem),
        AlgorithmFamily::Ec => DecodingKey::from_ec_pem(pem),
        AlgorithmFamily::Ed => DecodingKey::from_ed_pem(pem),
        AlgorithmFamily::Hmac => return Err("HMAC keys are not accepted".into()),
    }
    .map_err(|e| format!("not a {} public key PEM: {e}", family_name(family)))?;
    Ok(Keys::Pem(key))
}

/// A JWKS document for `family`: every signing key needs a unique `kid`, a key type of that
/// family and, if it states an `alg`, one of `algorithms`. Keys marked `use: enc` are skipped.
pub fn jwks_keys(
    json: &[u8],
    family: AlgorithmFamily,
    algorithms: &[Algorithm],
) -> Result<Keys, String> {
    let set: JwkSet =
        serde_json::from_slice(json).map_err(|e| format!("not a JWKS document: {e}"))?;
    let mut keys: Vec<JwkKey> = Vec::new();
    for (i, jwk) in set.keys.iter().enumerate() {
        if let Some(k) = jwk_key(i, jwk, family, algorithms)? {
            if keys.iter().any(|o| o.kid == k.kid) {
                return Err(format!("duplicate `kid` `{}`", k.kid));
            }
            keys.push(k);
        }
    }
    if keys.is_empty() {
        return Err("no signing key in the JWKS".into());
    }
    Ok(Keys::Jwks(keys))
}

/// A provider's published JWKS: the signing keys usable with `algorithms` (all of one
/// family); keys of another family or algorithm, shared secrets, keys without a `kid` and
/// repeated `kid`s (both copies) are skipped, as a provider publishes keys for other uses too.
pub fn usable_jwks(json: &[u8], algorithms: &[Algorithm]) -> Result<Vec<JwkKey>, String> {
    let family = algorithms.first().ok_or("no algorithm")?.family();
    let set: JwkSet =
        serde_json::from_slice(json).map_err(|e| format!("not a JWKS document: {e}"))?;
    let mut keys: Vec<JwkKey> = Vec::new();
    let mut repeated: Vec<String> = Vec::new();
    for (i, jwk) in set.keys.iter().enumerate() {
        if let Ok(Some(k)) = jwk_key(i, jwk, family, algorithms) {
            if keys.iter().any(|o| o.kid == k.kid) {
                repeated.push(k.kid);
            } else {
                keys.push(k);
            }
        }
    }
    keys.retain(|k| !repeated.contains(&k.kid));
    if keys.is_empty() {
        return Err("no usable signing key".into());
    }
    Ok(keys)
}

/// One JWK as a signing key of `family` (None: an encryption key).
fn jwk_key(
    i: usize,
    jwk: &jsonwebtoken::jwk::Jwk,
    family: AlgorithmFamily,
    algorithms: &[Algorithm],
) -> Result<Option<JwkKey>, String> {
    if jwk.common.public_key_use == Some(PublicKeyUse::Encryption) {
        return Ok(None);
    }
    let kid = jwk
        .common
        .key_id
        .clone()
        .filter(|k| !k.is_empty())
        .ok_or_else(|| format!("keys[{i}] has no `kid`"))?;
    let key_family = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => AlgorithmFamily::Rsa,
        AlgorithmParameters::EllipticCurve(_) => AlgorithmFamily::Ec,
        AlgorithmParameters::OctetKeyPair(_) => AlgorithmFamily::Ed,
        AlgorithmParameters::OctetKey(_) => {
            return Err(format!(
                "key `{kid}` is a shared secret (kty oct); only public keys are accepted"
            ))
        }
        _ => return Err(format!("key `{kid}` has an unsupported key type")),
    };
    if key_family != family {
        return Err(format!(
            "key `{kid}` is {} but the algorithms are {}",
            family_name(key_family),
            family_name(family)
        ));
    }
    let alg = match jwk.common.key_algorithm {
        None => None,
        Some(a) => {
            let alg: Algorithm = a
                .to_string()
                .parse()
                .map_err(|_| format!("key `{kid}` states an unsupported `alg` {a}"))?;
            if !algorithms.contains(&alg) {
                return Err(format!(
                    "key `{kid}` is for {alg:?}, which is not in `algorithms`"
                ));
            }
            Some(alg)
        }
    };
    let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("key `{kid}`: {e}"))?;
    Ok(Some(JwkKey { kid, alg, key }))
}

/// What a verified token proves.
#[derive(Debug, Clone)]
pub struct Verified {
    /// The issuer entry (of the config generation) that verified it.
    pub issuer: Arc<JwtIssuer>,
    pub subject: String,
    /// `exp`, seconds since the epoch.
    pub expires: u64,
    /// What its issuer's `groups_claim` names.
    pub groups: Groups,
    /// Its `nonce` (an ID token's), when verified without the cache.
    pub nonce: Option<String>,
}

/// Verifies `token` against the configured issuers, without any cache.
pub fn verify(issuers: &[Arc<JwtIssuer>], token: &str) -> Result<Verified, JwtError> {
    let header = jsonwebtoken::decode_header(token).map_err(|_| JwtError::Malformed)?;
    // The unverified `iss` only picks the entry whose keys and rules apply; validation below
    // checks it again once the signature holds.
    let peek: Map<String, Value> =
        jsonwebtoken::dangerous::insecure_decode_claims(token).map_err(|_| JwtError::Malformed)?;
    let iss = peek
        .get("iss")
        .and_then(Value::as_str)
        .ok_or(JwtError::UnknownIssuer)?;
    let issuer = issuers
        .iter()
        .find(|i| i.issuer == iss)
        .ok_or(JwtError::UnknownIssuer)?;
    if !issuer.algorithms.contains(&header.alg) {
        return Err(JwtError::Algorithm);
    }
    if let Some(want) = &issuer.typ {
        let got = header.typ.as_deref().unwrap_or_default();
        let got = got.strip_prefix("application/").unwrap_or(got);
        if !got.eq_ignore_ascii_case(want) {
            return Err(JwtError::Type);
        }
    }
    let fetched;
    let key = match &issuer.keys {
        Keys::Pem(key) => key,
        Keys::Jwks(keys) => by_kid(keys, &header)?,
        Keys::Remote(remote) => {
            fetched = remote
                .current(jsonwebtoken::get_current_timestamp())
                .ok_or(JwtError::NoKeys)?;
            by_kid(&fetched.keys, &header)?
        }
    };

    let mut v = Validation::new(header.alg);
    v.algorithms = issuer.algorithms.clone();
    v.leeway = issuer.leeway_seconds;
    v.validate_exp = true;
    v.validate_nbf = true;
    v.validate_aud = true;
    v.set_issuer(&[&issuer.issuer]);
    v.set_audience(&issuer.audiences);
    v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
    let data = jsonwebtoken::decode::<Map<String, Value>>(token, key, &v).map_err(|e| {
        use jsonwebtoken::errors::ErrorKind as K;
        match e.into_kind() {
            K::InvalidSignature => JwtError::Signature,
            K::ExpiredSignature => JwtError::Expired,
            K::ImmatureSignature => JwtError::NotYetValid,
            K::InvalidAudience => JwtError::Audience,
            K::InvalidIssuer => JwtError::Issuer,
            K::MissingRequiredClaim(c) | K::InvalidClaimFormat(c) => JwtError::MissingClaim(c),
            K::InvalidAlgorithm | K::MissingAlgorithm => JwtError::Algorithm,
            _ => JwtError::Malformed,
        }
    })?;
    let claims = data.claims;
    for name in &issuer.require {
        if claims.get(name).is_none_or(Value::is_null) {
            return Err(JwtError::MissingClaim(name.clone()));
        }
    }
    let subject = claims
        .get("sub")
        .and_then(Value::as_str)
        .filter(|s| {
            !s.is_empty() && s.len() <= MAX_SUBJECT_BYTES && !s.chars().any(char::is_control)
        })
        .ok_or(JwtError::Subject)?
        .to_string();
    let expires = match claims.get("exp") {
        Some(Value::Number(n)) => n
            .as_u64()
            .or_else(|| n.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64)),
        _ => None,
    }
    .ok_or_else(|| JwtError::MissingClaim("exp".into()))?;
    let groups = groups_in(&claims, &issuer.groups_claim);
    let nonce = claims
        .get("nonce")
        .and_then(Value::as_str)
        .map(str::to_string);
    Ok(Verified {
        issuer: issuer.clone(),
        subject,
        expires,
        groups,
        nonce,
    })
}

/// The groups a token's claim `path` names: an array of strings, or one string. Names that
/// are empty, too long or hold control characters are ignored, and at most [`MAX_GROUPS`]
/// kept; anything else (absent, another type) is no group.
fn groups_in(claims: &Map<String, Value>, path: &str) -> Groups {
    let mut parts = path.split('.');
    let first = parts.next().and_then(|p| claims.get(p));
    let value = parts.fold(first, |v, p| v.and_then(|v| v.get(p)));
    let ok = |s: &&str| {
        !s.is_empty() && s.len() <= MAX_GROUP_NAME_BYTES && !s.chars().any(char::is_control)
    };
    match value {
        Some(Value::Array(a)) => (a.iter())
            .filter_map(Value::as_str)
            .filter(ok)
            .take(MAX_GROUPS)
            .map(str::to_string)
            .collect(),
        Some(Value::String(s)) if ok(&s.as_str()) => Groups::from([s.clone()]),
        _ => Groups::default(),
    }
}

/// The key a header's `kid` names; its `alg`, when the key states one, must match.
fn by_kid<'k>(
    keys: &'k [JwkKey],
    header: &jsonwebtoken::Header,
) -> Result<&'k DecodingKey, JwtError> {
    let kid = header.kid.as_deref().ok_or(JwtError::UnknownKey)?;
    let k = keys
        .iter()
        .find(|k| k.kid == kid)
        .ok_or(JwtError::UnknownKey)?;
    if k.alg.is_some_and(|a| a != header.alg) {
        return Err(JwtError::Algorithm);
    }
    Ok(&k.key)
}

/// The provider whose kept keys lack the `kid` of `token` (a token of a configured
/// `[[auth.oidc]]` issuer): fetching its keys again may let the token verify.
pub fn unknown_remote_kid(
    issuers: &[Arc<JwtIssuer>],
    token: &str,
) -> Option<Arc<super::oidc::Remote>> {
    let header = jsonwebtoken::decode_header(token).ok()?;
    let kid = header.kid?;
    let peek: Map<String, Value> = jsonwebtoken::dangerous::insecure_decode_claims(token).ok()?;
    let iss = peek.get("iss")?.as_str()?;
    let issuer = issuers.iter().find(|i| i.issuer == iss)?;
    let Keys::Remote(remote) = &issuer.keys else {
        return None;
    };
    let now = jsonwebtoken::get_current_timestamp();
    let known = remote
        .current(now)
        .is_some_and(|s| s.keys.iter().any(|k| k.kid == kid));
    (!known).then(|| remote.clone())
}

struct Entry {
    /// Compared by address with the current config's entries: a reload makes new ones, so
    /// entries of an older generation never match (the `Weak` keeps the address from reuse).
    issuer: Weak<JwtIssuer>,
    subject: String,
    groups: Groups,
    /// `exp` plus the issuer's leeway: what a fresh verification would still accept.
    valid_until: u64,
}

/// Verified tokens by the SHA-256 of their text, bounded to [`CACHE_CAPACITY`] entries.
pub struct Cache {
    entries: Mutex<HashMap<[u8; 32], Entry>>,
    capacity: usize,
}

impl Default for Cache {
    fn default() -> Self {
        Cache::with_capacity(CACHE_CAPACITY)
    }
}

impl Cache {
    pub fn with_capacity(capacity: usize) -> Cache {
        Cache {
            entries: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// [`verify`], answered from the cache when this exact token was verified before by an
    /// issuer entry of `issuers` and is still within `exp` + leeway at `now` (Unix seconds).
    pub fn verify(
        &self,
        issuers: &[Arc<JwtIssuer>],
        token: &str,
        now: u64,
    ) -> Result<Verified, JwtError> {
        let digest = super::sha256(token.as_bytes());
        {
            let mut map = self.entries.lock();
            if let Some(e) = map.get(&digest) {
                let current = issuers
                    .iter()
                    .find(|i| std::ptr::eq(Arc::as_ptr(i), e.issuer.as_ptr()));
                // A provider's token is only as good as its keys: none kept fresh, none passes.
                let keys_fresh = |i: &JwtIssuer| match &i.keys {
                    Keys::Remote(r) => r.current(now).is_some(),
                    _ => true,
                };
                match current {
                    Some(issuer) if now <= e.valid_until && keys_fresh(issuer) => {
                        return Ok(Verified {
                            issuer: issuer.clone(),
                            subject: e.subject.clone(),
                            expires: e.valid_until.saturating_sub(issuer.leeway_seconds),
                            groups: e.groups.clone(),
                            nonce: None,
                        });
                    }
                    _ => {
                        map.remove(&digest);
                    }
                }
            }
        }
        let verified = verify(issuers, token)?;
        let valid_until = verified
            .expires
            .saturating_add(verified.issuer.leeway_seconds);
        let mut map = self.entries.lock();
        if map.len() >= self.capacity {
            map.retain(|_, e| e.valid_until >= now && e.issuer.strong_count() > 0);
        }
        if map.len() >= self.capacity {
            // Still full of live entries: drop one; the cache only saves work.
            if let Some(k) = map.keys().next().copied() {
                map.remove(&k);
            }
        }
        map.insert(
            digest,
            Entry {
                issuer: Arc::downgrade(&verified.issuer),
                subject: verified.subject.clone(),
                groups: verified.groups.clone(),
                valid_until,
            },
        );
        Ok(verified)
    }
}

#[cfg(test)]
mod tests;
