//! Running the gateway: continuations and approvals on the store (SQLite, and PostgreSQL in
//! the second pass), lifecycle, threads, budgets, replicas, connections, crash and flood,
//! JWTs, the second security review's cases and traces.

mod approvals;
pub(crate) mod budgets;
pub(crate) mod cluster;
mod connections;
mod continuation;
mod crash;
mod flood;
mod groups;
pub(crate) mod jwt;
mod lifecycle;
pub(crate) mod oidc;
mod security_ii;
pub(crate) mod sign_in;
mod store_pg;
mod threads;
mod traces;
pub(crate) mod webhooks;
