//! Continuation tokens: `srct-` plus 32 lowercase hex digits of 128 CSPRNG bits, known to the
//! gateway only by their SHA-256.

use crate::digest::sha256;
use crate::ids::new_id;

pub const TOKEN_PREFIX: &str = "srct-";

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
