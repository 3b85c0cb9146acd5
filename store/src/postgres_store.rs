//! [`FencedStore`] on PostgreSQL, for many gateways sharing one database.
//!
//! Each write is one statement calling a function of the gateway's schema
//! (`postgres_store/schema.rs`): it takes the lease's lock (shared for a
//! write of the current fence, exclusive for a raise), compares, raises and
//! writes, and commits with `synchronous_commit = on` before the answer
//! comes back. A PUT first tries the holder's path (`put_held`: the token is
//! the fence); only when that wrote nothing does it send the general
//! `fenced_put`, in a transaction of its own. Two gateways' writes to one lease are ordered by that lock
//! inside the database; no lock outlives a statement, so a paused or killed
//! gateway holds none. Every wait is bounded (`config.rs`), and
//! every failure of the database is [`StoreError::Unavailable`] (a 503).

pub(crate) mod audit;
pub(crate) mod config;
mod pool;
pub use pool::connect_once;
pub(crate) mod schema;
#[cfg(test)]
pub(crate) mod test_server;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use deadpool_postgres::Pool;
use palisade_names::{FencingToken, LeaseName, ObjectKey};
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use crate::error::StoreError;
use crate::fenced_store::{
    Deleted, FencedStore, ObjectPage, ObjectSummary, Precondition, StoredObject, Written,
    MAX_LIST_PAGE,
};
use config::PostgresStoreConfig;
use pool::{database_error, Session};

const PUT_HELD: &str = "SELECT palisade_gateway.put_held($1, $2, $3, $4)";
const PUT: &str = "SELECT out_fence, out_raised, out_version \
                   FROM palisade_gateway.fenced_put($1, $2, $3, $4)";
const DELETE: &str = "SELECT out_fence, out_raised, out_existed \
                      FROM palisade_gateway.fenced_delete($1, $2, $3)";
const PUT_IF: &str = "SELECT out_fence, out_raised, out_version, out_current \
                      FROM palisade_gateway.fenced_put_if($1, $2, $3, $4, $5, $6)";
const DELETE_IF: &str = "SELECT out_fence, out_raised, out_existed, out_current \
                         FROM palisade_gateway.fenced_delete_if($1, $2, $3, $4, $5)";
const BUMP: &str = "SELECT out_fence, out_raised FROM palisade_gateway.raise_fence($1, $2)";
const UNFENCED: &str = "INSERT INTO palisade_gateway.objects AS o (key, value, version, token) \
    VALUES ($1, $2, nextval('palisade_gateway.object_versions'), $3) \
    ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, \
    version = nextval('palisade_gateway.object_versions'), token = EXCLUDED.token \
    RETURNING o.version";
const GET: &str = "SELECT value, version, token FROM palisade_gateway.objects WHERE key = $1";
const FENCE: &str = "SELECT fence FROM palisade_gateway.fences WHERE lease = $1";

/// The PostgreSQL-backed store. Cheap to clone; clones share the pool.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: Pool,
    config: Arc<PostgresStoreConfig>,
}

impl PostgresStore {
    /// Connects, creates or migrates the gateway's schema, and warns when
    /// the server does not make commits durable (`fsync = off`).
    ///
    /// # Errors
    /// [`StoreError::Engine`] for a bad configuration or a schema newer than
    /// this code; [`StoreError::Unavailable`] when the database cannot be
    /// reached.
    pub async fn connect(config: &PostgresStoreConfig) -> Result<Self, StoreError> {
        config.validate().map_err(StoreError::Engine)?;
        let store = Self {
            pool: pool::build(config)?,
            config: Arc::new(config.clone()),
        };
        let mut session = Session::take(&store.pool).await?;
        let client = session.client_mut().ok_or_else(gone)?;
        let found = schema::migrate(client).await?;
        let fsync: String = client
            .query_one("SHOW fsync", &[])
            .await
            .map_err(|e| database_error(&e))?
            .get(0);
        if fsync != "on" {
            tracing::warn!(
                "PostgreSQL runs with fsync = {fsync}: a power cut can lose acknowledged writes"
            );
        }
        session.release();
        tracing::info!(
            schema_found = found,
            schema = schema::SCHEMA_VERSION,
            "gateway store on PostgreSQL"
        );
        Ok(store)
    }

