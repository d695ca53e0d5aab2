//! The two database engines behind the one store interface: embedded SQLite (the default) and
//! PostgreSQL (shared by replicas). The store writes its statements once, in the dialect both
//! accept (`?N` parameters, `ON CONFLICT`, `RETURNING`); this module binds neutral values,
//! reads neutral rows, runs every closure in one transaction and rewrites `?N` as `$N` for
//! PostgreSQL.
//!
//! SQLite is one connection behind an async lock: its statements are local and short, run on
//! the task that holds the lock, and never wait on anything else, so one writer at a time is
//! its whole discipline. PostgreSQL is an async client (`tokio-postgres`) over a pool
//! (`deadpool-postgres`: the maintained pool for it, small, with a statement cache per
//! connection; `sqlx` would bring its own driver, macros and a second set of types for what
//! `tokio-postgres` already does here). A call waits for a connection, never for another
//! call's round trips; a connection that broke is found closed at checkout and replaced, so a
//! database that comes back is used again without a restart.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rusqlite::types::{ToSqlOutput, ValueRef};
use tokio_postgres::types::{to_sql_checked, IsNull, ToSql, Type};

use super::StoreError;

/// A parameter.
#[derive(Debug, Clone, Copy)]
pub(super) enum Val<'a> {
    I(i64),
    T(&'a str),
    B(&'a [u8]),
    /// Digests as one array parameter (PostgreSQL only: `= ANY(?1)`, `unnest(?1)`).
    Digests(&'a [[u8; 32]]),
    /// Text and integer arrays (PostgreSQL only, for `unnest`); `None` is NULL.
    Texts(&'a [Option<&'a str>]),
    Ints(&'a [i64]),
    Null,
}

impl From<i64> for Val<'_> {
    fn from(v: i64) -> Self {
        Val::I(v)
    }
}
impl From<u32> for Val<'_> {
    fn from(v: u32) -> Self {
        Val::I(v as i64)
    }
}
impl From<u64> for Val<'_> {
    fn from(v: u64) -> Self {
        Val::I(v as i64)
    }
}
impl<'a> From<&'a str> for Val<'a> {
    fn from(v: &'a str) -> Self {
        Val::T(v)
    }
}
impl<'a> From<&'a String> for Val<'a> {
    fn from(v: &'a String) -> Self {
        Val::T(v)
    }
}
impl<'a> From<&'a [u8]> for Val<'a> {
    fn from(v: &'a [u8]) -> Self {
        Val::B(v)
    }
}
impl<'a> From<&'a [u8; 32]> for Val<'a> {
    fn from(v: &'a [u8; 32]) -> Self {
        Val::B(v)
    }
}
impl<'a, T: Into<Val<'a>>> From<Option<T>> for Val<'a> {
    fn from(v: Option<T>) -> Self {
        v.map_or(Val::Null, Into::into)
    }
}

/// `vals![a, b]`: the parameters of one statement.
macro_rules! vals {
    ($($v:expr),* $(,)?) => { &[$($crate::store::db::Val::from($v)),*][..] };
}
pub(super) use vals;

impl rusqlite::ToSql for Val<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match *self {
            Val::I(v) => ValueRef::Integer(v),
            Val::T(v) => ValueRef::Text(v.as_bytes()),
            Val::B(v) => ValueRef::Blob(v),
            Val::Null => ValueRef::Null,
            Val::Digests(_) | Val::Texts(_) | Val::Ints(_) => {
                return Err(rusqlite::Error::ToSqlConversionFailure(
                    "an array parameter is for PostgreSQL only".into(),
                ))
            }
        }))
    }
}

