//! The model's approval policy applied to a backend's request to perform a side effect of
//! its own: `allow` and `deny` are journaled and answered at once; `ask` becomes a durable
//! approval (in the store before anyone can see it) and the waiting stream is told its id.

use super::execution::ExecutionMeta;
use crate::approvals::Approvals;
use crate::backend::{ApprovalAsk, ApprovalKind};
use crate::config::{Config, Decision};
use crate::digest::log_ref;
use crate::store::Store;
use crate::telemetry::Parent;

/// Answers `ask` by the model's policy in `cfg`, or parks it as an approval; returns the
/// notice for the waiting stream of a parked one.
pub(super) async fn apply(
    cfg: &Config,
    store: &Store,
    approvals: &Approvals,
    exec: &ExecutionMeta,
    ask: ApprovalAsk,
    at: &Parent,
) -> Option<String> {
    // Authority is the current config's: a principal whose entry (or access to the model)
    // a reload removed gets every side effect denied, and no approval is created.
    let granted = cfg.may_use(&exec.principal, &exec.model);
    let policy = cfg
        .model(&exec.model)
        .filter(|_| granted)
        .map(|m| &m.approvals);
    let decision = policy.map_or(Decision::Deny, |p| match ask.kind {
        ApprovalKind::Command => p.command,
        ApprovalKind::FileChange => p.file_change,
        ApprovalKind::Permissions => p.permissions,
        ApprovalKind::Elicitation => p.elicitation,
    });
    let kind = ask.kind.as_str();
    match decision {
        Decision::Allow | Decision::Deny => {
            let allow = decision == Decision::Allow;
            let detail = format!(
                "kind={kind} decision={} action={}",
                if allow { "allow" } else { "deny" },
                log_ref(&ask.action_digest)
            );
            if let Err(e) = store.journal(&exec.id, "approval_policy", &detail).await {
                tracing::error!(execution = %exec.id, error = %e, "approval not journaled; denied");
                ask.responder.answer(false);
                return None;
            }
            tracing::info!(execution = %exec.id, kind, allow, "approval answered by policy");
            ask.responder.answer(allow);
            None
        }
        Decision::Ask => {
            let created = approvals
                .create(
                    &exec.principal,
                    &exec.id,
                    &exec.model,
                    ask,
                    cfg.approval_ttl,
                    at,
                )
                .await;
            created.ok().map(|record| {
                format!(
                    "approval pending {} ({kind}); decide with POST /v1/approvals/{}/decision",
                    record.id, record.id
                )
            })
        }
    }
}
