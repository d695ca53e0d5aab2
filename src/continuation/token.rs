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

/// What the ids of a trailing tool run (the last assistant message's calls and the results
/// after it) are.
#[derive(Debug, PartialEq, Eq)]
pub enum Run {
    /// Every id is a well-formed token: a continuation (call digests, result digests).
    Tokens(Vec<[u8; 32]>, Vec<[u8; 32]>),
    /// No id has the `srct-` prefix: the client's own tool loop (ordinary history for a
    /// stateless upstream).
    ClientOwned,
}

/// Why a trailing tool run is refused before any lookup.
#[derive(Debug, PartialEq, Eq)]
pub enum RunError {
    /// An id has the `srct-` prefix but not the token shape (400 `invalid_request`).
    Malformed,
    /// Tokens and the client's own ids in one run (400 `continuation_mismatch`).
    Mixed,
}

/// Classifies the ids of a trailing tool run.
pub fn classify<'a>(
    calls: impl IntoIterator<Item = &'a str>,
    results: impl IntoIterator<Item = &'a str>,
) -> Result<Run, RunError> {
    let digest = |ids: &mut dyn Iterator<Item = &'a str>, foreign: &mut usize, all: &mut usize| {
        let mut out = Vec::new();
        for id in ids {
            *all += 1;
            if !id.starts_with(TOKEN_PREFIX) {
                *foreign += 1;
                continue;
            }
            out.push(token_digest(id).ok_or(RunError::Malformed)?);
        }
        Ok(out)
    };
    let (mut foreign, mut all) = (0, 0);
    let calls = digest(&mut calls.into_iter(), &mut foreign, &mut all)?;
    let results = digest(&mut results.into_iter(), &mut foreign, &mut all)?;
    match foreign {
        0 => Ok(Run::Tokens(calls, results)),
        n if n == all => Ok(Run::ClientOwned),
        _ => Err(RunError::Mixed),
    }
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
    fn runs_are_tokens_client_owned_malformed_or_mixed() {
        let t = "srct-0123456789abcdef0123456789abcdef";
        assert_eq!(
            classify([t], [t]),
            Ok(Run::Tokens(
                vec![sha256(t.as_bytes())],
                vec![sha256(t.as_bytes())]
            ))
        );
        assert_eq!(classify(["call_1", ""], ["call_1"]), Ok(Run::ClientOwned));
        assert_eq!(classify([t, "call_1"], [t]), Err(RunError::Mixed));
        assert_eq!(classify([t], ["call_1"]), Err(RunError::Mixed));
        assert_eq!(classify(["call_1"], ["srct-1"]), Err(RunError::Malformed));
        assert_eq!(classify(["srct-"], ["x"]), Err(RunError::Malformed));
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
