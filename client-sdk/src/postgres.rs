//! Fenced transactions in your own PostgreSQL (cargo feature `postgres`).
//!
//! [`install`] runs `palisade_fence.sql` (the one copy, shared with the
//! Python SDK): a `palisade` schema whose function `palisade.fence(lease,
//! proof)`, called inside a transaction with the lease's JWT, checks the
//! JWT's signature against the cluster's keys ([`set_keys`]), refuses a
//! token below the lease's fence (SQLSTATE `PF001`) and otherwise raises the
//! fence to it in that transaction, so the fence and the transaction's
//! writes commit or roll back together. [`crate::Lease::fenced_transaction`]
//! begins such a transaction with a held lease's JWT; [`fence`] is the plain
//! call for code that runs its own transactions. [`guard`] and
//! [`guard_table`] make a table refuse writes (`PF002`) from transactions
//! that did not fence. Nothing in the schema is callable by another role
//! until [`allow`] (or, for the unverified mode, [`trust`]).
//!
//! Errors: a stale token is [`Error::Fenced`] (its `fence` is 0: the
//! database does not tell it); a bad lease name or token
//! [`Error::BadRequest`] (refused before anything is sent); a refused proof
//! [`Error::Unauthorized`]; any other error the database answers is
//! [`Error::Database`]; a connection that failed is [`Error::Unavailable`].
//! After an error inside a transaction, roll it back.

use std::time::Duration;

pub use tokio_postgres;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client as PgClient, Transaction};

use crate::error::Error;

/// The text of `palisade_fence.sql`: one idempotent, versioned DO
/// statement (for a migration tool or `psql -f`).
pub const SQL: &str = include_str!("../python/src/palisade/sql/palisade_fence.sql");

/// The schema version [`SQL`] installs.
pub const SCHEMA_VERSION: i32 = 3;

/// `PF001`: the token is below the lease's fence (another holder took over).
pub const STALE_TOKEN: &str = "PF001";
/// `PF002`: a write to a guarded table from a transaction that did not fence.
pub const UNFENCED_WRITE: &str = "PF002";
/// `PF003`: an invalid lease name.
pub const INVALID_LEASE: &str = "PF003";
/// `PF004`: an invalid token.
pub const INVALID_TOKEN: &str = "PF004";
/// `PF005`: under REPEATABLE READ/SERIALIZABLE the fence was raised after
/// this transaction's snapshot; roll back and retry.
pub const FENCE_RACED: &str = "PF005";
/// `PF006`: the database holds a newer fence schema than [`SQL`].
pub const SCHEMA_TOO_NEW: &str = "PF006";
/// `PF007`: the proof (the lease's JWT) is refused: malformed, a bad
/// signature, a key the database does not trust (run [`set_keys`] after a
/// rotation), another lease's, or expired.
pub const PROOF_REFUSED: &str = "PF007";

/// Installs the fence schema (or leaves it alone when this version is
/// there); answers its version. One statement, atomic on its own.
///
/// # Errors
/// [`Error::Database`] (`PF006` when the database holds a newer version:
/// nothing was changed), [`Error::Unavailable`].
pub async fn install(client: &PgClient) -> Result<i32, Error> {
    client.batch_execute(SQL).await.map_err(database)?;
    Ok(SCHEMA_VERSION)
}

/// The fence schema version installed in the database, `None` if none.
///
/// # Errors
/// [`Error::Database`], [`Error::Unavailable`].
pub async fn installed_version(client: &PgClient) -> Result<Option<i32>, Error> {
    let row = client
        .query_one(
            "SELECT CASE WHEN pg_catalog.to_regclass('palisade.version') IS NULL THEN NULL \
             ELSE (SELECT version FROM palisade.version WHERE part = 'fence') END",
            &[],
        )
        .await
        .map_err(database)?;
    row.try_get(0).map_err(database)
}

/// Makes `table` (a name as SQL's `regclass` reads it: `orders`,
/// `app.orders`, `"Orders"`) refuse writes (`PF002`) from transactions that
/// did not call `palisade.fence` for the lease in the row's `lease_column`
/// (checked on the new row and on the old one; TRUNCATE is refused).
/// Replaces an earlier guard of the table.
///
/// # Errors
/// [`Error::Database`] (an unknown table or column), [`Error::Unavailable`].
pub async fn guard(client: &PgClient, table: &str, lease_column: &str) -> Result<(), Error> {
    client
        .execute(
            "SELECT palisade.guard($1::text::regclass, $2)",
            &[&table, &lease_column],
        )
        .await
        .map_err(database)?;
    Ok(())
}

/// Makes every write to `table` need a transaction that fenced `lease`.
///
/// # Errors
/// [`Error::BadRequest`] for a bad lease name (nothing sent); as [`guard`].
pub async fn guard_table(client: &PgClient, table: &str, lease: &str) -> Result<(), Error> {
    check_lease(lease)?;
    client
        .execute(
            "SELECT palisade.guard_table($1::text::regclass, $2)",
            &[&table, &lease],
        )
        .await
        .map_err(database)?;
    Ok(())
}

