//! The gateway's tables in PostgreSQL, versioned: [`migrate`] brings a
//! database up to [`SCHEMA_VERSION`] and refuses one that is newer.
//!
//! Everything lives in the schema `palisade_gateway`, apart from the user's
//! own tables and from the `palisade` schema of fenced transactions
//! (`palisade sql`). Each write is one call of a function defined here, so
//! the fence check, the fence raise and the object write are one statement
//! in one transaction, and no lock is ever held across a round trip to the
//! gateway (a paused gateway holds none).

use tokio_postgres::Client;

use crate::error::StoreError;

/// The newest schema this code knows. A database at a higher version was
/// migrated by a newer gateway: this one refuses to start on it.
pub const SCHEMA_VERSION: i32 = 3;

/// Serializes migrations of concurrent gateways (an advisory lock key:
/// "palisade" in ASCII).
const MIGRATION_LOCK: i64 = 0x7061_6c69_7361_6465;

/// What every version needs before its migration runs.
const BOOTSTRAP: &str = "
CREATE SCHEMA IF NOT EXISTS palisade_gateway;
CREATE TABLE IF NOT EXISTS palisade_gateway.schema_version (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    version integer NOT NULL
);";

/// The first key of the advisory locks on leases (`raise_fence`), apart
/// from any other use of advisory locks in the database ("fenc" in ASCII).
pub const LEASE_LOCK_CLASS: i32 = 0x6665_6e63;

/// Migration `i` takes the schema from version `i` to `i + 1`.
const MIGRATIONS: [&str; SCHEMA_VERSION as usize] = [V1, V2, V3];

/// Version 1: fences, objects, the shared fencing audit and the write
/// functions.
///
/// `raise_fence` serializes a lease's writes with an advisory lock on the
/// lease (class `LEASE_LOCK_CLASS`, key `hashtext(lease)`; held to the end of
/// the transaction, never written to the WAL): a write carrying the lease's
/// current fence takes it shared — writers of one holder run side by side —
/// and a write that raises the fence (or makes the lease's first row) takes
/// it exclusive, so it waits for every write of the older token to commit and
/// no write of the older token starts until it has. After the lock it reads
/// the fence again with a fresh snapshot (READ COMMITTED, one per statement),
/// which holds every commit of an earlier exclusive holder. A fence above the
/// token refuses at once: fences never go down. Its answer: the fence after
/// the call (above the token: refused) and whether it rose. The writes call
/// it first and write only when it accepted; a delete's fresh snapshot sees
/// the objects committed before its lock. An object's version is drawn
/// after its row is locked (`DO UPDATE SET version = nextval`): per key,
/// versions follow the commit order, and a raise's writes get higher
/// versions than every write of the tokens below it.
const V1: &str = "
CREATE TABLE palisade_gateway.fences (
    lease text PRIMARY KEY,
    fence bigint NOT NULL CHECK (fence >= 0)
) WITH (fillfactor = 70);
CREATE TABLE palisade_gateway.objects (
    key text PRIMARY KEY,
    value bytea NOT NULL,
    version bigint NOT NULL,
    token bigint NOT NULL
) WITH (fillfactor = 80);
CREATE SEQUENCE palisade_gateway.object_versions;
CREATE TABLE palisade_gateway.refusals (
    lease text PRIMARY KEY,
    count bigint NOT NULL,
    token bigint NOT NULL,
    fence bigint NOT NULL,
    holder text NOT NULL,
    key text NOT NULL,
    peer text,
    at_unix_ms bigint NOT NULL
);
CREATE INDEX refusals_recent ON palisade_gateway.refusals (at_unix_ms DESC);

