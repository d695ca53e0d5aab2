//! SHA-256, the one digest the gateway uses (tokens, keys, canonical projections, actions).

use sha2::{Digest, Sha256};

pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// A short, non-reversible reference to a digest for logs (8 hex digits).
pub fn log_ref(digest: &[u8; 32]) -> String {
    hex::encode(&digest[..4])
}