/// Removes the guard of `table` (if any).
///
/// # Errors
/// As [`guard`].
pub async fn unguard(client: &PgClient, table: &str) -> Result<(), Error> {
    client
        .execute("SELECT palisade.unguard($1::text::regclass)", &[&table])
        .await
        .map_err(database)?;
    Ok(())
}

/// Installs the cluster's signing keys (its JWKS, as `GET /v1/jwks` answers
/// it, e.g. [`crate::Client::jwks`]) as the keys proofs are checked against;
/// keys missing from it are retired, with the proofs they signed. Run it
/// after installing and after every key rotation or retirement (`palisade
/// sql keys` does; `--follow` keeps doing it). A set older than the one
/// installed (a lower `applied_index`) changes nothing. Answers the number
/// of keys installed (0 when the set was older). The schema's owner only.
///
/// # Errors
/// [`Error::Database`] (not a JWKS of Ed25519 keys), [`Error::Unavailable`].
pub async fn set_keys(client: &PgClient, jwks: &serde_json::Value) -> Result<i32, Error> {
    let text = jwks.to_string();
    let row = client
        .query_one("SELECT palisade.set_keys($1::text::jsonb)", &[&text])
        .await
        .map_err(database)?;
    row.try_get(0).map_err(database)
}

/// Lets `role` fence with proof (`palisade.fence`, `palisade.prove`):
/// nothing in the schema is callable by other roles until then. The
/// schema's owner only.
///
/// # Errors
/// [`Error::Database`] (no such role), [`Error::Unavailable`].
pub async fn allow(client: &PgClient, role: &str) -> Result<(), Error> {
    client
        .execute("SELECT palisade.allow($1)", &[&role])
        .await
        .map_err(database)?;
    Ok(())
}

/// Lets `role` also call `palisade.fence_unverified`, which believes any
/// token: a role trusted this way can write past any guard and raise any
/// fence. Only for roles trusted as much as the cluster.
///
/// # Errors
/// As [`allow`].
pub async fn trust(client: &PgClient, role: &str) -> Result<(), Error> {
    client
        .execute("SELECT palisade.trust($1)", &[&role])
        .await
        .map_err(database)?;
    Ok(())
}

/// `SELECT palisade.prove(proof)`: checks the JWT's signature and caches it
/// in the database (committed at once when `client` is not in a
/// transaction), so `palisade.fence` with it costs a hash and a lookup
/// instead of a signature check (~20 ms of the database's CPU). Answers its
/// token. [`crate::Lease::fenced_transaction`] does this once per JWT.
///
/// # Errors
/// [`Error::Unauthorized`] when the proof is refused (`PF007`);
/// [`Error::Database`], [`Error::Unavailable`].
pub async fn prove(client: &PgClient, proof: &str) -> Result<u64, Error> {
    let row = client
        .query_one("SELECT palisade.prove($1)", &[&proof])
        .await
        .map_err(|e| fence_error(&e, 0))?;
    let token: i64 = row.try_get(0).map_err(database)?;
    Ok(u64::try_from(token).unwrap_or(0))
}

/// `SELECT palisade.fence(lease, proof)` in `tx`, for code that runs its
/// own transactions: call it first in the transaction, before its writes,
/// with the lease's JWT ([`crate::Lease::jwt`]). Answers the token.
///
/// # Errors
/// [`Error::Fenced`] when the token is below the fence (another holder took
/// over: stop acting as leader); [`Error::Unauthorized`] when the proof is
/// refused (`PF007`); [`Error::BadRequest`] for a bad lease name (nothing
/// sent); [`Error::Database`] (`PF005`: retry the transaction);
/// [`Error::Unavailable`]. After an error, roll `tx` back.
pub async fn fence(tx: &Transaction<'_>, lease: &str, proof: &str) -> Result<u64, Error> {
    check_lease(lease)?;
    call_fence(tx, lease, Proof::Jwt(proof), None).await
}

/// `SELECT palisade.fence_unverified(lease, token)` in `tx`: the fence
/// without proof, for a role the database trusts ([`trust`]). As [`fence`]
/// otherwise.
///
/// # Errors
/// As [`fence`]; [`Error::Database`] (`42501`) for a role not trusted.
pub async fn fence_unverified(tx: &Transaction<'_>, lease: &str, token: u64) -> Result<u64, Error> {
    check(lease, token)?;
    call_fence(tx, lease, Proof::Trusted(token), None).await
}

/// What a fence call carries: the lease's JWT, or a bare token (the
/// unverified mode).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Proof<'a> {
    Jwt(&'a str),
    Trusted(u64),
}

/// Checks `lease` and `token` as `palisade.fence` would, locally.
pub(crate) fn check(lease: &str, token: u64) -> Result<i64, Error> {
    check_lease(lease)?;
    match i64::try_from(token) {
        Ok(token) if token >= 1 => Ok(token),
        _ => Err(Error::BadRequest(format!(
            "invalid fencing token {token}: an integer in 1..={}",
            i64::MAX
        ))),
    }
}

