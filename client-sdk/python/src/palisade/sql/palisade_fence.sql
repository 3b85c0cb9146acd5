-- Palisade: fenced transactions in your own PostgreSQL (schema version 1).
--
-- The one canonical copy: the Python SDK ships this file as package data and
-- the Rust SDK includes the same file. Run it as it is (psql -f, or as one
-- statement through any driver): it is a single DO statement, so it is atomic
-- whatever the client does around it. Installing the same version again
-- changes nothing; a database holding a newer version is refused (PF006).
-- The role that runs it owns the schema; application roles need
-- `GRANT USAGE ON SCHEMA palisade TO app` (and nothing on the fence table:
-- palisade.fence is SECURITY DEFINER, so no client can lower a fence).
--
-- What it holds
--   palisade.version          (part, version): one row per part, 'fence' here
--   palisade.fences           (lease, fence, raised_at): the highest token
--                             accepted per lease; rows are never deleted
--   palisade.fence(lease text, token bigint) -> bigint
--       Call it inside your transaction, before its writes. It refuses a
--       token below the lease's fence and otherwise raises the fence to the
--       token, in your transaction: the fence and your writes commit or roll
--       back together. A transaction with an older token cannot commit after
--       a newer one raised the fence (Palisade's S6).
--   palisade.guard(tbl regclass, lease_column text)
--   palisade.guard_table(tbl regclass, lease text)
--   palisade.unguard(tbl regclass)
--       Triggers refusing writes (INSERT/UPDATE/DELETE, and TRUNCATE) from a
--       transaction that did not call palisade.fence for the lease: the row's
--       lease column (on the new row and on the old one), or one lease for the
--       whole table.
--
-- SQLSTATEs (class PF, never 40001/40P01, which drivers and ORMs retry)
--   PF001  stale token: the token is below the lease's fence. Another holder
--          took over; stop acting as leader. DETAIL: lease=L token=T fence=F
--          (fence=unknown when a concurrent raise was seen through a
--          REPEATABLE READ/SERIALIZABLE snapshot).
--   PF002  guarded write from a transaction that did not call palisade.fence
--          for the row's (or table's) lease.
--   PF003  invalid lease name: [A-Za-z0-9._-]{1,128}, not . or .. (and not null).
--   PF004  invalid token: must be >= 1 (and not null); above the bigint range
--          the call is refused by the type (22003).
--   PF005  REPEATABLE READ/SERIALIZABLE only: the fence row changed after this
--          transaction's snapshot while raising it; whether the token is stale
--          cannot be told from this snapshot. Roll back and retry the whole
--          transaction (the retry gets PF001 if it is stale).
--   PF006  the database holds a newer version of this schema than this file.
--
-- Locks (per lease; the advisory key is hashtextextended('palisade.fence/' || lease, 0))
--   token == fence  shared advisory lock, held to the end of the transaction:
--                   the holder's transactions do not wait for each other.
--   token >  fence  exclusive advisory lock (waits for every transaction
--                   holding the fence, i.e. older tokens in flight), then the
--                   fence row is written (created on first use).
--   token <  fence  refused at once (PF001).
--   Lock requests queue fairly: once a raise waits, later transactions of the
--   old token queue behind it, and then see the new fence and are refused.
--   Fence several leases in one transaction in a fixed order (sorted), or two
--   such transactions may deadlock (40P01, which a retry resolves).
--
-- Isolation levels
--   READ COMMITTED: each step reads the latest committed fence after taking
--   its lock. REPEATABLE READ/SERIALIZABLE: the snapshot may predate a raise,
--   so the row is also locked (FOR SHARE) or written, which fails with 40001
--   when a raise committed after the snapshot; palisade.fence catches that and
--   raises PF001 when it proves the token stale (token == the fence the
--   snapshot saw), PF005 otherwise. Call palisade.fence as the first
--   statement of the transaction.
--
-- Guard mode uses a transaction-local setting, palisade.fenced (",lease:token"
-- per fenced lease), so it works behind a transaction-mode pooler. A client
-- can forge that setting with set_config: guard mode stops forgetting, not
-- malice. palisade.fence itself cannot be forged.
--
-- Call palisade.fence in the transaction itself, not in a savepoint that may
-- be rolled back: rolling it back releases the lock and forgets the fence.
--
-- Upgrading: a later file keeps this one's steps (under IF v_installed IS
-- NULL) and adds `IF v_installed IS NULL OR v_installed < 2 THEN ... END IF;`
-- after them. The advisory key above is part of the protocol: a version that
-- changes it must not run beside this one.

