//! Continuations: `srct-` tokens, canonical JSON for the digests, the pending records and
//! tombstones in memory, and the claim. This module knows nothing of HTTP, of wire formats or
//! of backend protocols, and writes nothing durable: the parked execution is opaque.

pub mod canonical;
pub mod digests;
pub mod registry;
pub mod token;

pub use digests::Digests;
pub use registry::{
    principal_eq, Batch, Head, Limits, Lookup, Parked, PendingView, Reason, Registry, Settled,
};