fn check_lease(lease: &str) -> Result<(), Error> {
    palisade_names::LeaseName::new(lease)
        .map(drop)
        .map_err(|e| Error::BadRequest(format!("invalid lease name {lease:?}: {e}")))
}

/// `palisade.fence(lease, proof)` (or `fence_unverified`) in `tx`; with
/// `idle` also the transaction's `idle_in_transaction_session_timeout`
/// (SET LOCAL), in the same statement (one round trip). `token` names the
/// token in errors.
pub(crate) async fn call_fence(
    tx: &Transaction<'_>,
    lease: &str,
    proof: Proof<'_>,
    idle: Option<Duration>,
) -> Result<u64, Error> {
    let idle_ms = idle.map(|idle| idle.as_millis().max(1).to_string());
    let set_idle = ", pg_catalog.set_config('idle_in_transaction_session_timeout', $3, true)";
    let tail = if idle_ms.is_some() { set_idle } else { "" };
    // The proof and the function that checks it; one call either way.
    let (function, token, value): (&str, u64, Box<dyn ToSql + Sync + Send>) = match proof {
        Proof::Jwt(jwt) => ("fence", 0, Box::new(jwt.to_owned())),
        Proof::Trusted(token) => ("fence_unverified", token, Box::new(check(lease, token)?)),
    };
    let sql = format!("SELECT palisade.{function}($1, $2){tail}");
    let answered = match &idle_ms {
        Some(ms) => tx.query_one(&sql, &[&lease, &*value, ms]).await,
        None => tx.query_one(&sql, &[&lease, &*value]).await,
    };
    let row = answered.map_err(|e| fence_error(&e, token))?;
    let fenced: i64 = row.try_get(0).map_err(database)?;
    Ok(u64::try_from(fenced).unwrap_or(0))
}

/// The SDK error for a failed call of `palisade.fence` (or `prove`) with
/// `token` (0: read it from the refusal).
pub fn fence_error(err: &tokio_postgres::Error, token: u64) -> Error {
    let Some(db) = err.as_db_error() else {
        return database_ref(err);
    };
    match db.code().code() {
        STALE_TOKEN => Error::Fenced {
            token: if token == 0 {
                detail_number(db.detail().unwrap_or(""), "token")
            } else {
                token
            },
            fence: detail_number(db.detail().unwrap_or(""), "fence"),
        },
        PROOF_REFUSED => Error::Unauthorized(format!("postgres: {}", db.message())),
        INVALID_LEASE | INVALID_TOKEN => Error::BadRequest(db.message().to_owned()),
        _ => database_ref(err),
    }
}

/// The `name=N` of a refusal's DETAIL (`lease=L token=T`); 0 when absent
/// (schema 2 never tells the fence).
fn detail_number(detail: &str, name: &str) -> u64 {
    detail
        .split_whitespace()
        .find_map(|part| part.strip_prefix(name)?.strip_prefix('='))
        .and_then(|f| f.parse().ok())
        .unwrap_or(0)
}

/// A driver error as an SDK error: what the database answered is
/// [`Error::Database`] (one line: SQLSTATE, message, detail, hint); a
/// connection that failed is [`Error::Unavailable`].
pub fn database(err: tokio_postgres::Error) -> Error {
    database_ref(&err)
}

fn database_ref(err: &tokio_postgres::Error) -> Error {
    let Some(db) = err.as_db_error() else {
        return Error::Unavailable {
            attempts: 1,
            elapsed: Duration::ZERO,
            last: format!("postgres: {}", chain(err)),
        };
    };
    let mut line = format!("{} {}", db.code().code(), db.message());
    if let Some(detail) = db.detail() {
        line.push_str(&format!(" (detail: {detail})"));
    }
    if let Some(hint) = db.hint() {
        line.push_str(&format!(" (hint: {hint})"));
    }
    Error::Database(line.replace('\n', " "))
}

/// `err` and its sources on one line.
fn chain(err: &dyn std::error::Error) -> String {
    let mut line = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        line.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    line.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_names_and_tokens_are_refused_locally() {
        assert!(check("orders", 1).is_ok());
        assert!(matches!(check("a b", 1), Err(Error::BadRequest(_))));
        assert!(matches!(check("..", 1), Err(Error::BadRequest(_))));
        assert!(matches!(check("", 1), Err(Error::BadRequest(_))));
        assert!(matches!(check("orders", 0), Err(Error::BadRequest(_))));
        assert!(matches!(
            check("orders", u64::MAX),
            Err(Error::BadRequest(_))
        ));
    }

    #[test]
    fn the_fence_is_read_from_the_detail() {
        assert_eq!(detail_number("lease=a token=3 fence=7", "fence"), 7);
        assert_eq!(detail_number("lease=a token=3", "fence"), 0);
        assert_eq!(detail_number("lease=a token=3", "token"), 3);
        assert_eq!(detail_number("lease=a tokens=3", "token"), 0);
    }
}
