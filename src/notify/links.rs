//! Single-use decision links: the Approve and Deny buttons of a pending approval's Slack
//! message. A link's token is `sdl-` and 32 hex digits, bound to one approval, one decision
//! and the approval's expiry, and stored only as its SHA-256 digest.
//!
//! The outbox keeps the message body, so the body cannot hold a token: it holds a
//! placeholder (`sdl-link-` and a random nonce) that is replaced when the message is sent by
//! the token derived from the endpoint's signing secret and the nonce (HMAC-SHA256). Every
//! attempt, on any replica and after a restart, sends the same token; the store never has it.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::body::Buttons;
use super::sign::Secret;
use super::Notifier;
use crate::digest::sha256;
use crate::ids::new_id;
use crate::store::{ApprovalRecord, LinkRow};

/// A link token's prefix.
pub const PREFIX: &str = "sdl-";
/// A placeholder's prefix (a nonce follows).
const PLACEHOLDER: &str = "sdl-link-";
/// Where a link points, below the gateway's URL (the token follows).
pub const ROUTE: &str = "/v1/decisions/";

/// The token a placeholder's nonce stands for, under `secret`.
fn token(secret: &Secret, nonce: &str) -> String {
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret.bytes()) {
        Ok(m) => m,
        Err(_) => return String::new(),
    };
    mac.update(b"turnstile decision link\0");
    mac.update(nonce.as_bytes());
    let full = hex::encode(mac.finalize().into_bytes());
    format!("{PREFIX}{}", &full[..32])
}

/// The digest of a well-formed token (None for any other shape).
pub fn digest(token: &str) -> Option<[u8; 32]> {
    let hex = token.strip_prefix(PREFIX)?;
    let ok = hex.len() == 32 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    ok.then(|| sha256(token.as_bytes()))
}

/// `body` with every placeholder replaced by its token (under the endpoint's current secret).
pub(super) fn expand(body: &str, secrets: &[Secret]) -> String {
    let Some(secret) = secrets.first() else {
        return body.to_string();
    };
    let mut out = String::with_capacity(body.len());
    let mut rest = body;
    while let Some(at) = rest.find(PLACEHOLDER) {
        let nonce_at = at + PLACEHOLDER.len();
        let nonce = rest.get(nonce_at..nonce_at + 32).unwrap_or_default();
        out.push_str(&rest[..at]);
        if nonce.len() == 32 {
            out.push_str(&token(secret, nonce));
            rest = &rest[nonce_at + 32..];
        } else {
            out.push_str(PLACEHOLDER);
            rest = &rest[nonce_at..];
        }
    }
    out.push_str(rest);
    out
}

impl Notifier {
    /// Where links point, once the gateway knows (`server.public_url` wins over the bound
    /// address; a second call changes nothing).
    pub fn links_at(&self, base: &str) {
        let _ = self.base_url.set(base.trim_end_matches('/').to_string());
    }

    /// The Approve and Deny links of approval `r` in endpoint `endpoint`'s message: their
    /// rows (digests) and the buttons (placeholders). None before the gateway listens.
    pub(super) fn links(
        &self,
        endpoint: &str,
        r: &ApprovalRecord,
    ) -> (Vec<LinkRow>, Option<Buttons>) {
        let (Some(base), Some(e)) = (self.base_url.get(), self.endpoint(endpoint)) else {
            return (Vec::new(), None);
        };
        let Some(secret) = e.secrets.first() else {
            return (Vec::new(), None);
        };
        let mut rows = Vec::with_capacity(2);
        let mut urls = Vec::with_capacity(2);
        for decision in ["approve", "deny"] {
            let nonce = new_id("");
            rows.push(LinkRow {
                digest: sha256(token(secret, &nonce).as_bytes()),
                approval_id: r.id.clone(),
                decision,
                endpoint: endpoint.to_string(),
                expires_at: r.expires_at,
                used_at: None,
            });
            urls.push(format!("{base}{ROUTE}{PLACEHOLDER}{nonce}"));
        }
        let deny = urls.pop().unwrap_or_default();
        let approve = urls.pop().unwrap_or_default();
        (rows, Some(Buttons { approve, deny }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_placeholder_becomes_the_same_token_at_every_attempt_and_only_its_digest_is_kept() {
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let nonce = "0123456789abcdef0123456789abcdef";
        let body = format!("{{\"url\":\"http://gw{ROUTE}{PLACEHOLDER}{nonce}\"}}");
        let once = expand(&body, std::slice::from_ref(&secret));
        assert_eq!(once, expand(&body, std::slice::from_ref(&secret)));
        assert!(!once.contains(PLACEHOLDER));
        let token = token(&secret, nonce);
        assert!(once.contains(&token));
        assert_eq!(digest(&token), Some(sha256(token.as_bytes())));
        assert_eq!(digest("sdl-XYZ"), None);
        assert_eq!(digest(&format!("{token}0")), None);
        // A cut placeholder is left as it is.
        assert_eq!(expand("a sdl-link-12", &[secret]), "a sdl-link-12");
    }
}
