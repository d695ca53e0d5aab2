//! The approvals change feed between replicas (PostgreSQL only). Every write of an approval
//! (created, settled by a decision, an expiry or a cancel, orphaned with a lapsed replica)
//! notifies channel `turnstile_approvals` inside its own transaction, so the notification is
//! delivered at commit and never for a rolled-back write. Its payload is the approval id and
//! the replica that wrote it. Each replica listens on a connection of its own and republishes
//! on its local event stream what the others wrote; what it wrote itself it has already
//! published. A single gateway (SQLite) has no feed and needs none.

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::AsyncMessage;

use super::db::{vals, Engine, Tx};
use super::StoreError;

const LISTEN: &str = "LISTEN turnstile_approvals";

/// Tells the other replicas that `writer` changed approval `id` (in the writer's transaction).
pub(super) async fn notify(t: &mut Tx<'_>, id: &str, writer: &str) -> Result<(), StoreError> {
    if t.engine() == Engine::Postgres {
        let payload = format!("{id} {writer}");
        t.exec(
            "SELECT pg_notify('turnstile_approvals', ?1)",
            vals![&payload],
        )
        .await?;
    }
    Ok(())
}

/// A change the feed delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalChange {
    pub approval_id: String,
    /// The replica whose write it was.
    pub writer: String,
}

/// Where a replica's listening connection goes.
pub struct ApprovalFeed {
    config: tokio_postgres::Config,
}

/// A listening connection: its changes arrive on `changes` until it breaks (then `changes`
/// ends). Dropping it closes the connection.
pub struct Listening {
    pub changes: mpsc::UnboundedReceiver<ApprovalChange>,
    _client: tokio_postgres::Client,
}

impl ApprovalFeed {
    pub(super) fn new(config: tokio_postgres::Config) -> ApprovalFeed {
        ApprovalFeed { config }
    }

    /// Connects and listens, so that nothing committed after this returns is missed. The
    /// connection is driven by a task of its own that ends with the connection. Changes
    /// committed while not listening are not delivered: a reader re-reads the list when it
    /// needs the whole truth.
    pub async fn listen(&self) -> Result<Listening, StoreError> {
        let (client, mut connection) = self.config.connect(tokio_postgres::NoTls).await?;
        let (tx, changes) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(m)) = messages.next().await {
                let AsyncMessage::Notification(n) = m else {
                    continue;
                };
                if let Some((id, writer)) = n.payload().split_once(' ') {
                    let change = ApprovalChange {
                        approval_id: id.to_string(),
                        writer: writer.to_string(),
                    };
                    if tx.send(change).is_err() {
                        return;
                    }
                }
            }
        });
        client.batch_execute(LISTEN).await?;
        Ok(Listening {
            changes,
            _client: client,
        })
    }
}
