//! Ids the gateway issues: a prefix (`exe-`, `apr-`, `req-`, `srct-`) plus 32 lowercase hex
//! digits of 128 CSPRNG bits.

use rand::RngCore;

/// A fresh id with the given prefix.
pub fn new_id(prefix: &str) -> String {
    let mut bytes = [0u8; 16];
    // ThreadRng is a CSPRNG (ChaCha, seeded and periodically reseeded from the OS).
    rand::rng().fill_bytes(&mut bytes);
    let mut hex = [0u8; 32];
    // Cannot fail: the output is exactly twice the input.
    let _ = hex::encode_to_slice(bytes, &mut hex);
    let mut id = String::with_capacity(prefix.len() + hex.len());
    id.push_str(prefix);
    id.push_str(std::str::from_utf8(&hex).unwrap_or_default());
    id
}

/// A fresh `req-` id, built on the stack (one per request, on the relay path).
pub fn request_id() -> [u8; 36] {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    let mut id = [0u8; 36];
    id[..4].copy_from_slice(b"req-");
    // Cannot fail: the output is exactly twice the input.
    let _ = hex::encode_to_slice(bytes, &mut id[4..]);
    id
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_request_id_is_the_prefix_and_32_hex_digits() {
        let id = super::request_id();
        let id = std::str::from_utf8(&id).unwrap();
        assert!(id.starts_with("req-") && id.len() == 36);
        assert!(id[4..]
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_ne!(super::request_id(), super::request_id());
    }
}
