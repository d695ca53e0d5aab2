//! Versioned migrations, applied in order at start on either engine. `schema_migrations`
//! holds the versions applied; each migration runs once, all pending ones in one transaction
//! (PostgreSQL's DDL is transactional, and replicas starting together serialise on an advisory
//! lock). The DDL is written once in SQLite's types and translated for PostgreSQL.
//!
//! Version 1 is the layout of the single-process store (a file written before migrations
//! existed already has it; its statements are `IF NOT EXISTS`). Version 2 adds what replicas
//! need: the owner replica of every live record, the validation data of a held turn's pending
//! tokens, a stateless record's claimant, and the replicas' leases.

use super::db::{Engine, Tx};
use super::StoreError;

const V1: &str = "
CREATE TABLE IF NOT EXISTS journal (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  at INTEGER NOT NULL,
  execution_id TEXT,
  event TEXT NOT NULL,
  detail TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS executions (
  execution_id TEXT PRIMARY KEY,
  principal TEXT NOT NULL,
  model TEXT NOT NULL,
  state TEXT NOT NULL,
  reason TEXT,
  created_at INTEGER NOT NULL,
  ended_at INTEGER
);
CREATE INDEX IF NOT EXISTS executions_state ON executions(state);
CREATE TABLE IF NOT EXISTS pending_tokens (
  digest BLOB PRIMARY KEY,
  principal TEXT NOT NULL,
  execution_id TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tombstones (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  digest BLOB NOT NULL UNIQUE,
  principal TEXT NOT NULL,
  reason TEXT NOT NULL,
  at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS tombstones_principal ON tombstones(principal, seq);
CREATE TABLE IF NOT EXISTS upstream_pending (
  digest BLOB PRIMARY KEY,
  execution_id TEXT NOT NULL,
  principal TEXT NOT NULL,
  model TEXT NOT NULL,
  deadline_ms INTEGER NOT NULL,
  digests BLOB NOT NULL,
  upstream_id TEXT NOT NULL,
  position INTEGER NOT NULL,
  rounds INTEGER NOT NULL,
  created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS approvals (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  principal TEXT NOT NULL,
  execution_id TEXT NOT NULL,
  invocation_id TEXT NOT NULL,
  kind TEXT NOT NULL,
  model TEXT NOT NULL,
  action_digest TEXT NOT NULL,
  summary TEXT NOT NULL,
  state TEXT NOT NULL,
  reason TEXT,
  created_at INTEGER NOT NULL,
  expires_at INTEGER NOT NULL,
  decided_at INTEGER,
  decided_by TEXT
);
CREATE INDEX IF NOT EXISTS approvals_state ON approvals(state);
CREATE TABLE IF NOT EXISTS usage_daily (
  day INTEGER NOT NULL,
  principal TEXT NOT NULL,
  model TEXT NOT NULL,
  input_tokens INTEGER NOT NULL DEFAULT 0,
  cached_input_tokens INTEGER NOT NULL DEFAULT 0,
  output_tokens INTEGER NOT NULL DEFAULT 0,
  reasoning_tokens INTEGER NOT NULL DEFAULT 0,
  requests INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (day, principal, model)
);
";

const V2: &str = "
ALTER TABLE executions ADD COLUMN owner TEXT NOT NULL DEFAULT '';
ALTER TABLE pending_tokens ADD COLUMN owner TEXT NOT NULL DEFAULT '';
ALTER TABLE pending_tokens ADD COLUMN model TEXT NOT NULL DEFAULT '';
ALTER TABLE pending_tokens ADD COLUMN surface TEXT NOT NULL DEFAULT 'chat';
ALTER TABLE pending_tokens ADD COLUMN deadline_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pending_tokens ADD COLUMN digests BLOB;
ALTER TABLE pending_tokens ADD COLUMN position INTEGER NOT NULL DEFAULT 0;
CREATE INDEX pending_tokens_execution ON pending_tokens(execution_id);
CREATE INDEX pending_tokens_owner ON pending_tokens(owner);
ALTER TABLE upstream_pending ADD COLUMN owner TEXT NOT NULL DEFAULT '';
ALTER TABLE upstream_pending ADD COLUMN claimed_by TEXT;
CREATE INDEX upstream_pending_execution ON upstream_pending(execution_id);
ALTER TABLE approvals ADD COLUMN owner TEXT NOT NULL DEFAULT '';
CREATE INDEX executions_owner ON executions(owner, state);
CREATE TABLE replicas (
  replica_id TEXT PRIMARY KEY,
  url TEXT NOT NULL,
  epoch INTEGER NOT NULL,
  expires_at_ms INTEGER NOT NULL,
  settled INTEGER NOT NULL DEFAULT 0
);
";

/// The reason a human gave with a decision.
const V3: &str = "
ALTER TABLE approvals ADD COLUMN decision_reason TEXT;
";

/// The migrations in order; a version, once released, never changes.
/// A non-approver's approvals list filters by principal before its limit.
const V4: &str = "
CREATE INDEX approvals_principal ON approvals(principal, seq);
";

/// Remote compaction summaries (sealed under a key their handle derives; found by the
/// handle's digest, bound to a principal, until they expire) and cache writes in the usage
/// totals.
const V5: &str = "
CREATE TABLE compactions (
  digest BLOB PRIMARY KEY,
  principal TEXT NOT NULL,
  model TEXT NOT NULL,
  sealed BLOB NOT NULL,
  created_at INTEGER NOT NULL,
  expires_at INTEGER NOT NULL
);
CREATE INDEX compactions_expiry ON compactions(expires_at);
ALTER TABLE usage_daily ADD COLUMN cache_write_tokens INTEGER NOT NULL DEFAULT 0;
";

/// Spend: what each day's usage cost at its model's price, and what a stateless execution
/// spent before its suspension (its per-execution cap), in nano-USD; a principal's days found
/// by principal (the budget read).
const V6: &str = "
ALTER TABLE usage_daily ADD COLUMN spend_nanousd INTEGER NOT NULL DEFAULT 0;
ALTER TABLE upstream_pending ADD COLUMN spend_nanousd INTEGER NOT NULL DEFAULT 0;
CREATE INDEX usage_daily_principal ON usage_daily(principal, day);
";

/// The Managed Agents API: its objects (agents by version, environments, sessions) as their
/// JSON, each its principal's; a session's event log in order; each principal's stored event
/// bytes.
const V7: &str = "
CREATE TABLE managed_objects (
  kind TEXT NOT NULL,
  id TEXT NOT NULL,
  version INTEGER NOT NULL,
  principal TEXT NOT NULL,
  body TEXT NOT NULL,
  archived INTEGER NOT NULL DEFAULT 0,
  created_at_ms INTEGER NOT NULL,
  owner TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (kind, id, version)
);
CREATE INDEX managed_objects_principal ON managed_objects(principal, kind, created_at_ms);
CREATE TABLE managed_events (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  session_id TEXT NOT NULL,
  id TEXT NOT NULL,
  principal TEXT NOT NULL,
  body TEXT NOT NULL,
  bytes INTEGER NOT NULL
);
CREATE INDEX managed_events_session ON managed_events(session_id, seq);
CREATE INDEX managed_events_id ON managed_events(session_id, id);
CREATE TABLE managed_quota (
  principal TEXT PRIMARY KEY,
  event_bytes INTEGER NOT NULL
);
";

/// Version 8: the notification outbox (one row per event and endpoint, leased by the replica
/// delivering it) and the single-use decision links of approvals (digests only).
const V8: &str = "
CREATE TABLE outbox (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  endpoint TEXT NOT NULL,
  event TEXT NOT NULL,
  principal TEXT NOT NULL,
  body TEXT NOT NULL,
  created_ms INTEGER NOT NULL,
  due_at_ms INTEGER NOT NULL,
  attempts INTEGER NOT NULL,
  state TEXT NOT NULL,
  owner TEXT NOT NULL,
  leased INTEGER NOT NULL DEFAULT 0,
  last_status INTEGER,
  last_error TEXT,
  done_ms INTEGER,
  latency_ms INTEGER
);
CREATE INDEX outbox_due ON outbox(state, due_at_ms);
CREATE TABLE decision_links (
  digest BLOB PRIMARY KEY,
  approval_id TEXT NOT NULL,
  decision TEXT NOT NULL,
  endpoint TEXT NOT NULL,
  expires_at INTEGER NOT NULL,
  used_at INTEGER
);
CREATE INDEX decision_links_approval ON decision_links(approval_id);
";

/// Version 9: single sign-on. The key that signs the gateway's own access tokens (one row,
/// written by the first replica to start), and the sign-in sessions behind them (the
/// gateway's refresh token as a digest; the provider's, sealed).
const V9: &str = "
CREATE TABLE sso_keys (
  id TEXT PRIMARY KEY,
  secret BLOB NOT NULL,
  created_at INTEGER NOT NULL
);
CREATE TABLE sso_sessions (
  id TEXT PRIMARY KEY,
  refresh_digest BLOB NOT NULL UNIQUE,
  issuer TEXT NOT NULL,
  subject TEXT NOT NULL,
  groups TEXT NOT NULL,
  idp_refresh BLOB,
  generation INTEGER NOT NULL,
  created_at INTEGER NOT NULL,
  refreshed_at INTEGER NOT NULL,
  expires_at INTEGER NOT NULL,
  revoked_at INTEGER
);
CREATE INDEX sso_sessions_subject ON sso_sessions(issuer, subject);
";

const MIGRATIONS: &[(i64, &str)] = &[
    (1, V1),
    (2, V2),
    (3, V3),
    (4, V4),
    (5, V5),
    (6, V6),
    (7, V7),
    (8, V8),
    (9, V9),
];

/// The schema version this build writes.
pub const CURRENT: i64 = 9;

/// SQLite's DDL in PostgreSQL's types.
fn ddl(engine: Engine, sql: &str) -> String {
    match engine {
        Engine::Sqlite => sql.to_string(),
        Engine::Postgres => sql
            .replace("INTEGER PRIMARY KEY AUTOINCREMENT", "BIGSERIAL PRIMARY KEY")
            .replace("INTEGER", "BIGINT")
            .replace("BLOB", "BYTEA"),
    }
}

/// Applies every migration not yet applied. Returns the versions it applied.
pub(super) async fn migrate(t: &mut Tx<'_>) -> Result<Vec<i64>, StoreError> {
    let engine = t.engine();
    if engine == Engine::Postgres {
        // Replicas starting at once: one migrates, the others then find it done.
        t.exec("SELECT pg_advisory_xact_lock(7406151)", &[]).await?;
    }
    t.batch(&ddl(
        engine,
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)",
    )).await?;
    let applied: Vec<i64> = t
        .rows("SELECT version FROM schema_migrations", &[])
        .await?
        .iter()
        .map(|r| r.i(0))
        .collect::<Result<_, _>>()?;
    if let Some(newer) = applied.iter().find(|v| **v > CURRENT) {
        return Err(StoreError::NewerSchema {
            found: *newer,
            current: CURRENT,
        });
    }
    let mut done = Vec::new();
    for (version, sql) in MIGRATIONS {
        if applied.contains(version) {
            continue;
        }
        t.batch(&ddl(engine, sql)).await?;
        if *version == 1 {
            v1_surface(t).await?;
        }
        t.exec(
            "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, ?2)",
            super::db::vals![*version, super::now_unix()],
        )
        .await?;
        done.push(*version);
    }
    Ok(done)
}

/// `upstream_pending.surface` came after the table, in the single-process store: add it when
/// a file from before lacks it.
async fn v1_surface(t: &mut Tx<'_>) -> Result<(), StoreError> {
    let has = match t.engine() {
        Engine::Sqlite => !t
            .rows(
                "SELECT 1 FROM pragma_table_info('upstream_pending') WHERE name = 'surface'",
                &[],
            )
            .await?
            .is_empty(),
        Engine::Postgres => false,
    };
    if !has {
        t.batch("ALTER TABLE upstream_pending ADD COLUMN surface TEXT NOT NULL DEFAULT 'chat'")
            .await?;
    }
    Ok(())
}