impl ToSql for Val<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match *self {
            Val::I(v) if *ty == Type::INT4 => i32::try_from(v)?.to_sql(ty, out),
            Val::I(v) => v.to_sql(ty, out),
            Val::T(v) => v.to_sql(ty, out),
            Val::B(v) => v.to_sql(ty, out),
            Val::Digests(v) => v.iter().map(|d| &d[..]).collect::<Vec<_>>().to_sql(ty, out),
            Val::Texts(v) => v.to_sql(ty, out),
            Val::Ints(v) => v.to_sql(ty, out),
            Val::Null => Ok(IsNull::Yes),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

/// A value read back.
#[derive(Debug, Clone, PartialEq)]
enum Cell {
    I(i64),
    T(String),
    B(Vec<u8>),
    Null,
}

/// A row read back, by column position.
#[derive(Debug, Clone)]
pub(super) struct Row(Vec<Cell>);

fn bad_column(column: usize, want: &'static str) -> StoreError {
    StoreError::Shape { column, want }
}

impl Row {
    pub fn i(&self, i: usize) -> Result<i64, StoreError> {
        self.oi(i)?.ok_or_else(|| bad_column(i, "an integer"))
    }
    pub fn oi(&self, i: usize) -> Result<Option<i64>, StoreError> {
        match self.0.get(i) {
            Some(Cell::I(v)) => Ok(Some(*v)),
            Some(Cell::Null) => Ok(None),
            _ => Err(bad_column(i, "an integer")),
        }
    }
    pub fn t(&self, i: usize) -> Result<String, StoreError> {
        self.ot(i)?.ok_or_else(|| bad_column(i, "text"))
    }
    pub fn ot(&self, i: usize) -> Result<Option<String>, StoreError> {
        match self.0.get(i) {
            Some(Cell::T(v)) => Ok(Some(v.clone())),
            Some(Cell::Null) => Ok(None),
            _ => Err(bad_column(i, "text")),
        }
    }
    pub fn b(&self, i: usize) -> Result<Vec<u8>, StoreError> {
        match self.0.get(i) {
            Some(Cell::B(v)) => Ok(v.clone()),
            _ => Err(bad_column(i, "bytes")),
        }
    }
    pub fn ob(&self, i: usize) -> Result<Option<Vec<u8>>, StoreError> {
        match self.0.get(i) {
            Some(Cell::B(v)) => Ok(Some(v.clone())),
            Some(Cell::Null) => Ok(None),
            _ => Err(bad_column(i, "bytes")),
        }
    }
    /// A 32-byte digest column (None for any other length).
    pub fn digest(&self, i: usize) -> Result<Option<[u8; 32]>, StoreError> {
        Ok(<[u8; 32]>::try_from(self.b(i)?.as_slice()).ok())
    }
}

/// The prepared statement for `sql` on a PostgreSQL connection or transaction, from the
/// connection's cache; counts the round trip the statement takes, and the one preparing it
/// takes on its first use on a connection.
macro_rules! pg_statement {
    ($c:expr, $n:expr, $sql:expr) => {{
        let cached = $c.statement_cache.size();
        let s = $c.prepare_cached(&dollar($sql)).await?;
        let prepared = $c.statement_cache.size() > cached;
        $n.fetch_add(1 + u64::from(prepared), Ordering::Relaxed);
        s
    }};
}

/// One transaction (or, for reads on PostgreSQL, a connection) on either engine.
pub(super) enum Tx<'a> {
    Sqlite(&'a mut rusqlite::Connection),
    Pg(&'a deadpool_postgres::Client, &'a AtomicU64),
    PgTransaction(&'a deadpool_postgres::Transaction<'a>, &'a AtomicU64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Engine {
    Sqlite,
    Postgres,
}

impl Tx<'_> {
    pub fn engine(&self) -> Engine {
        match self {
            Tx::Sqlite(_) => Engine::Sqlite,
            Tx::Pg(..) | Tx::PgTransaction(..) => Engine::Postgres,
        }
    }

    /// Runs one statement; the number of rows it changed.
    pub async fn exec(&mut self, sql: &str, p: &[Val<'_>]) -> Result<u64, StoreError> {
        match self {
            Tx::Sqlite(c) => sqlite_exec(c, sql, p),
            Tx::Pg(c, n) => Ok(c.execute(&pg_statement!(c, n, sql), &params(p)).await?),
            Tx::PgTransaction(c, n) => Ok(c.execute(&pg_statement!(c, n, sql), &params(p)).await?),
        }
    }

    /// Runs one query (or a statement with `RETURNING`).
    pub async fn rows(&mut self, sql: &str, p: &[Val<'_>]) -> Result<Vec<Row>, StoreError> {
        let rows = match self {
            Tx::Sqlite(c) => return sqlite_rows(c, sql, p),
            Tx::Pg(c, n) => c.query(&pg_statement!(c, n, sql), &params(p)).await?,
            Tx::PgTransaction(c, n) => c.query(&pg_statement!(c, n, sql), &params(p)).await?,
        };
        rows.iter().map(pg_row).collect()
    }

    /// Runs statements without parameters (migrations).
    pub async fn batch(&mut self, sql: &str) -> Result<(), StoreError> {
        match self {
            Tx::Sqlite(c) => Ok(c.execute_batch(sql)?),
            Tx::Pg(c, n) => {
                n.fetch_add(1, Ordering::Relaxed);
                Ok(c.batch_execute(sql).await?)
            }
            Tx::PgTransaction(c, n) => {
                n.fetch_add(1, Ordering::Relaxed);
                Ok(c.batch_execute(sql).await?)
            }
        }
    }
}

fn sqlite_exec(c: &rusqlite::Connection, sql: &str, p: &[Val<'_>]) -> Result<u64, StoreError> {
    Ok(c.prepare_cached(sql)?
        .execute(rusqlite::params_from_iter(p))? as u64)
}

fn sqlite_rows(c: &rusqlite::Connection, sql: &str, p: &[Val<'_>]) -> Result<Vec<Row>, StoreError> {
    let mut stmt = c.prepare_cached(sql)?;
    let n = stmt.column_count();
    let mut rows = stmt.query(rusqlite::params_from_iter(p))?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        let mut cells = Vec::with_capacity(n);
        for i in 0..n {
            cells.push(match r.get_ref(i)? {
                ValueRef::Integer(v) => Cell::I(v),
                ValueRef::Text(v) => Cell::T(String::from_utf8_lossy(v).into_owned()),
                ValueRef::Blob(v) => Cell::B(v.to_vec()),
                ValueRef::Null => Cell::Null,
                ValueRef::Real(v) => Cell::I(v as i64),
            });
        }
        out.push(Row(cells));
    }
    Ok(out)
}

/// `?N` -> `$N` (the statements never hold a `?` elsewhere).
fn dollar(sql: &str) -> String {
    sql.replace('?', "$")
}

fn params<'v>(p: &'v [Val<'v>]) -> Vec<&'v (dyn ToSql + Sync)> {
    p.iter().map(|v| v as &(dyn ToSql + Sync)).collect()
}

fn pg_row(r: &tokio_postgres::Row) -> Result<Row, StoreError> {
    let mut cells = Vec::with_capacity(r.len());
    for (i, col) in r.columns().iter().enumerate() {
        let ty = col.type_();
        cells.push(if *ty == Type::INT8 {
            r.try_get::<_, Option<i64>>(i)?.map_or(Cell::Null, Cell::I)
        } else if *ty == Type::INT4 {
            r.try_get::<_, Option<i32>>(i)?
                .map_or(Cell::Null, |v| Cell::I(v.into()))
        } else if *ty == Type::BYTEA {
            r.try_get::<_, Option<Vec<u8>>>(i)?
                .map_or(Cell::Null, Cell::B)
        } else {
            r.try_get::<_, Option<String>>(i)?
                .map_or(Cell::Null, Cell::T)
        });
    }
    Ok(Row(cells))
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        // The cause chain (`db error: ERROR: ...`, `connection refused`) without parameters.
        let mut s = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(c) = src {
            s.push_str(": ");
            s.push_str(&c.to_string());
            src = c.source();
        }
        StoreError::Database(s)
    }
}

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        match e {
            deadpool_postgres::PoolError::Backend(e) => e.into(),
            e => StoreError::Database(format!("pool: {e}")),
        }
    }
}

/// How long connecting, waiting for a pooled connection, and any one statement may take
/// before the store reads as down.
const PG_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) enum Db {
    Sqlite(tokio::sync::Mutex<rusqlite::Connection>),
    Postgres {
        pool: deadpool_postgres::Pool,
        /// For the approvals feed's connection of its own.
        config: tokio_postgres::Config,
        /// Round trips to the server: statements (and their preparing, once per
        /// connection), `BEGIN`s and `COMMIT`s.
        round_trips: AtomicU64,
    },
}

/// The pool size when `[store] pool_size` is unset: enough for every worker thread to have
/// a few calls in flight.
pub fn default_pool_size() -> usize {
    std::thread::available_parallelism().map_or(4, |n| (4 * n.get()).max(4))
}

impl Db {
    pub fn sqlite(conn: rusqlite::Connection) -> Db {
        Db::Sqlite(tokio::sync::Mutex::new(conn))
    }

