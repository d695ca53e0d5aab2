//! What a `[[clients]]` entry and a `[[auth.jwt]]` issuer both grant: roles and admission
//! limits. A leaf: `config` and [`super::jwt`] use these types, and this module imports
//! neither, so the JWT issuer type can live in `auth::jwt` without a cycle through `config`.

use std::num::NonZeroU32;

/// A role a principal may hold (`roles = ["approver"]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// May list and decide pending approvals.
    Approver,
}

impl Role {
    /// The role spelled `name` in the config, if there is one.
    pub fn from_name(name: &str) -> Option<Role> {
        match name {
            "approver" => Some(Role::Approver),
            _ => None,
        }
    }
}

/// A GCRA quota: `per_minute` requests, up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    pub per_minute: NonZeroU32,
    pub burst: NonZeroU32,
}

/// Admission limits of a principal's fresh turns; `None` is unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientLimits {
    pub rate: Option<Rate>,
    /// Executions running or suspended at once.
    pub concurrent_executions: Option<usize>,
    /// Suspended executions at once.
    pub max_suspended: Option<usize>,
    /// Open event streams and streamed legs at once (`None`: `server.max_streams_per_client`).
    pub max_streams: Option<usize>,
    /// Spend caps (`budget = { … }`).
    pub budget: crate::budget::Budget,
}
