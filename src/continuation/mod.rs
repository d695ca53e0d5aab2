//! Continuations: `srct-` tokens, canonical digests, pending records, tombstones and the claim.
//! This module knows nothing of HTTP or of backend protocols; the parked execution is opaque.

pub mod canonical;
pub mod detect;
pub mod registry;
pub mod token;

pub use registry::{
    Digests, Limits, Lookup, NewBatch, Parked, PendingView, Reason, RegisterError, Registry,
    Settled,
};
