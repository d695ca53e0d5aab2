//! The `messages` target: see `turnstile::fuzzing` for its invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| turnstile::fuzzing::run("messages", data));
