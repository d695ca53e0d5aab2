//! Ids the gateway issues: continuation tokens (`srct-`), execution ids (`exe-`) and approval
//! ids (`apr-`), each the prefix plus 32 lowercase hex digits of 128 CSPRNG bits.

use rand::RngCore;

use crate::auth::sha256;

pub const TOKEN_PREFIX: &str = "srct-";

fn random_hex() -> String {
    let mut bytes = [0u8; 16];
    // ThreadRng is a CSPRNG (ChaCha, seeded and periodically reseeded from the OS).
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// A fresh id with the given prefix (`exe-`, `apr-`).
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}{}", random_hex())
}

/// A fresh continuation token and its SHA-256 digest (the only form that is stored).
pub fn new_token() -> (String, [u8; 32]) {
    let token = new_id(TOKEN_PREFIX);
    let digest = sha256(token.as_bytes());
    (token, digest)
}

/// True when `s` is exactly `srct-` followed by 32 lowercase hex digits.
pub fn is_token_shape(s: &str) -> bool {
    s.strip_prefix(TOKEN_PREFIX).is_some_and(|hex| {
        hex.len() == 32
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// The digest of a well-formed token, or None for any other shape.
pub fn token_digest(s: &str) -> Option<[u8; 32]> {
    is_token_shape(s).then(|| sha256(s.as_bytes()))
}

/// A short, non-reversible reference to a token digest for logs.
pub fn short(digest: &[u8; 32]) -> String {
    hex::encode(&digest[..4])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn tokens_have_the_shape_and_are_unique() {
        let mut seen = HashSet::new();
        for _ in 0..10_000 {
            let (t, d) = new_token();
            assert!(is_token_shape(&t), "{t}");
            assert_eq!(token_digest(&t), Some(d));
            assert!(seen.insert(t));
        }
        assert!(new_id("exe-").starts_with("exe-") && new_id("exe-").len() == 36);
    }

    #[test]
    fn malformed_tokens_are_rejected() {
        let good = "srct-0123456789abcdef0123456789abcdef";
        assert!(is_token_shape(good));
        for bad in [
            "srct-0123456789abcdef0123456789abcde",   // short
            "srct-0123456789abcdef0123456789abcdef0", // long
            "srct-0123456789ABCDEF0123456789abcdef",  // uppercase
            "srct-0123456789abcdeg0123456789abcdef",  // non-hex
            " srct-0123456789abcdef0123456789abcdef", // padded
            "srct-0123456789abcdef0123456789abcdef ", // padded
            "SRCT-0123456789abcdef0123456789abcdef",  // prefix case
            "call_0123456789abcdef0123456789abcdef",  // foreign prefix
            "apr-0123456789abcdef0123456789abcdef",   // approval id
            "srct-0123456789abcdef0123456789abcdеf",  // homoglyph (Cyrillic e)
            "",
        ] {
            assert!(!is_token_shape(bad), "{bad}");
            assert_eq!(token_digest(bad), None);
        }
    }
}