CREATE FUNCTION palisade_gateway.raise_fence(p_lease text, p_token bigint,
    OUT out_fence bigint, OUT out_raised boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_seen bigint;
    v_key integer := hashtext(p_lease);
BEGIN
    out_raised := false;
    SELECT f.fence INTO v_seen FROM palisade_gateway.fences f WHERE f.lease = p_lease;
    IF v_seen > p_token THEN
        out_fence := v_seen;
        RETURN;
    END IF;
    IF v_seen = p_token THEN
        PERFORM pg_advisory_xact_lock_shared(LEASE_LOCK_CLASS, v_key);
        SELECT f.fence INTO out_fence FROM palisade_gateway.fences f WHERE f.lease = p_lease;
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(LEASE_LOCK_CLASS, v_key);
    SELECT f.fence INTO v_seen FROM palisade_gateway.fences f WHERE f.lease = p_lease;
    IF NOT FOUND THEN
        INSERT INTO palisade_gateway.fences (lease, fence) VALUES (p_lease, p_token);
        out_fence := p_token;
        out_raised := true;
    ELSIF v_seen < p_token THEN
        UPDATE palisade_gateway.fences SET fence = p_token WHERE lease = p_lease;
        out_fence := p_token;
        out_raised := true;
    ELSE
        out_fence := v_seen;
    END IF;
END $$;

CREATE FUNCTION palisade_gateway.fenced_put(p_lease text, p_token bigint, p_key text,
    p_value bytea, OUT out_fence bigint, OUT out_raised boolean, OUT out_version bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_seen bigint;
BEGIN
    out_raised := false;
    SELECT f.fence INTO v_seen FROM palisade_gateway.fences f WHERE f.lease = p_lease;
    IF v_seen = p_token THEN
        -- The common case, inlined: the holder writes again with the fence.
        PERFORM pg_advisory_xact_lock_shared(LEASE_LOCK_CLASS, hashtext(p_lease));
        INSERT INTO palisade_gateway.objects AS o (key, value, version, token)
            SELECT p_key, p_value, nextval('palisade_gateway.object_versions'), p_token
            WHERE (SELECT f.fence FROM palisade_gateway.fences f WHERE f.lease = p_lease) = p_token
            ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value,
                version = nextval('palisade_gateway.object_versions'), token = EXCLUDED.token
            RETURNING o.version INTO out_version;
        IF FOUND THEN
            out_fence := p_token;
        ELSE
            -- Raised between the two reads: refused.
            SELECT f.fence INTO out_fence FROM palisade_gateway.fences f WHERE f.lease = p_lease;
        END IF;
        RETURN;
    END IF;
    SELECT r.out_fence, r.out_raised INTO out_fence, out_raised
        FROM palisade_gateway.raise_fence(p_lease, p_token) r;
    IF out_fence > p_token THEN
        RETURN;
    END IF;
    INSERT INTO palisade_gateway.objects AS o (key, value, version, token)
        VALUES (p_key, p_value, nextval('palisade_gateway.object_versions'), p_token)
        ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value,
            version = nextval('palisade_gateway.object_versions'), token = EXCLUDED.token
        RETURNING o.version INTO out_version;
END $$;

CREATE FUNCTION palisade_gateway.fenced_delete(p_lease text, p_token bigint, p_key text,
    OUT out_fence bigint, OUT out_raised boolean, OUT out_existed boolean)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT r.out_fence, r.out_raised INTO out_fence, out_raised
        FROM palisade_gateway.raise_fence(p_lease, p_token) r;
    out_existed := false;
    IF out_fence > p_token THEN
        RETURN;
    END IF;
    DELETE FROM palisade_gateway.objects WHERE key = p_key;
    out_existed := FOUND;
END $$;
";

/// Version 2: `put_held`, the holder's write in two steps where
/// `fenced_put` takes three. It takes the lease's lock shared without a first
/// look at the fence (it waits behind a raise that holds or waits for the
/// lock, like any write of the current token), then writes the object iff
/// the fence, read with the fresh snapshot of the statement after the lock,
/// equals the token. Its answer is the object's new version, or NULL when
/// it wrote nothing: the fence is not the token (the lease's first write, a
/// raise, or a stale token), and the gateway sends the write again through
/// `fenced_put`, in a transaction of its own (so no shared lock is held
/// while `fenced_put` asks for the exclusive one). A version 1 gateway
/// still running beside it keeps the same lock protocol.
const V2: &str = "
CREATE FUNCTION palisade_gateway.put_held(p_lease text, p_token bigint, p_key text, p_value bytea)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_version bigint;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(LEASE_LOCK_CLASS, hashtext(p_lease));
    INSERT INTO palisade_gateway.objects AS o (key, value, version, token)
        SELECT p_key, p_value, nextval('palisade_gateway.object_versions'), p_token
        WHERE (SELECT f.fence FROM palisade_gateway.fences f WHERE f.lease = p_lease) = p_token
        ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value,
            version = nextval('palisade_gateway.object_versions'), token = EXCLUDED.token
        RETURNING o.version INTO v_version;
    RETURN v_version;
END $$;
";

/// Version 3: conditional writes and listing.
///
/// `lock_lease` is `raise_fence`'s lock protocol without the raise: it
/// takes the lease's lock (shared when the fence is the token, exclusive
/// otherwise) and answers the fence read after it (NULL: none). The
/// conditional writes call it, refuse when the fence is above the token,
/// then write only if the object satisfies the condition (`p_want`: 1 the
/// version `p_version`, 2 any object, 3 no object), and raise the fence
/// only once they wrote: a failed condition changes nothing, the fence
/// included. The condition and the write are one statement on the row:
/// an `UPDATE .. WHERE version = ..` (PostgreSQL re-checks the condition
/// on the newest row after waiting for its lock, so two writers of the
/// same token, both under the shared lock, cannot both pass) or an
/// `INSERT .. ON CONFLICT DO NOTHING`. A raise holds the exclusive lock,
/// so nothing else of the lease's writes runs beside it.
///
/// `objects_key_bytes` orders keys by their bytes (`COLLATE "C"`), whatever
/// the database's collation: a listing page is one range scan of it,
/// bounded by its limit.
const V3: &str = r#"
CREATE FUNCTION palisade_gateway.lock_lease(p_lease text, p_token bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_seen bigint;
BEGIN
    SELECT f.fence INTO v_seen FROM palisade_gateway.fences f WHERE f.lease = p_lease;
    IF v_seen > p_token THEN
        RETURN v_seen;
    END IF;
    IF v_seen = p_token THEN
        PERFORM pg_advisory_xact_lock_shared(LEASE_LOCK_CLASS, hashtext(p_lease));
    ELSE
        PERFORM pg_advisory_xact_lock(LEASE_LOCK_CLASS, hashtext(p_lease));
    END IF;
    SELECT f.fence INTO v_seen FROM palisade_gateway.fences f WHERE f.lease = p_lease;
    RETURN v_seen;
END $$;

CREATE FUNCTION palisade_gateway.settle_fence(p_lease text, p_token bigint, p_seen bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF p_seen IS NOT DISTINCT FROM p_token THEN
        RETURN false;
    END IF;
    INSERT INTO palisade_gateway.fences AS f (lease, fence) VALUES (p_lease, p_token)
        ON CONFLICT (lease) DO UPDATE SET fence = EXCLUDED.fence;
    RETURN true;
END $$;

CREATE FUNCTION palisade_gateway.fenced_put_if(p_lease text, p_token bigint, p_key text,
    p_value bytea, p_want smallint, p_version bigint,
    OUT out_fence bigint, OUT out_raised boolean, OUT out_version bigint, OUT out_current bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_seen bigint := palisade_gateway.lock_lease(p_lease, p_token);
BEGIN
    out_raised := false;
    out_fence := COALESCE(v_seen, 0);
    IF v_seen > p_token THEN
        RETURN;
    END IF;
    IF p_want = 3 THEN
        INSERT INTO palisade_gateway.objects AS o (key, value, version, token)
            VALUES (p_key, p_value, nextval('palisade_gateway.object_versions'), p_token)
            ON CONFLICT (key) DO NOTHING
            RETURNING o.version INTO out_version;
    ELSE
        UPDATE palisade_gateway.objects o SET value = p_value,
                version = nextval('palisade_gateway.object_versions'), token = p_token
            WHERE o.key = p_key AND (p_want = 2 OR o.version = p_version)
            RETURNING o.version INTO out_version;
    END IF;
    IF out_version IS NULL THEN
        SELECT o.version INTO out_current FROM palisade_gateway.objects o WHERE o.key = p_key;
        RETURN;
    END IF;
    out_raised := palisade_gateway.settle_fence(p_lease, p_token, v_seen);
    out_fence := p_token;
END $$;

CREATE FUNCTION palisade_gateway.fenced_delete_if(p_lease text, p_token bigint, p_key text,
    p_want smallint, p_version bigint,
    OUT out_fence bigint, OUT out_raised boolean, OUT out_existed boolean, OUT out_current bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_seen bigint := palisade_gateway.lock_lease(p_lease, p_token);
BEGIN
    out_raised := false;
    out_existed := false;
    out_fence := COALESCE(v_seen, 0);
    IF v_seen > p_token THEN
        RETURN;
    END IF;
    DELETE FROM palisade_gateway.objects o
        WHERE o.key = p_key AND (p_want = 2 OR o.version = p_version);
    IF NOT FOUND THEN
        SELECT o.version INTO out_current FROM palisade_gateway.objects o WHERE o.key = p_key;
        RETURN;
    END IF;
    out_existed := true;
    out_raised := palisade_gateway.settle_fence(p_lease, p_token, v_seen);
    out_fence := p_token;
END $$;

CREATE INDEX objects_key_bytes ON palisade_gateway.objects (key COLLATE "C");
"#;

/// Creates the schema or migrates it to [`SCHEMA_VERSION`], under an
/// advisory lock so that gateways starting together migrate once.
///
/// # Errors
/// [`StoreError::Engine`] when the database is at a newer version than this
/// code knows (with both numbers), or a statement fails.
pub(crate) async fn migrate(client: &mut Client) -> Result<i32, StoreError> {
    migrate_to(client, SCHEMA_VERSION).await
}

/// [`migrate`] up to `target` (at most [`SCHEMA_VERSION`]): the tests build
/// a database of an older version with it.
pub(crate) async fn migrate_to(client: &mut Client, target: i32) -> Result<i32, StoreError> {
    let tx = client.transaction().await.map_err(engine)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(engine)?;
    // Only a first start creates anything: later ones need no CREATE right.
    let exists: bool = tx
        .query_one(
            "SELECT to_regclass('palisade_gateway.schema_version') IS NOT NULL",
            &[],
        )
        .await
        .map_err(engine)?
        .get(0);
    if !exists {
        tx.batch_execute(BOOTSTRAP).await.map_err(engine)?;
    }
    let found: i32 = tx
        .query_opt("SELECT version FROM palisade_gateway.schema_version", &[])
        .await
        .map_err(engine)?
        .map_or(0, |row| row.get(0));
    if found > target {
        return Err(StoreError::Engine(format!(
            "the database's gateway schema is at version {found}, newer than this \
             gateway knows ({target}): run a gateway at least as new as the \
             one that migrated it"
        )));
    }
    if found == target {
        tx.commit().await.map_err(engine)?;
        return Ok(found);
    }
    let steps = MIGRATIONS.iter().enumerate().take(target as usize);
    for (from, sql) in steps.skip(found as usize) {
        let sql = sql.replace("LEASE_LOCK_CLASS", &LEASE_LOCK_CLASS.to_string());
        tx.batch_execute(&sql).await.map_err(engine)?;
        tracing::info!(
            version = from + 1,
            "migrated the gateway's PostgreSQL schema"
        );
    }
    tx.execute(
        "INSERT INTO palisade_gateway.schema_version (version) VALUES ($1)
         ON CONFLICT (one) DO UPDATE SET version = EXCLUDED.version",
        &[&target],
    )
    .await
    .map_err(engine)?;
    tx.commit().await.map_err(engine)?;
    Ok(found)
}

fn engine(err: tokio_postgres::Error) -> StoreError {
    StoreError::Engine(format!("migrating the gateway's schema: {err}"))
}