DO $palisade_install$
DECLARE
    v_file CONSTANT integer := 1;
    v_installed integer;
BEGIN
    -- Concurrent installers take turns (the first creates, the rest find it done).
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('palisade.install', 0));

    IF pg_catalog.to_regnamespace('palisade') IS NULL THEN
        CREATE SCHEMA palisade;
    END IF;
    IF pg_catalog.to_regclass('palisade.version') IS NULL THEN
        CREATE TABLE palisade.version (
            part text PRIMARY KEY,
            version integer NOT NULL,
            installed_at timestamptz NOT NULL DEFAULT pg_catalog.now()
        );
        COMMENT ON TABLE palisade.version IS
            'Installed versions of Palisade''s SQL parts (part ''fence'': palisade_fence.sql).';
    END IF;

    SELECT v.version INTO v_installed FROM palisade.version v WHERE v.part = 'fence';
    IF v_installed > v_file THEN
        RAISE EXCEPTION 'palisade: this database has palisade fence schema version %, newer than this file''s version %',
                v_installed, v_file
            USING ERRCODE = 'PF006',
                  HINT = 'Install with the SQL file of the newer Palisade release (or use that release''s SDK).';
    END IF;
    IF v_installed = v_file THEN
        RETURN;  -- already installed: a no-op
    END IF;

    -- Version 1 -----------------------------------------------------------------
    IF v_installed IS NULL THEN
        CREATE TABLE palisade.fences (
            lease text PRIMARY KEY,
            fence bigint NOT NULL CHECK (fence >= 1),
            raised_at timestamptz NOT NULL DEFAULT pg_catalog.now()
        );
        COMMENT ON TABLE palisade.fences IS
            'Per lease, the highest fencing token a committed transaction passed to palisade.fence. Never lower or delete a row.';
        REVOKE ALL ON TABLE palisade.fences FROM PUBLIC;

        CREATE FUNCTION palisade.fence(lease text, token bigint) RETURNS bigint
        LANGUAGE plpgsql VOLATILE SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        AS $fence$
        #variable_conflict error
        DECLARE
            v_lease CONSTANT text := lease;
            v_token CONSTANT bigint := token;
            v_key bigint;
            v_fence bigint;
            v_seen bigint;
            v_done boolean := false;
            v_set text;
        BEGIN
            -- [A-Za-z0-9._-]{1,128} as a length and a cheap pattern (a counted
            -- repetition costs PostgreSQL's regex engine some 10 us a call).
            IF v_lease IS NULL OR octet_length(v_lease) > 128 OR v_lease !~ '^[A-Za-z0-9._-]+$'
               OR v_lease IN ('.', '..') THEN
                RAISE EXCEPTION 'palisade: invalid lease name %', COALESCE(quote_literal(v_lease), 'NULL')
                    USING ERRCODE = 'PF003',
                          HINT = 'A lease name is [A-Za-z0-9._-]{1,128}, not . or ..';
            END IF;
            IF v_token IS NULL OR v_token < 1 THEN
                RAISE EXCEPTION 'palisade: invalid fencing token % for lease %', COALESCE(v_token::text, 'NULL'), v_lease
                    USING ERRCODE = 'PF004',
                          HINT = 'A fencing token is the token of a Palisade grant: an integer >= 1.';
            END IF;
            v_key := hashtextextended('palisade.fence/' || v_lease, 0);

            -- A first look without a lock picks the lock mode.
            SELECT f.fence INTO v_fence FROM palisade.fences f WHERE f.lease = v_lease;
            IF v_fence > v_token THEN
                RAISE EXCEPTION 'palisade: token % is below the fence % of lease %', v_token, v_fence, v_lease
                    USING ERRCODE = 'PF001',
                          DETAIL = format('lease=%s token=%s fence=%s', v_lease, v_token, v_fence),
                          HINT = 'Another holder took over the lease: stop acting as its leader.';
            END IF;
            v_seen := v_fence;

            IF current_setting('transaction_isolation') IN ('read committed', 'read uncommitted') THEN
                -- Every statement below reads the latest committed fence. The
                -- try_ forms are cheap expressions; they fail at once when the
                -- lock is taken or queued for (a raise), and then we queue too.
                IF v_fence = v_token THEN
                    IF NOT pg_try_advisory_xact_lock_shared(v_key) THEN
                        PERFORM pg_advisory_xact_lock_shared(v_key);
                    END IF;
                ELSIF NOT pg_try_advisory_xact_lock(v_key) THEN
                    PERFORM pg_advisory_xact_lock(v_key);
                END IF;
                -- Read again under the lock: a raise may have committed since the first look.
                SELECT f.fence INTO v_fence FROM palisade.fences f WHERE f.lease = v_lease;
                IF v_fence IS NULL THEN
                    INSERT INTO palisade.fences AS f (lease, fence) VALUES (v_lease, v_token)
                        ON CONFLICT ON CONSTRAINT fences_pkey DO NOTHING;
                    IF NOT FOUND THEN
                        -- Only a write around palisade.fence can get here (the
                        -- exclusive lock keeps other first uses out).
                        SELECT f.fence INTO v_fence FROM palisade.fences f WHERE f.lease = v_lease FOR UPDATE;
                    END IF;
                END IF;
                IF v_fence > v_token THEN
                    RAISE EXCEPTION 'palisade: token % is below the fence % of lease %', v_token, v_fence, v_lease
                        USING ERRCODE = 'PF001',
                              DETAIL = format('lease=%s token=%s fence=%s', v_lease, v_token, v_fence),
                              HINT = 'Another holder took over the lease: stop acting as its leader.';
                ELSIF v_fence < v_token THEN
                    UPDATE palisade.fences f SET fence = v_token, raised_at = now() WHERE f.lease = v_lease;
                END IF;
            ELSE
                -- REPEATABLE READ / SERIALIZABLE: reads see the transaction's
                -- snapshot, which may predate a raise that committed while this
                -- call waited for its lock. Locking or writing the row fails
                -- (40001) when it changed after the snapshot; caught here.
                BEGIN
                    IF v_fence = v_token THEN
                        PERFORM pg_advisory_xact_lock_shared(v_key);
                        SELECT f.fence INTO v_fence FROM palisade.fences f WHERE f.lease = v_lease FOR SHARE;
                    ELSE
                        PERFORM pg_advisory_xact_lock(v_key);
                        IF v_fence IS NULL THEN
                            INSERT INTO palisade.fences AS f (lease, fence) VALUES (v_lease, v_token)
                                ON CONFLICT ON CONSTRAINT fences_pkey DO NOTHING;
                            IF NOT FOUND THEN
                                SELECT f.fence INTO v_fence FROM palisade.fences f WHERE f.lease = v_lease FOR UPDATE;
                            END IF;
                        END IF;
                        IF v_fence < v_token THEN
                            UPDATE palisade.fences f SET fence = v_token, raised_at = now() WHERE f.lease = v_lease;
                        END IF;
                    END IF;
                    v_done := true;
                EXCEPTION WHEN serialization_failure THEN
                    v_done := false;
                END;
                IF NOT v_done THEN
                    IF v_seen = v_token THEN
                        -- The snapshot saw the fence at our token; any change since is a raise above it.
                        RAISE EXCEPTION 'palisade: token % is below the fence of lease % (raised by a transaction that committed after this one''s snapshot)',
                                v_token, v_lease
                            USING ERRCODE = 'PF001',
                                  DETAIL = format('lease=%s token=%s fence=unknown', v_lease, v_token),
                                  HINT = 'Another holder took over the lease: stop acting as its leader.';
                    END IF;
                    RAISE EXCEPTION 'palisade: the fence of lease % changed after this transaction''s snapshot; roll back and retry the transaction',
                            v_lease
                        USING ERRCODE = 'PF005',
                              DETAIL = format('lease=%s token=%s isolation=%s', v_lease, v_token,
                                              current_setting('transaction_isolation')),
                              HINT = 'A retry sees the new fence: it passes, or fails with PF001 if the token is stale.';
                END IF;
                IF v_fence > v_token THEN  -- a first use that raced with a higher token
                    RAISE EXCEPTION 'palisade: token % is below the fence % of lease %', v_token, v_fence, v_lease
                        USING ERRCODE = 'PF001',
                              DETAIL = format('lease=%s token=%s fence=%s', v_lease, v_token, v_fence),
                              HINT = 'Another holder took over the lease: stop acting as its leader.';
                END IF;
            END IF;

            -- For the guard triggers: this transaction fenced this lease.
            v_set := COALESCE(current_setting('palisade.fenced', true), '');
            IF strpos(v_set, ',' || v_lease || ':') = 0 THEN
                v_set := set_config('palisade.fenced', v_set || ',' || v_lease || ':' || v_token::text, true);
            END IF;
            RETURN v_token;
        END
        $fence$;
        COMMENT ON FUNCTION palisade.fence(text, bigint) IS
            'Call inside a transaction before its writes: refuses a token below the lease''s fence (SQLSTATE PF001), else raises the fence to it in this transaction. See palisade_fence.sql.';

        -- The guard triggers. Their functions read only the transaction-local
        -- setting palisade.fenced.
        CREATE FUNCTION palisade.fenced_here(lease text) RETURNS boolean
        LANGUAGE sql STABLE
        AS $fenced$
            SELECT $1 IS NOT NULL
               AND strpos(COALESCE(current_setting('palisade.fenced', true), ''), ',' || $1 || ':') > 0
        $fenced$;
        COMMENT ON FUNCTION palisade.fenced_here(text) IS
            'Whether this transaction called palisade.fence for the lease (what the guard triggers check).';

        CREATE FUNCTION palisade.guard_row_trigger() RETURNS trigger
        LANGUAGE plpgsql
        AS $guard_row$
        DECLARE
            v_column text := TG_ARGV[0];
            v_new text;
            v_old text;
        BEGIN
            IF TG_OP <> 'DELETE' THEN
                v_new := pg_catalog.to_jsonb(NEW) ->> v_column;
                IF NOT palisade.fenced_here(v_new) THEN
                    RAISE EXCEPTION 'palisade: % on %.% for lease % in a transaction that did not call palisade.fence for it',
                            TG_OP, quote_ident(TG_TABLE_SCHEMA), quote_ident(TG_TABLE_NAME),
                            COALESCE(quote_literal(v_new), 'NULL')
                        USING ERRCODE = 'PF002',
                              DETAIL = format('table=%I.%I column=%I lease=%s', TG_TABLE_SCHEMA, TG_TABLE_NAME, v_column, v_new),
                              HINT = 'Call palisade.fence(lease, token) first in this transaction.';
                END IF;
            END IF;
            IF TG_OP <> 'INSERT' THEN
                v_old := pg_catalog.to_jsonb(OLD) ->> v_column;
                IF (TG_OP = 'DELETE' OR v_old IS DISTINCT FROM v_new) AND NOT palisade.fenced_here(v_old) THEN
                    RAISE EXCEPTION 'palisade: % on %.% of a row of lease % in a transaction that did not call palisade.fence for it',
                            TG_OP, quote_ident(TG_TABLE_SCHEMA), quote_ident(TG_TABLE_NAME),
                            COALESCE(quote_literal(v_old), 'NULL')
                        USING ERRCODE = 'PF002',
                              DETAIL = format('table=%I.%I column=%I lease=%s', TG_TABLE_SCHEMA, TG_TABLE_NAME, v_column, v_old),
                              HINT = 'Call palisade.fence(lease, token) first in this transaction.';
                END IF;
            END IF;
            RETURN NULL;
        END
        $guard_row$;

        CREATE FUNCTION palisade.guard_table_trigger() RETURNS trigger
        LANGUAGE plpgsql
        AS $guard_table$
        BEGIN
            IF TG_NARGS <> 1 THEN  -- ('column', <name>): TRUNCATE of a table guarded by a lease column
                RAISE EXCEPTION 'palisade: TRUNCATE of %.%, guarded by lease column %, is refused',
                        quote_ident(TG_TABLE_SCHEMA), quote_ident(TG_TABLE_NAME), quote_ident(TG_ARGV[1])
                    USING ERRCODE = 'PF002',
                          HINT = 'Delete the rows in fenced transactions, or palisade.unguard the table first.';
            END IF;
            IF NOT palisade.fenced_here(TG_ARGV[0]) THEN
                RAISE EXCEPTION 'palisade: % on %.% (guarded by lease %) in a transaction that did not call palisade.fence for it',
                        TG_OP, quote_ident(TG_TABLE_SCHEMA), quote_ident(TG_TABLE_NAME), quote_literal(TG_ARGV[0])
                    USING ERRCODE = 'PF002',
                          DETAIL = format('table=%I.%I lease=%s', TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_ARGV[0]),
                          HINT = 'Call palisade.fence(lease, token) first in this transaction.';
            END IF;
            RETURN NULL;
        END
        $guard_table$;

        CREATE FUNCTION palisade.unguard(tbl regclass) RETURNS void
        LANGUAGE plpgsql
        AS $unguard$
        DECLARE
            v_name name;
        BEGIN
            FOR v_name IN
                SELECT t.tgname FROM pg_catalog.pg_trigger t
                WHERE t.tgrelid = tbl AND NOT t.tgisinternal
                  AND t.tgname IN ('palisade_guard', 'palisade_guard_truncate', 'palisade_guard_table')
            LOOP
                EXECUTE format('DROP TRIGGER %I ON %s', v_name, tbl);
            END LOOP;
        END
        $unguard$;
        COMMENT ON FUNCTION palisade.unguard(regclass) IS 'Removes the palisade guard triggers of the table.';

        CREATE FUNCTION palisade.guard(tbl regclass, lease_column text) RETURNS void
        LANGUAGE plpgsql
        AS $guard$
        DECLARE
            v_column_type oid;
            v_type oid;
            v_base oid;
        BEGIN
            IF tbl IS NULL OR lease_column IS NULL THEN
                RAISE EXCEPTION 'palisade.guard: table and lease column must not be null' USING ERRCODE = '22004';
            END IF;
            SELECT a.atttypid INTO v_column_type FROM pg_catalog.pg_attribute a
                WHERE a.attrelid = tbl AND a.attname = lease_column AND a.attnum > 0 AND NOT a.attisdropped;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'palisade.guard: table % has no column %', tbl, quote_ident(lease_column)
                    USING ERRCODE = '42703';
            END IF;
            v_base := v_column_type;
            LOOP  -- through domains to the base type
                SELECT CASE WHEN t.typtype = 'd' THEN t.typbasetype END INTO v_type FROM pg_catalog.pg_type t WHERE t.oid = v_base;
                EXIT WHEN v_type IS NULL;
                v_base := v_type;
            END LOOP;
            IF v_base NOT IN ('text'::regtype, 'varchar'::regtype) THEN
                RAISE EXCEPTION 'palisade.guard: lease column %.% is of type %; it must be text or varchar',
                        tbl, quote_ident(lease_column), v_column_type::regtype
                    USING ERRCODE = '42804';
            END IF;
            PERFORM palisade.unguard(tbl);
            EXECUTE format('CREATE TRIGGER palisade_guard AFTER INSERT OR UPDATE OR DELETE ON %s '
                           'FOR EACH ROW EXECUTE FUNCTION palisade.guard_row_trigger(%L)', tbl, lease_column);
            EXECUTE format('CREATE TRIGGER palisade_guard_truncate BEFORE TRUNCATE ON %s '
                           'FOR EACH STATEMENT EXECUTE FUNCTION palisade.guard_table_trigger(''column'', %L)', tbl, lease_column);
        END
        $guard$;
        COMMENT ON FUNCTION palisade.guard(regclass, text) IS
            'Refuses writes to the table (PF002) unless the transaction called palisade.fence for the row''s lease (in lease_column; the old row''s too). TRUNCATE is refused.';

        CREATE FUNCTION palisade.guard_table(tbl regclass, lease text) RETURNS void
        LANGUAGE plpgsql
        AS $guard_table_fn$
        BEGIN
            IF tbl IS NULL THEN
                RAISE EXCEPTION 'palisade.guard_table: table must not be null' USING ERRCODE = '22004';
            END IF;
            IF lease IS NULL OR octet_length(lease) > 128 OR lease !~ '^[A-Za-z0-9._-]+$' OR lease IN ('.', '..') THEN
                RAISE EXCEPTION 'palisade: invalid lease name %', COALESCE(quote_literal(lease), 'NULL')
                    USING ERRCODE = 'PF003',
                          HINT = 'A lease name is [A-Za-z0-9._-]{1,128}, not . or ..';
            END IF;
            PERFORM palisade.unguard(tbl);
            EXECUTE format('CREATE TRIGGER palisade_guard_table BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON %s '
                           'FOR EACH STATEMENT EXECUTE FUNCTION palisade.guard_table_trigger(%L)', tbl, lease);
        END
        $guard_table_fn$;
        COMMENT ON FUNCTION palisade.guard_table(regclass, text) IS
            'Refuses every write to the table (PF002) unless the transaction called palisade.fence for this lease.';
    END IF;

    INSERT INTO palisade.version AS v (part, version) VALUES ('fence', v_file)
        ON CONFLICT (part) DO UPDATE SET version = EXCLUDED.version, installed_at = pg_catalog.now();
END
$palisade_install$;
