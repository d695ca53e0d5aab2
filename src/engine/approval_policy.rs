//! The model's approval policy applied to a backend's request to perform a side effect of
//! its own: `allow` and `deny` are journaled and answered at once; `ask` becomes a durable
//! approval (in the store before anyone can see it) and the waiting stream is told its id.
//! An execution may carry a narrowing of its own (a Managed Agents session's permission
//! policies): the stricter of the two decides, so it never widens the model's policy.

use serde_json::Value;

use super::execution::ExecutionMeta;
use crate::approvals::Approvals;
use crate::backend::{ApprovalAsk, ApprovalKind};
use crate::config::{Config, Decision};
use crate::digest::log_ref;
use crate::store::Store;
use crate::telemetry::Parent;

/// A backend side effect as the policy answered it, for the leg's stream.
#[derive(Debug, Clone)]
pub struct ApprovalNotice {
    pub kind: ApprovalKind,
    /// The redacted summary approvers see.
    pub summary: Value,
    /// `Ask` only while its approval is pending (`approval_id`); a store that could not
    /// record one made it `Deny`.
    pub decision: Decision,
    pub approval_id: Option<String>,
    /// The tool use asked about, when the backend named it.
    pub tool_use: Option<crate::backend::ToolUseKey>,
}

impl ApprovalNotice {
    /// What a human watching a stream should know: that an approval waits, and where to
    /// decide it (nothing for a side effect the policy answered).
    pub fn text(&self) -> Option<String> {
        let id = self.approval_id.as_deref()?;
        let kind = self.kind.as_str();
        Some(format!(
            "approval pending {id} ({kind}); decide with POST /v1/approvals/{id}/decision"
        ))
    }
}

/// Answers `ask` by the model's policy in `cfg` (narrowed by the execution's own), or parks
/// it as an approval; returns what the leg's stream is told, nothing for a principal that
/// lost its grant.
pub(super) async fn apply(
    cfg: &Config,
    store: &Store,
    approvals: &Approvals,
    exec: &ExecutionMeta,
    ask: ApprovalAsk,
    at: &Parent,
) -> Option<ApprovalNotice> {
    // Authority is the current config's: a principal whose entry (or access to the model)
    // a reload removed gets every side effect denied, and no approval is created.
    let granted = cfg.may_use(&exec.principal, exec.groups(), &exec.model);
    let policy = cfg
        .model(&exec.model)
        .filter(|_| granted)
        .map(|m| match &exec.approvals {
            Some(own) => m.approvals.narrowed(own),
            None => m.approvals,
        });
    let decision = policy.map_or(Decision::Deny, |p| match ask.kind {
        ApprovalKind::Command => p.command,
        ApprovalKind::FileChange => p.file_change,
        ApprovalKind::Permissions => p.permissions,
        ApprovalKind::Elicitation => p.elicitation,
    });
    let (kind, summary, tool_use) = (ask.kind, ask.summary.clone(), ask.tool_use);
    let notice = |decision, approval_id| {
        granted.then_some(ApprovalNotice {
            kind,
            summary,
            decision,
            approval_id,
            tool_use,
        })
    };
    match decision {
        Decision::Allow | Decision::Deny => {
            let allow = decision == Decision::Allow;
            let detail = format!(
                "kind={} decision={} action={}",
                kind.as_str(),
                if allow { "allow" } else { "deny" },
                log_ref(&ask.action_digest)
            );
            if let Err(e) = store.journal(&exec.id, "approval_policy", &detail).await {
                tracing::error!(execution = %exec.id, error = %e, "approval not journaled; denied");
                ask.responder.answer(false);
                return notice(Decision::Deny, None);
            }
            tracing::info!(execution = %exec.id, kind = kind.as_str(), allow, "approval answered by policy");
            ask.responder.answer(allow);
            notice(decision, None)
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
            match created {
                Ok(record) => notice(Decision::Ask, Some(record.id)),
                Err(_) => notice(Decision::Deny, None),
            }
        }
    }
}