    /// Runs one prepared statement on a pooled session within the statement
    /// timeout; the session is reused only if it answered.
    pub(crate) async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let run = async {
            let session = Session::take(&self.pool).await?;
            let client = session.client().ok_or_else(gone)?;
            let statement = client
                .prepare_cached(sql)
                .await
                .map_err(|e| database_error(&e))?;
            let rows = client
                .query(&statement, params)
                .await
                .map_err(|e| database_error(&e))?;
            session.release();
            Ok(rows)
        };
        self.within_statement_timeout(run).await
    }

    /// `run`'s answer, or [`StoreError::Unavailable`] once the statement
    /// timeout has passed.
    async fn within_statement_timeout<T>(
        &self,
        run: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.config.statement_timeout, run).await {
            Ok(answer) => answer,
            Err(_) => Err(StoreError::Unavailable(format!(
                "the database did not answer within {} ms",
                self.config.statement_timeout.as_millis()
            ))),
        }
    }

    /// [`PostgresStore::query`] for at most one row.
    async fn statement(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, StoreError> {
        Ok(self.query(sql, params).await?.into_iter().next())
    }

    /// The object write of [`FencedStore::put`] without the fence: one plain
    /// upsert of the same row through the same pool and session settings.
    /// Only the benchmark that prices fencing calls it
    /// (`palisade-bench gateway-postgres`); it bypasses S1.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the database fails.
    pub async fn put_unfenced_for_benchmark(
        &self,
        key: &ObjectKey,
        value: &[u8],
        token: FencingToken,
    ) -> Result<u64, StoreError> {
        let t = sql_token(token)?;
        let params: [&(dyn ToSql + Sync); 3] = [&key.as_str(), &value, &t];
        let row = one(self.statement(UNFENCED, &params).await?)?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    /// A PUT without a precondition: the holder's path first (`put_held`),
    /// the general `fenced_put` only when that wrote nothing.
    async fn put_any(
        &self,
        key: &ObjectKey,
        value: &[u8],
        token: FencingToken,
        t: i64,
    ) -> Result<Written, StoreError> {
        let params: [&(dyn ToSql + Sync); 4] = [&key.lease().as_str(), &t, &key.as_str(), &value];
        // Both statements within one statement timeout: a PUT's bound.
        let written = self.within_statement_timeout(async {
            let held = one(self.statement(PUT_HELD, &params).await?)?;
            if let Some(version) = held.get::<_, Option<i64>>(0) {
                return Ok(version);
            }
            // Not the fence: the lease's first write, a raise, or stale.
            let row = one(self.statement(PUT, &params).await?)?;
            self.fenced(&row, token)?;
            Ok(row.get::<_, i64>(2))
        });
        Ok(Written {
            version: written.await? as u64,
            fence: token,
        })
    }

    /// The answer of a write function: accepted (the fence is the token)
    /// or refused (the fence is above it). Counts a raise.
    fn fenced(&self, row: &Row, token: FencingToken) -> Result<(), StoreError> {
        let fence = FencingToken(row.get::<_, i64>(0) as u64);
        if fence > token {
            return Err(StoreError::Stale { token, fence });
        }
        if row.get::<_, bool>(1) {
            if let Some(raised) = &self.config.hooks.on_fence_raised {
                raised();
            }
        }
        Ok(())
    }
}

/// A token as the database stores it.
fn sql_token(token: FencingToken) -> Result<i64, StoreError> {
    i64::try_from(token.0).map_err(|_| StoreError::InvalidToken(token.0))
}

fn gone() -> StoreError {
    StoreError::Unavailable("the database session was lost".into())
}

fn one(row: Option<Row>) -> Result<Row, StoreError> {
    row.ok_or_else(|| StoreError::Engine("a write function answered no row".into()))
}

impl FencedStore for PostgresStore {
    async fn put_if(
        &self,
        key: &ObjectKey,
        value: Vec<u8>,
        token: FencingToken,
        when: Precondition,
    ) -> Result<Written, StoreError> {
        let max = self.config.max_value_bytes;
        if value.len() > max {
            return Err(StoreError::ValueTooLarge {
                size: value.len(),
                max,
            });
        }
        let t = sql_token(token)?;
        let Some((want, version)) = sql_condition(when) else {
            return self.put_any(key, &value, token, t).await;
        };
        let params: [&(dyn ToSql + Sync); 6] = [
            &key.lease().as_str(),
            &t,
            &key.as_str(),
            &value,
            &want,
            &version,
        ];
        let row = one(self.statement(PUT_IF, &params).await?)?;
        self.fenced(&row, token)?;
        let written = row.get::<_, Option<i64>>(2).ok_or_else(|| unmet(&row))?;
        Ok(Written {
            version: written as u64,
            fence: token,
        })
    }

    async fn delete_if(
        &self,
        key: &ObjectKey,
        token: FencingToken,
        when: Precondition,
    ) -> Result<Deleted, StoreError> {
        let t = sql_token(token)?;
        let row = match sql_condition(when) {
            None => {
                let params: [&(dyn ToSql + Sync); 3] = [&key.lease().as_str(), &t, &key.as_str()];
                let row = one(self.statement(DELETE, &params).await?)?;
                self.fenced(&row, token)?;
                row
            }
            Some((want, version)) => {
                let params: [&(dyn ToSql + Sync); 5] =
                    [&key.lease().as_str(), &t, &key.as_str(), &want, &version];
                let row = one(self.statement(DELETE_IF, &params).await?)?;
                self.fenced(&row, token)?;
                if !row.get::<_, bool>(2) {
                    return Err(unmet(&row));
                }
                row
            }
        };
        Ok(Deleted {
            existed: row.get(2),
            fence: token,
        })
    }

    async fn bump_fence(
        &self,
        lease: &LeaseName,
        token: FencingToken,
    ) -> Result<FencingToken, StoreError> {
        let t = sql_token(token)?;
        let params: [&(dyn ToSql + Sync); 2] = [&lease.as_str(), &t];
        let row = one(self.statement(BUMP, &params).await?)?;
        self.fenced(&row, token)?;
        Ok(token)
    }

    async fn get(&self, key: &ObjectKey) -> Result<Option<StoredObject>, StoreError> {
        let row = self.statement(GET, &[&key.as_str()]).await?;
        Ok(row.map(|row| StoredObject {
            value: row.get(0),
            version: row.get::<_, i64>(1) as u64,
            token: FencingToken(row.get::<_, i64>(2) as u64),
        }))
    }

    async fn fence(&self, lease: &LeaseName) -> Result<FencingToken, StoreError> {
        let row = self.statement(FENCE, &[&lease.as_str()]).await?;
        Ok(FencingToken(row.map_or(0, |r| r.get::<_, i64>(0)) as u64))
    }

    async fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<ObjectPage, StoreError> {
        let limit = limit.min(MAX_LIST_PAGE);
        let (sql, start, end) = list_statement(prefix, after);
        // One row more than the page: whether more follow.
        let rows_wanted = limit as i64 + 1;
        let rows = match &end {
            Some(end) => self.query(&sql, &[&start, end, &rows_wanted]).await?,
            None => self.query(&sql, &[&start, &rows_wanted]).await?,
        };
        let mut objects: Vec<ObjectSummary> = rows
            .iter()
            .map(|row| ObjectSummary {
                key: row.get(0),
                version: row.get::<_, i64>(1) as u64,
                token: FencingToken(row.get::<_, i64>(2) as u64),
                size: row.get::<_, i32>(3) as u64,
            })
            .filter(|object| object.key.starts_with(prefix))
            .collect();
        let more = objects.len() > limit;
        objects.truncate(limit);
        Ok(ObjectPage { objects, more })
    }
}

/// A listing's statement (one range scan of `objects_key_bytes`, in byte
/// order) and its bounds: from `prefix` (or after `after`), below the
/// first string past every key with the prefix when there is one.
fn list_statement(prefix: &str, after: Option<&str>) -> (String, String, Option<String>) {
    let (from, start) = match crate::memory_store::list_start(prefix, after) {
        std::ops::Bound::Excluded(after) => (">", after.to_owned()),
        _ => (">=", prefix.to_owned()),
    };
    let end = successor(prefix);
    let upper = if end.is_some() {
        " AND key COLLATE \"C\" < $2"
    } else {
        ""
    };
    let limit = if end.is_some() { "$3" } else { "$2" };
    let sql = format!(
        "SELECT key, version, token, octet_length(value) FROM palisade_gateway.objects \
         WHERE key COLLATE \"C\" {from} $1{upper} ORDER BY key COLLATE \"C\" LIMIT {limit}"
    );
    (sql, start, end)
}

/// The least string above every string that starts with `prefix`: its last
/// character that can grow, grown by one code point (none for an empty
/// prefix or one of `char::MAX` alone).
fn successor(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = (u32::from(last) + 1..=u32::from(char::MAX)).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// A precondition as the conditional write functions take it (`p_want`,
/// `p_version`); `None` for no precondition.
/// A version past `i64` matches no row (versions come from a sequence).
fn sql_condition(when: Precondition) -> Option<(i16, Option<i64>)> {
    match when {
        Precondition::Any => None,
        Precondition::Version(v) => Some((1, Some(i64::try_from(v).unwrap_or(-1)))),
        Precondition::Exists => Some((2, None)),
        Precondition::Absent => Some((3, None)),
    }
}

/// The refusal of a conditional write whose condition failed (column 3:
/// the object's version, NULL when there is none).
fn unmet(row: &Row) -> StoreError {
    StoreError::PreconditionFailed {
        current: row.get::<_, Option<i64>>(3).map(|v| v as u64),
    }
}
