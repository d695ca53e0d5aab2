//! Client surfaces: one module per client API. A surface owns its wire types, its tolerant
//! parsing into a neutral [`crate::turn::TurnInput`], its canonical projection for the
//! continuation digests, its continuation detection, its response and stream framing and its
//! error body shape. Nothing else knows a client wire format.

pub mod chat;
pub mod responses;
pub mod sse;