    /// A PostgreSQL database by URL (`postgres://user@host:port/db`), with the password
    /// given apart from the URL, and a pool of `pool_size` connections. Connects at once, so
    /// a wrong URL fails the start.
    pub async fn postgres(
        url: &str,
        password: Option<&str>,
        pool_size: usize,
    ) -> Result<Db, StoreError> {
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e: tokio_postgres::Error| StoreError::Setup(format!("store.url: {e}")))?;
        if let Some(p) = password {
            config.password(p);
        }
        config
            .connect_timeout(PG_TIMEOUT)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(10))
            .options(format!(
                "-c statement_timeout={} -c lock_timeout={}",
                PG_TIMEOUT.as_millis(),
                PG_TIMEOUT.as_millis()
            ))
            .application_name("turnstile");
        let manager = deadpool_postgres::Manager::from_config(
            config.clone(),
            tokio_postgres::NoTls,
            deadpool_postgres::ManagerConfig {
                // A closed connection is replaced at checkout; an open one is trusted
                // (a probe per checkout would double every lookup's round trips).
                recycling_method: deadpool_postgres::RecyclingMethod::Fast,
            },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(pool_size.max(1))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(PG_TIMEOUT))
            .create_timeout(Some(PG_TIMEOUT))
            .recycle_timeout(Some(PG_TIMEOUT))
            .build()
            .map_err(|e| StoreError::Setup(format!("store pool: {e}")))?;
        drop(pool.get().await?);
        Ok(Db::Postgres {
            pool,
            config,
            round_trips: AtomicU64::new(0),
        })
    }

    /// A connection of its own for LISTEN, on PostgreSQL.
    pub fn listener(&self) -> Option<super::feed::ApprovalFeed> {
        match self {
            Db::Postgres { config, .. } => Some(super::feed::ApprovalFeed::new(config.clone())),
            Db::Sqlite(_) => None,
        }
    }

    pub fn engine(&self) -> Engine {
        match self {
            Db::Sqlite(_) => Engine::Sqlite,
            Db::Postgres { .. } => Engine::Postgres,
        }
    }

    pub fn round_trips(&self) -> u64 {
        match self {
            Db::Sqlite(_) => 0,
            Db::Postgres { round_trips, .. } => round_trips.load(Ordering::Relaxed),
        }
    }

    /// Runs `f` in one transaction, committed when it returns `Ok`, rolled back otherwise
    /// (and when the call is dropped half way).
    pub async fn tx<T>(
        &self,
        f: impl AsyncFnOnce(&mut Tx<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match self {
            Db::Sqlite(conn) => sqlite_tx(conn, f).await,
            Db::Postgres {
                pool, round_trips, ..
            } => {
                let mut client = pool.get().await?;
                let tx = client.transaction().await?;
                let v = f(&mut Tx::PgTransaction(&tx, round_trips)).await?;
                tx.commit().await?;
                round_trips.fetch_add(2, Ordering::Relaxed);
                Ok(v)
            }
        }
    }

    /// Runs reads in `f`: on PostgreSQL each statement on its own (no `BEGIN`/`COMMIT`
    /// round trips), so a lookup of one record costs one round trip per statement. Also for
    /// a write that is one statement, atomic by itself.
    pub async fn read<T>(
        &self,
        f: impl AsyncFnOnce(&mut Tx<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match self {
            Db::Sqlite(conn) => sqlite_tx(conn, f).await,
            Db::Postgres {
                pool, round_trips, ..
            } => {
                let client = pool.get().await?;
                f(&mut Tx::Pg(&client, round_trips)).await
            }
        }
    }
}

async fn sqlite_tx<T>(
    conn: &tokio::sync::Mutex<rusqlite::Connection>,
    f: impl AsyncFnOnce(&mut Tx<'_>) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let mut conn = conn.lock().await;
    // A call dropped half way (its statements never wait, so only a panic does it) left its
    // transaction open: it never committed, so it is rolled back here.
    if !conn.is_autocommit() {
        conn.execute_batch("ROLLBACK")?;
    }
    conn.execute_batch("BEGIN")?;
    match f(&mut Tx::Sqlite(&mut conn)).await {
        Ok(v) => {
            conn.execute_batch("COMMIT")?;
            Ok(v)
        }
        Err(e) => {
            // The statement's error is the one to report; a transaction the rollback leaves
            // open is rolled back at the next call.
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}
