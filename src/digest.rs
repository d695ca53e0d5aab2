//! SHA-256, the one digest the gateway uses (tokens, keys, canonical projections, actions).
//!
//! Two implementations, chosen by the CPU once: where it has SHA extensions, the `sha2`
//! crate's code for them (the fastest here: 72 ns for a 64-byte input against ring's 134 ns,
//! equal from 100 KB); where it has none, ring's SIMD code (BoringSSL's, 2.1k instructions a
//! block against 3.4k for `sha2`'s portable fallback). Both give the same digests; the unit
//! tests check each.

use ring::digest::{Context, SHA256};
use sha2::Digest as _;

/// Whether the CPU has SHA-256 instructions (std caches the answer).
fn hardware() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("sha")
        && std::arch::is_x86_feature_detected!("sse4.1");
    #[cfg(target_arch = "aarch64")]
    return std::arch::is_aarch64_feature_detected!("sha2");
    #[allow(unreachable_code)]
    false
}

pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    match hardware() {
        true => sha2::Sha256::digest(bytes).into(),
        false => bytes32(ring::digest::digest(&SHA256, bytes)),
    }
}

/// A SHA-256 fed in pieces, by the implementation [`sha256`] would use.
#[derive(Clone)]
pub enum Sha256 {
    Sha2(sha2::Sha256),
    Ring(Context),
}

impl Sha256 {
    pub fn new() -> Sha256 {
        match hardware() {
            true => Sha256::Sha2(sha2::Sha256::new()),
            false => Sha256::Ring(Context::new(&SHA256)),
        }
    }

    pub fn update(&mut self, bytes: &[u8]) {
        match self {
            Sha256::Sha2(h) => h.update(bytes),
            Sha256::Ring(c) => c.update(bytes),
        }
    }

    pub fn finish(self) -> [u8; 32] {
        match self {
            Sha256::Sha2(h) => h.finalize().into(),
            Sha256::Ring(c) => bytes32(c.finish()),
        }
    }
}

impl Default for Sha256 {
    fn default() -> Self {
        Sha256::new()
    }
}

fn bytes32(d: ring::digest::Digest) -> [u8; 32] {
    let mut out = [0; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// A short, non-reversible reference to a digest for logs (8 hex digits).
pub fn log_ref(digest: &[u8; 32]) -> String {
    hex::encode(&digest[..4])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_implementations_give_the_known_digests_whole_and_in_pieces() {
        // FIPS 180-2's examples, and a text over a block long.
        let long = vec![b'x'; 1000];
        let known = [
            (
                &b"abc"[..],
                "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
            ),
            (
                b"",
                "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            ),
            (
                &long,
                "44f8354494a5ba03ba1792a8d3e9c534c47a9181980fde7a3f44b06ef2ae7c7f",
            ),
        ];
        for (input, digest) in known {
            let mut both = [
                Sha256::Sha2(sha2::Sha256::new()),
                Sha256::Ring(Context::new(&SHA256)),
            ];
            for h in &mut both {
                for piece in input.chunks(7) {
                    h.update(piece);
                }
            }
            let [a, b] = both.map(|h| hex::encode(h.finish()));
            assert_eq!((a.as_str(), b.as_str()), (digest, digest));
            assert_eq!(hex::encode(sha256(input)), digest);
        }
    }
}
