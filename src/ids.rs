//! Ids the gateway issues: a prefix (`exe-`, `apr-`, `req-`, `srct-`) plus 32 lowercase hex
//! digits of 128 CSPRNG bits.

use rand::RngCore;

fn random_hex() -> String {
    let mut bytes = [0u8; 16];
    // ThreadRng is a CSPRNG (ChaCha, seeded and periodically reseeded from the OS).
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// A fresh id with the given prefix.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}{}", random_hex())
}
