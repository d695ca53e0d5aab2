//! The gateway's own access tokens: JWTs signed with the store's key (HS256: only the gateway
//! signs and verifies them, and every replica reads the same key), bound to a sign-in
//! session, its generation, the provider's subject and the groups the provider named.
//!
//! A token verifies while its signature, `exp`, `iss` and `aud` hold and its session is live
//! at the same generation. Session states are read from the store and kept for
//! [`STATUS_TTL`], so a revocation or a change of groups reaches every replica within it.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::store::SessionRow;

/// `iss` and `aud` of a gateway token, and its header's `kid`.
pub const GATEWAY_ISSUER: &str = "turnstile";
/// How long a session's state read from the store is trusted.
pub const STATUS_TTL: Duration = Duration::from_secs(5);
/// Session states kept at most.
const MAX_CACHED: usize = 10_000;

/// What a gateway token says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub iss: String,
    pub aud: String,
    /// The provider's subject.
    pub sub: String,
    /// The provider's issuer.
    pub idp: String,
    pub groups: Vec<String>,
    /// The sign-in session.
    pub sid: String,
    /// The session's generation when issued.
    pub gen: i64,
    pub iat: u64,
    pub exp: u64,
}

/// A session's state as the store last said: its generation and until when it is live
/// (0 once revoked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub generation: i64,
    pub live_until: u64,
}

impl Status {
    /// A session revoked, or not in the store.
    pub const GONE: Status = Status {
        generation: -1,
        live_until: 0,
    };

    pub fn of(s: &SessionRow) -> Status {
        Status {
            generation: s.generation,
            live_until: if s.revoked_at.is_some() {
                0
            } else {
                s.expires_at
            },
        }
    }

    pub fn admits(&self, c: &Claims, now: u64) -> bool {
        self.generation == c.gen && now < self.live_until
    }
}

pub struct Signer {
    encoding: EncodingKey,
    decoding: DecodingKey,
    statuses: Mutex<HashMap<String, (Status, Instant)>>,
}

impl Signer {
    /// None for an empty secret.
    pub fn new(secret: &[u8]) -> Option<Signer> {
        Some(Signer {
            encoding: EncodingKey::from_secret(secret).ok()?,
            decoding: DecodingKey::from_secret(secret).ok()?,
            statuses: Mutex::new(HashMap::new()),
        })
    }

    pub fn sign(&self, c: &Claims) -> String {
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some(GATEWAY_ISSUER.into());
        // Cannot fail: HMAC over claims that always serialize.
        jsonwebtoken::encode(&header, c, &self.encoding).unwrap_or_default()
    }

    /// The claims of a token this gateway signed, still within `exp` (no leeway).
    pub fn verify(&self, token: &str) -> Option<Claims> {
        let mut v = Validation::new(Algorithm::HS256);
        v.leeway = 0;
        v.set_issuer(&[GATEWAY_ISSUER]);
        v.set_audience(&[GATEWAY_ISSUER]);
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        jsonwebtoken::decode::<Claims>(token, &self.decoding, &v)
            .ok()
            .map(|d| d.claims)
    }

    /// The session state read within [`STATUS_TTL`], if any.
    pub fn cached(&self, sid: &str) -> Option<Status> {
        let map = self.statuses.lock();
        let (s, at) = map.get(sid)?;
        (at.elapsed() < STATUS_TTL).then_some(*s)
    }

    pub fn remember(&self, sid: &str, s: Status) {
        let mut map = self.statuses.lock();
        if map.len() >= MAX_CACHED {
            map.retain(|_, (_, at)| at.elapsed() < STATUS_TTL);
            if map.len() >= MAX_CACHED {
                map.clear();
            }
        }
        map.insert(sid.to_string(), (s, Instant::now()));
    }
}

/// Whether a bearer value is shaped like a gateway token (its header names this gateway):
/// cheap, and says nothing about its validity.
pub fn is_gateway_token(token: &str) -> bool {
    jsonwebtoken::decode_header(token)
        .is_ok_and(|h| h.alg == Algorithm::HS256 && h.kid.as_deref() == Some(GATEWAY_ISSUER))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(exp: u64) -> Claims {
        Claims {
            iss: GATEWAY_ISSUER.into(),
            aud: GATEWAY_ISSUER.into(),
            sub: "alice".into(),
            idp: "https://idp.test".into(),
            groups: vec!["dev".into()],
            sid: "ses-1".into(),
            gen: 2,
            iat: 0,
            exp,
        }
    }

    #[test]
    fn a_token_verifies_only_under_its_key_and_within_exp() {
        let now = jsonwebtoken::get_current_timestamp();
        let signer = Signer::new(&[7; 32]).unwrap();
        let token = signer.sign(&claims(now + 60));
        assert!(is_gateway_token(&token));
        assert_eq!(signer.verify(&token), Some(claims(now + 60)));
        assert_eq!(
            Signer::new(&[8; 32]).unwrap().verify(&token),
            None,
            "another key"
        );
        assert_eq!(
            signer.verify(&signer.sign(&claims(now - 1))),
            None,
            "expired"
        );
        let mut other = claims(now + 60);
        other.aud = "someone".into();
        assert_eq!(
            signer.verify(&signer.sign(&other)),
            None,
            "another audience"
        );
        // A token signed with the key as an RS256 "public key" trick is not one of ours.
        assert!(!is_gateway_token("a.b.c"));
    }

    #[tokio::test(start_paused = true)]
    async fn session_states_are_trusted_for_a_few_seconds() {
        let signer = Signer::new(&[7; 32]).unwrap();
        let live = Status {
            generation: 2,
            live_until: u64::MAX,
        };
        assert!(live.admits(&claims(0), 10));
        let raised = Status {
            generation: 3,
            ..live
        };
        assert!(!raised.admits(&claims(0), 10), "an older generation");
        let revoked = Status {
            live_until: 0,
            ..live
        };
        assert!(!revoked.admits(&claims(0), 10));
        signer.remember("ses-1", live);
        assert_eq!(signer.cached("ses-1"), Some(live));
        tokio::time::advance(STATUS_TTL).await;
        assert_eq!(signer.cached("ses-1"), None);
    }
}
