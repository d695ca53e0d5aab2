//! The approvals change feed between replicas (PostgreSQL only). Every write of an approval
//! (created, settled by a decision, an expiry or a cancel, orphaned with a lapsed replica)
//! notifies channel `turnstile_approvals` inside its own transaction, so the notification is
//! delivered at commit and never for a rolled-back write. Its payload is the approval id and
//! the replica that wrote it. Each replica listens on a connection of its own and republishes
//! on its local event stream what the others wrote; what it wrote itself it has already
//! published. A single gateway (SQLite) has no feed and needs none.

use std::time::Duration;

use postgres::fallible_iterator::FallibleIterator;

use super::db::{vals, Engine, Tx};
use super::StoreError;

const LISTEN: &str = "LISTEN turnstile_approvals";

/// Tells the other replicas that `writer` changed approval `id` (in the writer's transaction).
pub(super) fn notify(t: &mut dyn Tx, id: &str, writer: &str) -> Result<(), StoreError> {
    if t.engine() == Engine::Postgres {
        let payload = format!("{id} {writer}");
        t.exec(
            "SELECT pg_notify('turnstile_approvals', ?1)",
            vals![&payload],
        )?;
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

/// One replica's listening connection. Blocking: run it on a thread of its own.
pub struct ApprovalFeed {
    config: postgres::Config,
    client: Option<postgres::Client>,
}

impl ApprovalFeed {
    pub(super) fn new(config: postgres::Config) -> ApprovalFeed {
        ApprovalFeed {
            config,
            client: None,
        }
    }

    /// The changes that arrive within `timeout` (none when it passes quietly). Connects and
    /// listens first when there is no connection; a broken one is dropped, the error
    /// returned, and the next call connects again. Changes committed while disconnected are
    /// not delivered: a reader re-reads the list when it needs the whole truth.
    pub fn wait(&mut self, timeout: Duration) -> Result<Vec<ApprovalChange>, StoreError> {
        let out = self.receive(timeout);
        if out.is_err() {
            self.client = None;
        }
        out
    }

    /// Connects and listens now (from anywhere: the round trips run off the async workers),
    /// so that nothing committed after this returns is missed.
    pub fn listen(&mut self) -> Result<(), StoreError> {
        super::db::blocking(|| self.connected().map(|_| ()))
    }

    fn connected(&mut self) -> Result<&mut postgres::Client, StoreError> {
        if self.client.as_ref().is_some_and(|c| c.is_closed()) {
            self.client = None;
        }
        if self.client.is_none() {
            let mut client = self.config.connect(postgres::NoTls)?;
            client.batch_execute(LISTEN)?;
            self.client = Some(client);
        }
        Ok(self.client.as_mut().expect("connected above"))
    }

    fn receive(&mut self, timeout: Duration) -> Result<Vec<ApprovalChange>, StoreError> {
        let client = self.connected()?;
        let mut notifications = client.notifications();
        let Some(first) = notifications.timeout_iter(timeout).next()? else {
            return Ok(Vec::new());
        };
        // What else has arrived comes with the first.
        let mut arrived = vec![first];
        let mut more = notifications.iter();
        while let Some(n) = more.next()? {
            arrived.push(n);
        }
        Ok(arrived
            .iter()
            .filter_map(|n| n.payload().split_once(' '))
            .map(|(id, writer)| ApprovalChange {
                approval_id: id.to_string(),
                writer: writer.to_string(),
            })
            .collect())
    }
}
