//! The two database engines behind the one store interface: embedded SQLite (the default) and
//! PostgreSQL (shared by replicas). The store writes its statements once, in the dialect both
//! accept (`?N` parameters, `ON CONFLICT`, `RETURNING`); this module binds neutral values,
//! reads neutral rows, runs every closure in one transaction and rewrites `?N` as `$N` for
//! PostgreSQL.
//!
//! Each engine has one connection under a lock that is never held across an `.await`. The
//! PostgreSQL client is synchronous; inside the multi-threaded runtime its calls run in
//! `block_in_place`, so a worker that waits on the network hands its other tasks off. A broken
//! connection is dropped and opened again on the next call, so a database that comes back is
//! used again without a restart.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::Duration;

use postgres::types::{to_sql_checked, IsNull, ToSql, Type};
use rusqlite::types::{ToSqlOutput, ValueRef};

use super::StoreError;

/// A parameter.
#[derive(Debug, Clone, Copy)]
pub(super) enum Val<'a> {
    I(i64),
    T(&'a str),
    B(&'a [u8]),
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

/// One transaction on either engine.
pub(super) trait Tx {
    /// Runs one statement; the number of rows it changed.
    fn exec(&mut self, sql: &str, p: &[Val<'_>]) -> Result<u64, StoreError>;
    /// Runs one query (or a statement with `RETURNING`).
    fn rows(&mut self, sql: &str, p: &[Val<'_>]) -> Result<Vec<Row>, StoreError>;
    /// Runs statements without parameters (migrations).
    fn batch(&mut self, sql: &str) -> Result<(), StoreError>;
    fn engine(&self) -> Engine;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Engine {
    Sqlite,
    Postgres,
}

impl Tx for rusqlite::Transaction<'_> {
    fn exec(&mut self, sql: &str, p: &[Val<'_>]) -> Result<u64, StoreError> {
        Ok(self
            .prepare_cached(sql)?
            .execute(rusqlite::params_from_iter(p))? as u64)
    }

    fn rows(&mut self, sql: &str, p: &[Val<'_>]) -> Result<Vec<Row>, StoreError> {
        let mut stmt = self.prepare_cached(sql)?;
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

    fn batch(&mut self, sql: &str) -> Result<(), StoreError> {
        Ok(self.execute_batch(sql)?)
    }

    fn engine(&self) -> Engine {
        Engine::Sqlite
    }
}

/// `?N` -> `$N` (the statements never hold a `?` elsewhere).
fn dollar(sql: &str) -> String {
    sql.replace('?', "$")
}

/// Statements on a PostgreSQL connection: inside a transaction, or (reads) on their own.
struct PgTx<'a, C> {
    tx: &'a mut C,
    statements: &'a mut HashMap<String, postgres::Statement>,
}

impl<C: postgres::GenericClient> PgTx<'_, C> {
    fn statement(&mut self, sql: &str) -> Result<postgres::Statement, StoreError> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let s = self.tx.prepare(&dollar(sql))?;
        self.statements.insert(sql.to_string(), s.clone());
        Ok(s)
    }

    fn params<'v>(p: &'v [Val<'v>]) -> Vec<&'v (dyn ToSql + Sync)> {
        p.iter().map(|v| v as &(dyn ToSql + Sync)).collect()
    }
}

impl<C: postgres::GenericClient> Tx for PgTx<'_, C> {
    fn exec(&mut self, sql: &str, p: &[Val<'_>]) -> Result<u64, StoreError> {
        let s = self.statement(sql)?;
        Ok(self.tx.execute(&s, &Self::params(p))?)
    }

    fn rows(&mut self, sql: &str, p: &[Val<'_>]) -> Result<Vec<Row>, StoreError> {
        let s = self.statement(sql)?;
        let rows = self.tx.query(&s, &Self::params(p))?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
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
            out.push(Row(cells));
        }
        Ok(out)
    }

    fn batch(&mut self, sql: &str) -> Result<(), StoreError> {
        Ok(self.tx.batch_execute(sql)?)
    }

    fn engine(&self) -> Engine {
        Engine::Postgres
    }
}

impl From<postgres::Error> for StoreError {
    fn from(e: postgres::Error) -> Self {
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

/// A PostgreSQL connection, opened on first use and again after it broke.
pub(super) struct Pg {
    config: postgres::Config,
    client: Option<postgres::Client>,
    statements: HashMap<String, postgres::Statement>,
}

/// How long connecting, and any one statement, may take before the store reads as down.
const PG_TIMEOUT: Duration = Duration::from_secs(5);

impl Pg {
    /// The connection, opened (again) if there is none or it broke; with the statement
    /// cache that belongs to it.
    fn client(
        &mut self,
    ) -> Result<
        (
            &mut postgres::Client,
            &mut HashMap<String, postgres::Statement>,
        ),
        StoreError,
    > {
        if self.client.as_ref().is_some_and(|c| c.is_closed()) {
            self.client = None;
        }
        if self.client.is_none() {
            self.statements.clear();
            self.client = Some(self.config.connect(postgres::NoTls)?);
        }
        let client = self.client.as_mut().expect("connected above");
        Ok((client, &mut self.statements))
    }
}

impl Drop for Pg {
    /// Closing the connection is a round trip too: off the async workers like the rest.
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            blocking(move || drop(client));
        }
    }
}

pub(super) enum Db {
    Sqlite(Mutex<rusqlite::Connection>),
    Postgres(Box<Mutex<Pg>>),
}

/// Runs blocking database work from wherever the caller is: off the async workers'
/// schedule inside the multi-threaded runtime, on a scoped thread inside a single-threaded
/// one (where `block_in_place` is not allowed), directly outside any runtime.
pub(super) fn blocking<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        Ok(_) => std::thread::scope(|s| s.spawn(f).join().expect("store thread panicked")),
        Err(_) => f(),
    }
}

impl Db {
    pub fn sqlite(conn: rusqlite::Connection) -> Db {
        Db::Sqlite(Mutex::new(conn))
    }

    /// A PostgreSQL database by URL (`postgres://user@host:port/db`), with the password
    /// given apart from the URL. Connects at once, so a wrong URL fails the start.
    pub fn postgres(url: &str, password: Option<&str>) -> Result<Db, StoreError> {
        let mut config: postgres::Config = url
            .parse()
            .map_err(|e: postgres::Error| StoreError::Setup(format!("store.url: {e}")))?;
        if let Some(p) = password {
            config.password(p);
        }
        config
            .connect_timeout(PG_TIMEOUT)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(10))
            .options(&format!(
                "-c statement_timeout={} -c lock_timeout={}",
                PG_TIMEOUT.as_millis(),
                PG_TIMEOUT.as_millis()
            ))
            .application_name("turnstile");
        let mut pg = Pg {
            config,
            client: None,
            statements: HashMap::new(),
        };
        blocking(|| pg.client().map(|_| ()))?;
        Ok(Db::Postgres(Box::new(Mutex::new(pg))))
    }

    /// A connection of its own for LISTEN, on PostgreSQL.
    pub fn listener(&self) -> Option<super::feed::ApprovalFeed> {
        match self {
            Db::Postgres(pg) => Some(super::feed::ApprovalFeed::new(pg.lock().config.clone())),
            Db::Sqlite(_) => None,
        }
    }

    pub fn engine(&self) -> Engine {
        match self {
            Db::Sqlite(_) => Engine::Sqlite,
            Db::Postgres(_) => Engine::Postgres,
        }
    }

    /// Runs `f` in one transaction, committed when it returns `Ok`.
    pub fn tx<T: Send>(
        &self,
        f: impl FnOnce(&mut dyn Tx) -> Result<T, StoreError> + Send,
    ) -> Result<T, StoreError> {
        self.run(true, f)
    }

    /// Runs reads in `f`: on PostgreSQL each statement on its own (no `BEGIN`/`COMMIT`
    /// round trips), so a lookup of one record costs one round trip per statement.
    pub fn read<T: Send>(
        &self,
        f: impl FnOnce(&mut dyn Tx) -> Result<T, StoreError> + Send,
    ) -> Result<T, StoreError> {
        self.run(false, f)
    }

    fn run<T: Send>(
        &self,
        transaction: bool,
        f: impl FnOnce(&mut dyn Tx) -> Result<T, StoreError> + Send,
    ) -> Result<T, StoreError> {
        match self {
            Db::Sqlite(conn) => {
                let mut conn = conn.lock();
                let mut tx = conn.transaction()?;
                let out = f(&mut tx)?;
                tx.commit()?;
                Ok(out)
            }
            Db::Postgres(pg) => blocking(|| {
                let mut pg = pg.lock();
                let out = (|| {
                    let (client, statements) = pg.client()?;
                    if !transaction {
                        return f(&mut PgTx {
                            tx: client,
                            statements,
                        });
                    }
                    let mut tx = client.transaction()?;
                    let v = f(&mut PgTx {
                        tx: &mut tx,
                        statements,
                    })?;
                    tx.commit()?;
                    Ok(v)
                })();
                if out.is_err() && pg.client.as_ref().is_some_and(|c| c.is_closed()) {
                    pg.client = None;
                }
                out
            }),
        }
    }
}
