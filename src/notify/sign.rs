//! Standard Webhooks signatures: `v1,` and the base64 HMAC-SHA256, keyed by the secret's
//! bytes, of `{webhook-id}.{webhook-timestamp}.{body}`. During a rotation both the current
//! and the previous secret sign, space-separated, so a receiver holding either verifies.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// A signing secret: the bytes of a `whsec_<base64>` value.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// `whsec_` and the base64 of at least 24 bytes (the prefix is optional, as the
    /// reference libraries accept it). The error never repeats the value.
    pub fn parse(value: &str) -> Result<Secret, &'static str> {
        let b64 = value.trim().strip_prefix("whsec_").unwrap_or(value.trim());
        let bytes = STANDARD
            .decode(b64)
            .map_err(|_| "is not `whsec_` and base64")?;
        if bytes.len() < 24 {
            return Err("is shorter than 24 bytes");
        }
        Ok(Secret(bytes))
    }

    pub(super) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// The `webhook-signature` header of one attempt.
pub fn signature(secrets: &[Secret], id: &str, timestamp: u64, body: &[u8]) -> String {
    let mut out = String::new();
    for s in secrets {
        // An HMAC takes a key of any length.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&s.0) else {
            continue;
        };
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str("v1,");
        out.push_str(&STANDARD.encode(mac.finalize().into_bytes()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Standard Webhooks reference libraries' own test vector.
    #[test]
    fn signs_as_the_reference_libraries_do() {
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let sig = signature(
            &[secret],
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn two_secrets_sign_twice_and_bad_values_are_refused() {
        let a = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let b = Secret::parse(&format!("whsec_{}", STANDARD.encode([7u8; 32]))).unwrap();
        let sig = signature(&[a, b], "msg_1", 1, b"{}");
        assert_eq!(sig.split(' ').count(), 2);
        assert!(sig.split(' ').all(|s| s.starts_with("v1,")));
        assert!(Secret::parse("whsec_!!").is_err());
        assert!(Secret::parse("whsec_AAAA").is_err());
    }
}
