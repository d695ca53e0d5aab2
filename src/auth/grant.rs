//! What a `[[clients]]` entry, a `[[auth.jwt]]` issuer and a `[[groups]]` entry grant: roles
//! and admission limits, and how they add up into a principal's [`Grant`]. A leaf: `config` and [`super::jwt`] use these types, and this module imports
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

/// The groups a principal's token named (its issuer's `groups_claim`), in token order; empty
/// for an API key. Names, not entries: a reload applies to them at once.
pub type Groups = std::sync::Arc<[String]>;

/// The most groups kept from one token, and the longest name kept (the rest are ignored).
pub const MAX_GROUPS: usize = 256;
pub const MAX_GROUP_NAME_BYTES: usize = 256;

/// The principal id a group's pooled budget is counted under in the usage ledger: client
/// ids never start with [`GROUP_PREFIX`].
pub const GROUP_PREFIX: &str = "group:";

pub fn pool_id(group: &str) -> String {
    format!("{GROUP_PREFIX}{group}")
}

/// A model allowlist (`models = ["codex-*"]`). One that holds `*` allows every name, which is
/// answered without the glob engine (every request asks).
#[derive(Debug, Clone)]
pub struct Models {
    globs: globset::GlobSet,
    every: bool,
}

impl Models {
    /// `globs`, built from `patterns`.
    pub fn new(globs: globset::GlobSet, patterns: &[impl AsRef<str>]) -> Models {
        let every = patterns.iter().any(|p| matches!(p.as_ref(), "*" | "**"));
        Models { globs, every }
    }

    pub fn is_match(&self, model: &str) -> bool {
        self.every || self.globs.is_match(model)
    }
}

/// A `[[groups]]` entry: what members of an identity provider's group get besides their own
/// entry.
#[derive(Debug, Clone)]
pub struct GroupConfig {
    pub name: String,
    pub models: Models,
    pub roles: Vec<Role>,
    /// Its limits; `budget`'s daily, monthly and token caps are pooled over the members.
    pub limits: ClientLimits,
}

/// A client entry's or issuer's own models, roles and limits.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    pub models: &'a Models,
    pub roles: &'a [Role],
    pub limits: &'a ClientLimits,
}

/// What a principal may do under one config: its own entry, and the configured groups its
/// token names. Models and roles are the union; every limit is the tightest; the budget is
/// its own, with the tightest per-execution cap, and each group's window caps are pooled
/// ([`Grant::pools`]).
#[derive(Debug, Clone)]
pub struct Grant<'a> {
    pub own: Entry<'a>,
    pub groups: Vec<&'a GroupConfig>,
}

impl<'a> Grant<'a> {
    pub fn may_use(&self, model: &str) -> bool {
        self.own.models.is_match(model) || self.groups.iter().any(|g| g.models.is_match(model))
    }

    pub fn approver(&self) -> bool {
        self.own.roles.contains(&Role::Approver)
            || (self.groups.iter()).any(|g| g.roles.contains(&Role::Approver))
    }

    /// Its limits: its own entry's when no group applies, else the tightest of each.
    pub fn limits(&self) -> std::borrow::Cow<'a, ClientLimits> {
        use std::borrow::Cow;
        if self.groups.is_empty() {
            return Cow::Borrowed(self.own.limits);
        }
        let mut l = self.own.limits.clone();
        for g in &self.groups {
            let o = &g.limits;
            l.rate = tightest_rate(l.rate, o.rate);
            l.concurrent_executions = tightest(l.concurrent_executions, o.concurrent_executions);
            l.max_suspended = tightest(l.max_suspended, o.max_suspended);
            l.max_streams = tightest(l.max_streams, o.max_streams);
            l.budget.usd_per_execution =
                tightest(l.budget.usd_per_execution, o.budget.usd_per_execution);
        }
        Cow::Owned(l)
    }

    /// The groups whose daily, monthly or token caps its fresh turns count against, pooled
    /// with every other member's.
    pub fn pools(&self) -> impl Iterator<Item = &'a GroupConfig> + '_ {
        self.groups
            .iter()
            .copied()
            .filter(|g| g.limits.budget.gates_fresh())
    }
}

fn tightest<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn tightest_rate(a: Option<Rate>, b: Option<Rate>) -> Option<Rate> {
    match (a, b) {
        (Some(a), Some(b)) => Some(Rate {
            per_minute: a.per_minute.min(b.per_minute),
            burst: a.burst.min(b.burst),
        }),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Budget;

    fn globs(p: &[&str]) -> Models {
        let mut b = globset::GlobSetBuilder::new();
        for p in p {
            b.add(globset::Glob::new(p).unwrap());
        }
        Models::new(b.build().unwrap(), p)
    }

    fn rate(per_minute: u32, burst: u32) -> Option<Rate> {
        Some(Rate {
            per_minute: NonZeroU32::new(per_minute).unwrap(),
            burst: NonZeroU32::new(burst).unwrap(),
        })
    }

    #[test]
    fn groups_add_models_and_roles_and_tighten_limits() {
        let own_models = globs(&["demo"]);
        let own = ClientLimits {
            rate: rate(60, 10),
            max_streams: Some(8),
            budget: Budget {
                usd_per_day: Some(5),
                usd_per_execution: Some(3),
                ..Budget::default()
            },
            ..ClientLimits::default()
        };
        let dev = GroupConfig {
            name: "developers".into(),
            models: globs(&["codex-*"]),
            roles: vec![],
            limits: ClientLimits {
                rate: rate(120, 4),
                concurrent_executions: Some(2),
                budget: Budget {
                    usd_per_month: Some(100),
                    usd_per_execution: Some(1),
                    ..Budget::default()
                },
                ..ClientLimits::default()
            },
        };
        let ops = GroupConfig {
            name: "approvers".into(),
            models: globs(&[]),
            roles: vec![Role::Approver],
            limits: ClientLimits {
                max_streams: Some(2),
                concurrent_executions: Some(5),
                ..ClientLimits::default()
            },
        };
        let entry = Entry {
            models: &own_models,
            roles: &[],
            limits: &own,
        };
        let alone = Grant {
            own: entry,
            groups: vec![],
        };
        assert!(!alone.approver() && alone.may_use("demo") && !alone.may_use("codex-1"));
        assert!(matches!(alone.limits(), std::borrow::Cow::Borrowed(_)));
        assert_eq!(alone.pools().count(), 0);

        let g = Grant {
            own: entry,
            groups: vec![&dev, &ops],
        };
        assert!(g.approver() && g.may_use("demo") && g.may_use("codex-1") && !g.may_use("x"));
        let l = g.limits();
        assert_eq!(l.rate, rate(60, 4), "each part of the rate at its tightest");
        assert_eq!(l.concurrent_executions, Some(2));
        assert_eq!(l.max_streams, Some(2));
        assert_eq!(l.max_suspended, None);
        // Its own window caps stay its own; the group's monthly cap is pooled, not copied.
        assert_eq!(l.budget.usd_per_day, Some(5));
        assert_eq!(l.budget.usd_per_month, None);
        assert_eq!(l.budget.usd_per_execution, Some(1));
        let pools: Vec<_> = g.pools().map(|g| g.name.as_str()).collect();
        assert_eq!(pools, ["developers"]);
    }
}
