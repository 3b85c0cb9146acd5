-- Palisade: fenced transactions in your own PostgreSQL (schema version 3).
--
-- The one canonical copy: the Python SDK ships this file as package data and
-- the Rust SDK includes the same file. Run it as it is (psql -f, or as one
-- statement through any driver): it is a single DO statement, so it is atomic
-- whatever the client does around it. Installing the same version again
-- changes nothing; a database holding a newer version is refused (PF006).
-- It needs no extension: it runs on managed databases (RDS, Cloud SQL) too.
--
-- Who may do what. The role that runs this file owns the schema and is the
-- only one that can do anything with it until it grants more:
--   palisade.allow(role)  lets a role fence with proof: USAGE on the schema,
--                         EXECUTE on palisade.fence(text, text) and prove.
--   palisade.trust(role)  also lets it call palisade.fence_unverified, which
--                         believes any token: only for roles you trust as
--                         much as the cluster (see "Unverified mode").
--   palisade.set_keys(jwks)  installs the cluster's signing keys (GET /v1/jwks);
--                         `palisade sql keys` does it, and must run again after
--                         `palisade cluster rotate-key` or a retirement. No
--                         other role can make it wait (it needs no lock a
--                         caller can hold: proofs a transaction holds are
--                         left for later), and it waits 5 s at most for any
--                         lock (lock_timeout, 55P03) rather than hang. It
--                         refuses a key that is not a canonical encoding of a
--                         point of Ed25519, or is a point of small order.
--   palisade.guard / guard_table / unguard: the owner only.
-- Tables and the secret below are readable by the owner only, so no other
-- role can read a fence, lock a fence row, or forge a guard mark.
--
-- What it holds
--   palisade.version    (part, version): one row per part, 'fence' here
--   palisade.fences     (lease, fence, raised_at): the highest token accepted
--                       per lease; rows are never deleted
--   palisade.keys       (kid, x, ...): the cluster's Ed25519 public keys
--   palisade.proofs     a cache of verified JWTs (sha256 of the JWT, its
--                       lease, token, exp and key: kid and x): a holder pays
--                       the signature check once per JWT (palisade.prove).
--                       A proof counts only while its key (that kid with
--                       that x) is installed: a retired key's proofs are
--                       ignored at once, and deleted by set_keys (or the
--                       lease's next prove) once no transaction holds them.
--                       No foreign key: nothing a caller does locks a key.
--   palisade.settings   one row: the guard secret, exp leeway, key set index
--
--   palisade.fence(lease text, proof text) -> bigint
--       Call it inside your transaction, before its writes, with the lease's
--       JWT as the cluster granted it. It checks the JWT (EdDSA against the
--       installed keys, iss 'palisade', the lease claim equal to lease, exp
--       plus a leeway not passed; each part canonical base64url, the
--       signature's S below the group order), refuses its token if below the
--       lease's fence and otherwise raises the fence to it, in your
--       transaction: the fence and your writes commit or roll back together.
--       A transaction with an older token cannot commit after a newer one
--       raised the fence (Palisade's S6). Answers the token.
--   palisade.prove(proof text) -> bigint
--       Checks the JWT's signature and caches the result (committed at once
--       when called outside a transaction): palisade.fence then pays a hash
--       and an index lookup for it, and transactions of older tokens of the
--       lease are refused from then on (see Locks). The SDKs call it once per
--       new JWT, before the transaction. A cache miss in palisade.fence
--       verifies in place (some 20-30 ms of the database's CPU) and caches
--       nothing.
--   palisade.fence_unverified(lease text, token bigint) -> bigint
--       palisade.fence without proof, for trusted roles only.
--   palisade.guard(tbl regclass, lease_column text)
--   palisade.guard_table(tbl regclass, lease text)
--   palisade.unguard(tbl regclass)
--       Triggers refusing writes (INSERT/UPDATE/DELETE/MERGE/COPY, and
--       TRUNCATE) from a transaction that did not pass palisade.fence for the
--       lease: the row's lease column (on the new row and on the old one), or
--       one lease for the whole table. Each guard has a row trigger, which
--       fires for the rows of the table itself however they are reached:
--       named in the statement, or through a partitioned or inheritance
--       parent (whose statement triggers alone would never see them).
--       guard_table also checks once per statement naming the table, so a
--       statement that matches no row is refused too. TRUNCATE of a parent
--       fires the TRUNCATE triggers of the tables it empties.
--       A partitioned table may be guarded itself: the guard covers every
--       partition, those attached later too, and writes straight into a
--       partition (row triggers of a partitioned table are cloned to every
--       partition, and TRUNCATE triggers are made on each partition). A
--       partition made or attached after the guard refuses every write until
--       palisade.guard (or guard_table) runs again for the partitioned table,
--       which makes its TRUNCATE trigger. Guard either a partitioned table or
--       its partitions one by one, not both (refused). A table with
--       inheritance children is refused (a guard on it would not cover a
--       write straight into a child): guard each child instead, which holds
--       for writes through the parent too. A table that gains inheritance
--       children after its guard does not cover them: guard them too.
--
-- SQLSTATEs (class PF, never 40001/40P01, which drivers and ORMs retry)
--   PF001  stale token: the token is below the lease's fence. Another holder
--          took over; stop acting as leader. DETAIL: lease=L token=T (the
--          fence itself is not told).
--   PF002  guarded write from a transaction that did not pass palisade.fence
--          for the row's (or table's) lease; a write to a partition attached
--          after its partitioned table's guard; or a guard that cannot be made.
--   PF003  invalid lease name: [A-Za-z0-9._-]{1,128}, not . or .. (and not null).
--   PF004  invalid token: must be >= 1 (and not null); above the bigint range
--          the call is refused by the type (22003).
--   PF005  REPEATABLE READ/SERIALIZABLE only: the fence row changed after this
--          transaction's snapshot while raising it; whether the token is stale
--          cannot be told from this snapshot. Roll back and retry the whole
--          transaction (the retry gets PF001 if it is stale).
--   PF006  the database holds a newer version of this schema than this file.
--   PF007  the proof is refused: not a JWT, a bad signature, a key this
--          database does not trust (unknown, or retired: run `palisade sql
--          keys`), another lease's, or expired. DETAIL: reason=...
--
-- Locks (per lease, on its row of palisade.fences, which only the owner can
-- read; no advisory lock, so no other role can take or block them; and none
-- on palisade.keys or palisade.settings, so no caller can block set_keys)
--   token == fence  FOR SHARE, held to the end of the transaction: the
--                   holder's transactions do not wait for each other.
--   token >  fence  FOR UPDATE (waits for every transaction holding the
--                   fence, i.e. older tokens in flight), then the row is
--                   written (created on first use).
--   token <  fence  refused at once (PF001).
--   Row locks are not queued fairly, so a raise announces itself first: once
--   a JWT with a higher token is proven (palisade.prove, which the SDKs call
--   before the transaction), every new transaction of an older token is
--   refused at once (PF001), and the raise waits only for those in flight.
--   A raise without a proven JWT (fence_unverified, or fence with a JWT not
--   proven first) may wait while the old holder keeps starting transactions.
--   Fence several leases in one transaction in a fixed order (sorted), or two
--   such transactions may deadlock (40P01, which a retry resolves).
--
-- Isolation levels
--   READ COMMITTED: each step reads the latest committed fence after taking
--   its lock. REPEATABLE READ/SERIALIZABLE: the snapshot may predate a raise,
--   so locking or writing the row fails with 40001 when a raise committed
--   after the snapshot; palisade.fence catches that and raises PF001 when it
--   proves the token stale (token == the fence the snapshot saw), PF005
--   otherwise. Call palisade.fence as the first statement of the transaction.
--
-- Guard marks. palisade.fence leaves a transaction-local setting,
-- palisade.fenced (",lease:token:mac" per fenced lease); mac is a hash keyed
-- by palisade.settings' secret over this backend, this transaction's start
-- time, the lease and the token. The guard triggers (SECURITY DEFINER)
-- recompute it: a client that sets palisade.fenced itself cannot make a mark
-- that passes. A genuine mark is not enough either: the guard takes the
-- lease's fence row FOR SHARE again and needs it at the mark's token, so a
-- mark that outlived its lock (a savepoint rolled back, a later transaction
-- of the same query message) passes only while no higher token raised the
-- fence. The row guard reads only the lease column (never the whole row:
-- it runs as the schema's owner). It works behind a transaction-mode pooler.
-- The row triggers repeat the check for each row: some 10 us a row for
-- guard_table, 20 for guard (which also reads the lease column).
--
-- Unverified mode. palisade.fence_unverified believes the token it is given:
-- a role allowed to call it can write past any guard and raise any fence to
-- any value (locking the real holder out). Grant it (palisade.trust) only to
-- roles you trust as much as the cluster, e.g. when the JWT cannot be carried
-- to the database; everything else about the fence holds the same.
--
-- Call palisade.fence in the transaction itself, not in a savepoint that may
-- be rolled back: rolling it back releases the lock and forgets the fence.
--
-- Upgrading from version 1: version 1's palisade.fence(text, bigint) is
-- dropped (old SDKs then get "function does not exist"), and its advisory
-- locks are no longer taken: stop writers of the old SDK while installing.
-- Upgrading from version 2 (or 1): palisade.proofs loses its foreign key to
-- palisade.keys and gains x (the install waits for open transactions that
-- used palisade.prove or palisade.fence to end); every palisade.guard_table
-- guard gains its row trigger, and a partitioned table guarded by version 1
-- gains the TRUNCATE triggers of its partitions (the installing role must
-- still be allowed to make triggers on those tables, as when it guarded
-- them); other guards keep working as they are.

DO $palisade_install$
DECLARE
    v_file CONSTANT integer := 3;
    v_installed integer;
    v_name name;
    v_guard record;
    v_part regclass;
BEGIN
    -- Concurrent installers take turns (the first creates, the rest find it done).
    PERFORM pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('palisade.install', 0));

    IF pg_catalog.to_regnamespace('palisade') IS NULL THEN
        CREATE SCHEMA palisade;
    END IF;
    -- A schema (or anything in it) another role made first would let that
    -- role run code as this one, or keep rights in it: refuse to install there.
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_namespace n
               WHERE n.nspname = 'palisade' AND n.nspowner <> (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user))
       OR EXISTS (SELECT 1 FROM pg_catalog.pg_class c
                  WHERE c.relnamespace = 'palisade'::regnamespace
                    AND c.relowner <> (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user))
       OR EXISTS (SELECT 1 FROM pg_catalog.pg_proc p
                  WHERE p.pronamespace = 'palisade'::regnamespace
                    AND p.proowner <> (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = current_user)) THEN
        RAISE EXCEPTION 'palisade: schema palisade (or something in it) is owned by another role than %; refusing to install into it',
                current_user
            USING ERRCODE = '42501',
                  HINT = 'Install as the role that owns the schema, or drop the schema first.';
    END IF;
    REVOKE ALL ON SCHEMA palisade FROM PUBLIC;
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

    -- Version 1: the fence table ----------------------------------------------
    IF v_installed IS NULL THEN
        CREATE TABLE palisade.fences (
            lease text PRIMARY KEY,
            fence bigint NOT NULL CHECK (fence >= 1),
            raised_at timestamptz NOT NULL DEFAULT pg_catalog.now()
        );
        COMMENT ON TABLE palisade.fences IS
            'Per lease, the highest fencing token a committed transaction passed to palisade.fence. Never lower or delete a row.';
    END IF;

    -- Version 2: proofs, keys, owner-only locks, keyed guard marks ------------
    IF v_installed IS NULL OR v_installed < 2 THEN
        -- Wait for transactions of version 1 that read the fences to end.
        LOCK TABLE palisade.fences IN ACCESS EXCLUSIVE MODE;
        REVOKE ALL ON TABLE palisade.fences, palisade.version FROM PUBLIC;
        IF v_installed = 1 THEN
            DROP FUNCTION palisade.fence(text, bigint);
            DROP FUNCTION palisade.fenced_here(text);
        END IF;

        CREATE TABLE palisade.settings (
            one boolean PRIMARY KEY DEFAULT true CHECK (one),
            secret bytea NOT NULL,
            exp_leeway_secs integer NOT NULL DEFAULT 1 CHECK (exp_leeway_secs >= 0),
            keys_index bigint NOT NULL DEFAULT 0
        );
        COMMENT ON TABLE palisade.settings IS
            'The guard marks'' secret, the leeway on a JWT''s exp, and the applied_index of the installed key set.';
        -- 244 random bits from two version-4 UUIDs (gen_random_uuid: PostgreSQL's CSPRNG).
        INSERT INTO palisade.settings (secret)
            VALUES (pg_catalog.sha256(pg_catalog.convert_to(
                pg_catalog.gen_random_uuid()::text || pg_catalog.gen_random_uuid()::text, 'UTF8')));

        CREATE TABLE palisade.keys (
            kid text PRIMARY KEY,
            x bytea NOT NULL CHECK (octet_length(x) = 32),
            ax numeric NOT NULL,   -- the public point, decompressed once
            ay numeric NOT NULL,
            added_at timestamptz NOT NULL DEFAULT pg_catalog.now()
        );
        COMMENT ON TABLE palisade.keys IS
            'The cluster''s Ed25519 public keys (its JWKS), set by palisade.set_keys.';

        CREATE TABLE palisade.proofs (
            digest bytea PRIMARY KEY,   -- sha256 of the JWT
            lease text NOT NULL,
            token bigint NOT NULL,
            exp bigint NOT NULL,        -- seconds since the Unix epoch
            kid text NOT NULL REFERENCES palisade.keys (kid) ON DELETE CASCADE
        );
        CREATE INDEX proofs_by_lease ON palisade.proofs (lease, token);
        REVOKE ALL ON TABLE palisade.settings, palisade.keys, palisade.proofs FROM PUBLIC;
    END IF;

    -- Version 3: proofs hold no lock on keys; guards reach rows through parents
    IF v_installed IS NULL OR v_installed < 3 THEN
        -- A proof's foreign key to its key made every transaction that
        -- cached a proof hold a lock on the key's row, so that any allowed
        -- role could keep set_keys from retiring it. A proof now names its
        -- key (kid and x) and counts only while that key is installed.
        FOR v_name IN
            SELECT c.conname FROM pg_catalog.pg_constraint c
            WHERE c.conrelid = 'palisade.proofs'::regclass AND c.contype = 'f'
        LOOP
            EXECUTE pg_catalog.format('ALTER TABLE palisade.proofs DROP CONSTRAINT %I', v_name);
        END LOOP;
        ALTER TABLE palisade.proofs ADD COLUMN x bytea;
        UPDATE palisade.proofs c SET x = k.x FROM palisade.keys k WHERE k.kid = c.kid;
        DELETE FROM palisade.proofs c WHERE c.x IS NULL;
        ALTER TABLE palisade.proofs ALTER COLUMN x SET NOT NULL;
        COMMENT ON TABLE palisade.proofs IS
            'JWTs whose signature palisade.prove checked, until their exp; one counts only while its key (kid and x) is in palisade.keys.';
        -- verified() answers the key's x too (a new result type).
        IF pg_catalog.to_regprocedure('palisade.verified(text)') IS NOT NULL THEN
            DROP FUNCTION palisade.verified(text);
        END IF;
    END IF;

    -- The functions, as this version has them: every install and upgrade
    -- (re)defines them all.
    IF v_installed IS DISTINCT FROM v_file THEN

        -- Ed25519 (RFC 8032) verification over numeric, in PL/pgSQL ----------
        CREATE OR REPLACE FUNCTION palisade.ed_le(b bytea) RETURNS numeric
        LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
        AS $le$
        DECLARE
            v numeric := 0;
            i integer;
        BEGIN  -- a little-endian byte string as a number
            FOR i IN REVERSE length(b) - 1..0 LOOP
                v := v * 256 + get_byte(b, i);
            END LOOP;
            RETURN v;
        END
        $le$;

        CREATE OR REPLACE FUNCTION palisade.ed_bytes(n numeric) RETURNS bytea
        LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
        AS $bytes$
        DECLARE
            v bytea := '\x0000000000000000000000000000000000000000000000000000000000000000';
            i integer;
        BEGIN  -- 0 <= n < 2^256 as 32 little-endian bytes
            FOR i IN 0..31 LOOP
                v := set_byte(v, i, mod(n, 256)::integer);
                n := div(n, 256);
            END LOOP;
            RETURN v;
        END
        $bytes$;

        CREATE OR REPLACE FUNCTION palisade.ed_inv(a numeric) RETURNS numeric
        LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
        AS $inv$
        DECLARE  -- a^-1 mod p by Euclid (a not a multiple of p)
            p CONSTANT numeric := 57896044618658097711785492504343953926634992332820282019728792003956564819949;
            r0 numeric := p;
            r1 numeric := mod(mod(a, p) + p, p);
            t0 numeric := 0;
            t1 numeric := 1;
            q numeric;
            tmp numeric;
        BEGIN
            WHILE r1 <> 0 LOOP
                q := div(r0, r1);
                tmp := r0 - q * r1; r0 := r1; r1 := tmp;
                tmp := t0 - q * t1; t0 := t1; t1 := tmp;
            END LOOP;
            RETURN mod(mod(t0, p) + p, p);
        END
        $inv$;

        CREATE OR REPLACE FUNCTION palisade.ed_decompress(enc bytea) RETURNS numeric[]
        LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
        AS $decompress$
        DECLARE  -- RFC 8032 5.1.3: the point {x, y}, or NULL when enc is none
            p CONSTANT numeric := 57896044618658097711785492504343953926634992332820282019728792003956564819949;
            d CONSTANT numeric := 37095705934669439343138083508754565189542113879843219016388785533085940283555;
            sqrt_m1 CONSTANT numeric := 19681161376707505956807079304988542015446066515923890162744021073123829784752;
            v_sign integer;
            y numeric;
            u numeric;
            v numeric;
            v3 numeric;
            base numeric;
            e numeric;
            r numeric := 1;
            x numeric;
            chk numeric;
        BEGIN
            IF octet_length(enc) <> 32 THEN
                RETURN NULL;
            END IF;
            v_sign := get_byte(enc, 31) >> 7;
            y := palisade.ed_le(set_byte(enc, 31, get_byte(enc, 31) & 127));
            IF y >= p THEN
                RETURN NULL;
            END IF;
            u := mod(y * y - 1 + p, p);
            v := mod(d * mod(y * y, p) + 1, p);
            v3 := mod(mod(v * v, p) * v, p);
            -- x = u v^3 (u v^7)^((p-5)/8)
            base := mod(mod(u * v3, p) * mod(v3 * v, p), p);
            e := div(p - 5, 8);
            WHILE e > 0 LOOP
                IF mod(e, 2) = 1 THEN
                    r := mod(r * base, p);
                END IF;
                base := mod(base * base, p);
                e := div(e, 2);
            END LOOP;
            x := mod(mod(u * v3, p) * r, p);
            chk := mod(v * mod(x * x, p), p);
            IF chk = u THEN
                NULL;
            ELSIF chk = mod(p - u, p) THEN
                x := mod(x * sqrt_m1, p);
            ELSE
                RETURN NULL;
            END IF;
            IF x = 0 AND v_sign = 1 THEN
                RETURN NULL;
            END IF;
            IF mod(x, 2) <> v_sign THEN
                x := p - x;
            END IF;
            RETURN ARRAY[x, y];
        END
        $decompress$;

        CREATE OR REPLACE FUNCTION palisade.ed_small_order(ax numeric, ay numeric) RETURNS boolean
        LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
        AS $small$
        -- Whether the point (ax, ay) is of small order: [8]A is the identity
        -- (the 8 points of the torsion subgroup). Such a public key accepts
        -- signatures nobody made: [k]A vanishes in the check. Three doublings
        -- as in ed_verify (a = -1, complete for doubling).
        DECLARE
            p CONSTANT numeric := 57896044618658097711785492504343953926634992332820282019728792003956564819949;
            ex numeric := ax; ey numeric := ay; ez numeric := 1;
            fa numeric; fb numeric; fc numeric; fe numeric; ff numeric; fg numeric; fh numeric;
            i integer;
        BEGIN
            FOR i IN 1..3 LOOP
                fa := mod(ex * ex, p); fb := mod(ey * ey, p); fc := 2 * mod(ez * ez, p);
                fh := fa + fb; fe := fh - mod((ex + ey) * (ex + ey), p); fg := fa - fb; ff := fc + fg;
                ex := mod(fe * ff, p); ey := mod(fg * fh, p); ez := mod(ff * fg, p);
            END LOOP;
            RETURN mod(ex, p) = 0 AND mod(ey - ez, p) = 0;
        END
        $small$;

        CREATE OR REPLACE FUNCTION palisade.ed_verify(ax numeric, ay numeric, pk bytea, msg bytea, sig bytea)
        RETURNS boolean
        LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
        AS $verify$
        -- RFC 8032 5.1.7 without the cofactor (as ed25519-dalek's verify):
        -- [S]B - [k]A, k = SHA-512(R || A || M) mod L, encodes to R. A is the
        -- point (ax, ay) whose encoding is pk. Extended coordinates, a = -1
        -- (Hisil-Wong-Carter-Dawson 2008), both scalars at once (Straus).
        DECLARE
            p CONSTANT numeric := 57896044618658097711785492504343953926634992332820282019728792003956564819949;
            l CONSTANT numeric := 7237005577332262213973186563042994240857116359379907606001950938285454250989;
            d2 CONSTANT numeric := 16295367250680780974490674513165176452449235426866156013048779062215315747161;
            bx CONSTANT numeric := 15112221349535400772501151409588531511454012693041857206046113283949847762202;
            b_y CONSTANT numeric := 46316835694926478169428394003475163141307993866256225615783033603165251855960;
            s numeric;
            sb bytea;
            kb bytea;
            -- the addends, affine with t2 = 2d x y: 1 = B, 2 = -A, 3 = B - A
            p1x numeric; p1y numeric; p1t numeric;
            p2x numeric; p2y numeric; p2t numeric;
            p3x numeric; p3y numeric; p3t numeric;
            qx numeric; qy numeric; qt numeric;
            ex numeric := 0; ey numeric := 1; ez numeric := 1; et numeric := 0;
            fa numeric; fb numeric; fc numeric; fd numeric; fe numeric; ff numeric; fg numeric; fh numeric;
            zi numeric;
            i integer;
            v_pick integer;
            started boolean := false;
        BEGIN
            IF octet_length(pk) <> 32 OR octet_length(sig) <> 64 THEN
                RETURN false;
            END IF;
            sb := substr(sig, 33, 32);
            s := palisade.ed_le(sb);
            IF s >= l THEN
                RETURN false;
            END IF;
            kb := palisade.ed_bytes(mod(palisade.ed_le(sha512(substr(sig, 1, 32) || pk || msg)), l));
            p1x := bx; p1y := b_y; p1t := mod(mod(d2 * bx, p) * b_y, p);
            p2x := mod(p - ax, p); p2y := ay; p2t := mod(mod(d2 * p2x, p) * p2y, p);
            -- p3 = B + (-A), then affine (one inversion)
            fa := mod((b_y - bx) * (p2y - p2x), p); fb := mod((b_y + bx) * (p2y + p2x), p);
            fc := mod(p1t * mod(p2x * p2y, p), p); fd := 2;
            fe := fb - fa; ff := fd - fc; fg := fd + fc; fh := fb + fa;
            ex := mod(fe * ff, p); ey := mod(fg * fh, p); ez := mod(ff * fg, p);
            IF mod(ez, p) = 0 THEN
                RETURN false;
            END IF;
            zi := palisade.ed_inv(ez);
            p3x := mod(mod(ex * zi, p) + p, p); p3y := mod(mod(ey * zi, p) + p, p);
            p3t := mod(mod(d2 * p3x, p) * p3y, p);
            FOR i IN REVERSE 255..0 LOOP
                IF started THEN  -- double
                    fa := mod(ex * ex, p); fb := mod(ey * ey, p); fc := 2 * mod(ez * ez, p);
                    fh := fa + fb; fe := fh - mod((ex + ey) * (ex + ey), p); fg := fa - fb; ff := fc + fg;
                    ex := mod(fe * ff, p); ey := mod(fg * fh, p); et := mod(fe * fh, p); ez := mod(ff * fg, p);
                END IF;
                v_pick := get_bit(sb, i) + 2 * get_bit(kb, i);
                IF v_pick <> 0 THEN
                    IF v_pick = 1 THEN
                        qx := p1x; qy := p1y; qt := p1t;
                    ELSIF v_pick = 2 THEN
                        qx := p2x; qy := p2y; qt := p2t;
                    ELSE
                        qx := p3x; qy := p3y; qt := p3t;
                    END IF;
                    IF NOT started THEN
                        ex := qx; ey := qy; ez := 1; et := mod(qx * qy, p);
                        started := true;
                    ELSE  -- add
                        fa := mod((ey - ex) * (qy - qx), p); fb := mod((ey + ex) * (qy + qx), p);
                        fc := mod(et * qt, p); fd := 2 * ez;
                        fe := fb - fa; ff := fd - fc; fg := fd + fc; fh := fb + fa;
                        ex := mod(fe * ff, p); ey := mod(fg * fh, p); et := mod(fe * fh, p); ez := mod(ff * fg, p);
                    END IF;
                END IF;
            END LOOP;
            IF NOT started THEN
                ex := 0; ey := 1; ez := 1;
            END IF;
            IF mod(ez, p) = 0 THEN
                RETURN false;
            END IF;
            zi := palisade.ed_inv(ez);
            ex := mod(mod(ex * zi, p) + p, p);
            ey := mod(mod(ey * zi, p) + p, p);
            kb := palisade.ed_bytes(ey);  -- the encoding: y, and x's parity in the top bit
            IF mod(ex, 2) = 1 THEN
                kb := set_byte(kb, 31, get_byte(kb, 31) | 128);
            END IF;
            RETURN kb = substr(sig, 1, 32);
        END
        $verify$;

        -- Names, tokens, proofs --------------------------------------------------
        CREATE OR REPLACE FUNCTION palisade.check_lease(lease text) RETURNS void
        LANGUAGE plpgsql IMMUTABLE
        AS $check_lease$
        BEGIN
            -- [A-Za-z0-9._-]{1,128} as a length and a cheap pattern (a counted
            -- repetition costs PostgreSQL's regex engine some 10 us a call).
            IF lease IS NULL OR octet_length(lease) > 128 OR lease !~ '^[A-Za-z0-9._-]+$'
               OR lease IN ('.', '..') THEN
                RAISE EXCEPTION 'palisade: invalid lease name %', COALESCE(quote_literal(lease), 'NULL')
                    USING ERRCODE = 'PF003',
                          HINT = 'A lease name is [A-Za-z0-9._-]{1,128}, not . or ..';
            END IF;
        END
        $check_lease$;

        CREATE OR REPLACE FUNCTION palisade.b64url(part text) RETURNS bytea
        LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
        AS $b64$
            -- The bytes, or NULL when part is not their canonical encoding
            -- (unused bits of its last character set: another text for the
            -- same bytes, which a strict decoder such as the gateway's refuses).
            SELECT CASE WHEN rtrim(translate(encode(b, 'base64'), E'+/\n', '-_'), '=') = part THEN b END
            FROM (SELECT decode(rpad(translate(part, '-_', '+/'), (length(part) + 3) / 4 * 4, '='), 'base64') AS b) d
        $b64$;

        CREATE OR REPLACE FUNCTION palisade.refuse_proof(reason text) RETURNS void
        LANGUAGE plpgsql IMMUTABLE
        AS $refuse$
        BEGIN
            RAISE EXCEPTION 'palisade: proof refused: %', reason
                USING ERRCODE = 'PF007',
                      DETAIL = 'reason=' || reason,
                      HINT = 'Pass the lease''s JWT as the cluster granted it; after a key rotation or retirement run `palisade sql keys`.';
        END
        $refuse$;

        -- The claims of a JWT whose signature holds, or PF007. Cached or not;
        -- a cached proof only while its key (kid and x) is installed.
        CREATE OR REPLACE FUNCTION palisade.verified(proof text, OUT lease text, OUT token bigint,
                                                     OUT exp bigint, OUT kid text, OUT digest bytea,
                                                     OUT cached boolean, OUT x bytea)
        LANGUAGE plpgsql STABLE
        AS $verified$
        #variable_conflict use_variable
        DECLARE
            v_parts text[];
            v_header jsonb;
            v_claims jsonb;
            v_key record;
            v_header_bytes bytea;
            v_claims_bytes bytea;
            v_sig bytea;
            v_token numeric;
            v_exp numeric;
        BEGIN
            IF proof IS NULL OR octet_length(proof) > 4096 THEN
                PERFORM palisade.refuse_proof('not a JWT (null, or longer than 4096 bytes)');
            END IF;
            digest := sha256(convert_to(proof, 'UTF8'));
            SELECT c.lease, c.token, c.exp, c.kid, c.x INTO lease, token, exp, kid, x
                FROM palisade.proofs c JOIN palisade.keys k ON k.kid = c.kid AND k.x = c.x
                WHERE c.digest = digest;
            IF FOUND THEN
                cached := true;
                RETURN;
            END IF;
            cached := false;
            v_parts := string_to_array(proof, '.');
            IF cardinality(v_parts) <> 3 OR proof !~ '^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$' THEN
                PERFORM palisade.refuse_proof('not a JWT (three base64url parts joined by dots)');
            END IF;
            BEGIN
                v_header_bytes := palisade.b64url(v_parts[1]);
                v_claims_bytes := palisade.b64url(v_parts[2]);
                v_sig := palisade.b64url(v_parts[3]);
                v_header := convert_from(v_header_bytes, 'UTF8')::jsonb;
                v_claims := convert_from(v_claims_bytes, 'UTF8')::jsonb;
            EXCEPTION WHEN OTHERS THEN
                PERFORM palisade.refuse_proof('not a JWT (its header or claims are not base64url JSON)');
            END;
            -- One text per JWT: another spelling of the same bytes is refused.
            IF v_header_bytes IS NULL OR v_claims_bytes IS NULL OR v_sig IS NULL THEN
                PERFORM palisade.refuse_proof('not a JWT (a part is not canonical base64url)');
            END IF;
            IF jsonb_typeof(v_header) IS DISTINCT FROM 'object' OR v_header ->> 'alg' IS DISTINCT FROM 'EdDSA'
               OR jsonb_typeof(v_header -> 'kid') IS DISTINCT FROM 'string' THEN
                PERFORM palisade.refuse_proof('not signed with EdDSA by a named key (header alg, kid)');
            END IF;
            kid := v_header ->> 'kid';
            SELECT k.x, k.ax, k.ay INTO v_key FROM palisade.keys k WHERE k.kid = kid;
            IF NOT FOUND THEN
                PERFORM palisade.refuse_proof(format('signed by key %s, which this database does not trust (unknown or retired)',
                                                     quote_literal(left(kid, 64))));
            END IF;
            x := v_key.x;
            IF palisade.ed_verify(v_key.ax, v_key.ay, v_key.x,
                                  convert_to(v_parts[1] || '.' || v_parts[2], 'UTF8'), v_sig) IS NOT TRUE THEN
                PERFORM palisade.refuse_proof('bad signature');
            END IF;
            -- Signed by the cluster: the claims are its own.
            IF jsonb_typeof(v_claims) IS DISTINCT FROM 'object' OR v_claims ->> 'iss' IS DISTINCT FROM 'palisade'
               OR jsonb_typeof(v_claims -> 'lease') IS DISTINCT FROM 'string'
               OR jsonb_typeof(v_claims -> 'token') IS DISTINCT FROM 'number'
               OR jsonb_typeof(v_claims -> 'exp') IS DISTINCT FROM 'number' THEN
                PERFORM palisade.refuse_proof('not a lease token (claims iss, lease, token, exp)');
            END IF;
            v_token := (v_claims ->> 'token')::numeric;
            v_exp := (v_claims ->> 'exp')::numeric;
            IF v_token < 1 OR v_token > 9223372036854775807 OR v_token <> trunc(v_token)
               OR v_exp < 0 OR v_exp > 9223372036854775807 OR v_exp <> trunc(v_exp) THEN
                PERFORM palisade.refuse_proof('its token or exp is out of range');
            END IF;
            lease := v_claims ->> 'lease';
            token := v_token::bigint;
            exp := v_exp::bigint;
        END
        $verified$;

        CREATE OR REPLACE FUNCTION palisade.prove(proof text) RETURNS bigint
        LANGUAGE plpgsql VOLATILE SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        AS $prove$
        DECLARE
            v record;
            v_leeway integer;
        BEGIN
            SELECT * INTO v FROM palisade.verified(proof);
            SELECT s.exp_leeway_secs INTO v_leeway FROM palisade.settings s;
            IF NOT v.cached AND v.exp + v_leeway >= extract(epoch FROM clock_timestamp()) THEN
                INSERT INTO palisade.proofs AS c (digest, lease, token, exp, kid, x)
                    VALUES (v.digest, v.lease, v.token, v.exp, v.kid, v.x)
                    ON CONFLICT ON CONSTRAINT proofs_pkey DO NOTHING;
                -- The lease's expired proofs (and those of retired keys) go as
                -- a new one comes; rows another transaction holds are left
                -- for later, never waited for.
                DELETE FROM palisade.proofs c WHERE c.digest IN (
                    SELECT o.digest FROM palisade.proofs o
                    WHERE o.lease = v.lease
                      AND (o.exp + v_leeway < extract(epoch FROM clock_timestamp())
                           OR NOT EXISTS (SELECT 1 FROM palisade.keys k WHERE k.kid = o.kid AND k.x = o.x))
                    FOR UPDATE OF o SKIP LOCKED);
            END IF;
            RETURN v.token;
        END
        $prove$;
        COMMENT ON FUNCTION palisade.prove(text) IS
            'Checks a lease JWT''s signature (PF007 if it does not hold) and caches it, so palisade.fence with it is cheap. Answers its token.';

        -- The fence ---------------------------------------------------------------
        -- Internal functions (everything but the entry points fence,
        -- fence_unverified, prove, the triggers and the owner's tools) are
        -- neither SECURITY DEFINER nor SET search_path: they run inside an
        -- entry point, which pins both, and each of those costs a call.
        CREATE OR REPLACE FUNCTION palisade.mark(secret bytea, lease text, token bigint) RETURNS text
        LANGUAGE sql STABLE
        AS $mark$
            -- Keyed by the secret, bound to this backend and this transaction
            -- (an SQL function: inlined into its caller's cached expression).
            SELECT left(encode(sha256($1 || sha256(convert_to(
                       pg_backend_pid()::text || '/' || extract(epoch FROM transaction_timestamp())::text
                       || '/' || $2 || '/' || $3::text, 'UTF8'))), 'hex'), 32)
        $mark$;

        -- The fence itself, for a token (fence_unverified) or a proof (fence:
        -- token NULL; its lookup rides on the first read, so a proven JWT
        -- costs no statement of its own).
        CREATE OR REPLACE FUNCTION palisade.raise(lease text, token bigint, proof text) RETURNS bigint
        LANGUAGE plpgsql VOLATILE
        AS $raise$
        #variable_conflict error
        DECLARE
            v_lease CONSTANT text := lease;
            v_token bigint := token;
            v_proven text;
            v_proven_token bigint;
            v_exp bigint;
            v_leeway integer;
            v_fence bigint;
            v_seen bigint;
            v_done boolean := false;
            v_set text;
            v_announced bigint;
            v_secret bytea;
        BEGIN
            IF v_lease IS NULL OR octet_length(v_lease) > 128 OR v_lease !~ '^[A-Za-z0-9._-]+$' OR v_lease IN ('.', '..') THEN
                PERFORM palisade.check_lease(v_lease);  -- raises PF003
            END IF;
            IF proof IS NULL AND (v_token IS NULL OR v_token < 1) THEN
                RAISE EXCEPTION 'palisade: invalid fencing token % for lease %', COALESCE(v_token::text, 'NULL'), v_lease
                    USING ERRCODE = 'PF004',
                          HINT = 'A fencing token is the token of a Palisade grant: an integer >= 1.';
            END IF;

            -- A first look without a lock picks the lock mode. A token below
            -- one already proven for the lease (palisade.prove, committed) is
            -- stale too: the cluster granted a newer one. Refusing it at once
            -- lets a raise in waiting through (row locks do not queue: the
            -- old holder's new transactions would otherwise keep passing).
            -- A proof counts only while its key is installed.
            SELECT (SELECT f.fence FROM palisade.fences f WHERE f.lease = v_lease),
                   (SELECT max(p.token) FROM palisade.proofs p
                    WHERE p.lease = v_lease
                      AND EXISTS (SELECT 1 FROM palisade.keys pk WHERE pk.kid = p.kid AND pk.x = p.x)),
                   s.secret, s.exp_leeway_secs, c.lease, c.token, c.exp
                INTO v_fence, v_announced, v_secret, v_leeway, v_proven, v_proven_token, v_exp
                FROM palisade.settings s
                LEFT JOIN (palisade.proofs c JOIN palisade.keys ck ON ck.kid = c.kid AND ck.x = c.x)
                    ON proof IS NOT NULL AND octet_length(proof) <= 4096
                    AND c.digest = sha256(convert_to(proof, 'UTF8'));
            IF proof IS NOT NULL THEN
                IF v_proven IS NULL THEN  -- not proven before: the full check
                    SELECT v.lease, v.token, v.exp INTO v_proven, v_token, v_exp FROM palisade.verified(proof) v;
                ELSE
                    v_token := v_proven_token;
                END IF;
                IF v_proven IS DISTINCT FROM v_lease THEN
                    PERFORM palisade.refuse_proof(format('it is a proof for another lease than %s', v_lease));
                END IF;
                IF v_exp + v_leeway < extract(epoch FROM clock_timestamp()) THEN
                    PERFORM palisade.refuse_proof(format('it expired at %s (more than %s s ago)',
                                                         to_timestamp(v_exp), v_leeway));
                END IF;
            END IF;
            v_seen := v_fence;
            IF v_fence > v_token OR v_announced > v_token THEN
                v_fence := GREATEST(v_fence, v_token + 1);
                v_done := true;  -- stale: refused below
            ELSIF current_setting('transaction_isolation') IN ('read committed', 'read uncommitted') THEN
                -- Every statement reads the latest committed row version once
                -- it holds the row's lock (a raise that committed meanwhile).
                IF v_fence = v_token THEN
                    SELECT f.fence INTO v_fence FROM palisade.fences f WHERE f.lease = v_lease FOR SHARE;
                ELSE
                    IF v_fence IS NULL THEN
                        INSERT INTO palisade.fences AS f (lease, fence) VALUES (v_lease, v_token)
                            ON CONFLICT ON CONSTRAINT fences_pkey DO NOTHING;
                    END IF;
                    SELECT f.fence INTO v_fence FROM palisade.fences f WHERE f.lease = v_lease FOR UPDATE;
                    IF v_fence < v_token THEN
                        UPDATE palisade.fences f SET fence = v_token, raised_at = now() WHERE f.lease = v_lease;
                    END IF;
                END IF;
                v_done := true;
            ELSE
                -- REPEATABLE READ / SERIALIZABLE: locking or writing a row that
                -- changed after the snapshot fails (40001); caught here.
                BEGIN
                    IF v_fence = v_token THEN
                        SELECT f.fence INTO v_fence FROM palisade.fences f WHERE f.lease = v_lease FOR SHARE;
                    ELSE
                        IF v_fence IS NULL THEN
                            INSERT INTO palisade.fences AS f (lease, fence) VALUES (v_lease, v_token)
                                ON CONFLICT ON CONSTRAINT fences_pkey DO NOTHING;
                        END IF;
                        SELECT f.fence INTO v_fence FROM palisade.fences f WHERE f.lease = v_lease FOR UPDATE;
                        IF v_fence < v_token THEN
                            UPDATE palisade.fences f SET fence = v_token, raised_at = now() WHERE f.lease = v_lease;
                        END IF;
                    END IF;
                    v_done := true;
                EXCEPTION WHEN serialization_failure THEN
                    v_done := false;
                END;
                IF NOT v_done AND v_seen IS DISTINCT FROM v_token THEN
                    RAISE EXCEPTION 'palisade: the fence of lease % changed after this transaction''s snapshot; roll back and retry the transaction',
                            v_lease
                        USING ERRCODE = 'PF005',
                              DETAIL = format('lease=%s token=%s isolation=%s', v_lease, v_token,
                                              current_setting('transaction_isolation')),
                              HINT = 'A retry sees the new fence: it passes, or fails with PF001 if the token is stale.';
                END IF;
                -- The snapshot saw the fence at our token; any change since is a raise above it.
            END IF;
            IF NOT v_done OR v_fence > v_token THEN
                RAISE EXCEPTION 'palisade: token % of lease % is below its fence', v_token, v_lease
                    USING ERRCODE = 'PF001',
                          DETAIL = format('lease=%s token=%s', v_lease, v_token),
                          HINT = 'Another holder took over the lease: stop acting as its leader.';
            END IF;

            -- For the guard triggers: this transaction fenced this lease.
            v_set := COALESCE(current_setting('palisade.fenced', true), '');
            IF strpos(v_set, ',' || v_lease || ':') = 0 THEN
                PERFORM set_config('palisade.fenced',
                                   v_set || ',' || v_lease || ':' || v_token::text || ':' || palisade.mark(v_secret, v_lease, v_token),
                                   true);
            END IF;
            RETURN v_token;
        END
        $raise$;

        CREATE OR REPLACE FUNCTION palisade.fence(lease text, proof text) RETURNS bigint
        LANGUAGE plpgsql VOLATILE SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        AS $fence$
        #variable_conflict error
        DECLARE
            v_lease CONSTANT text := lease;
        BEGIN
            IF v_lease IS NULL OR octet_length(v_lease) > 128 OR v_lease !~ '^[A-Za-z0-9._-]+$' OR v_lease IN ('.', '..') THEN
                PERFORM palisade.check_lease(v_lease);  -- raises PF003
            END IF;
            IF proof IS NULL THEN
                PERFORM palisade.refuse_proof('not a JWT (null)');
            END IF;
            RETURN palisade.raise(v_lease, NULL, proof);
        END
        $fence$;
        COMMENT ON FUNCTION palisade.fence(text, text) IS
            'Call inside a transaction before its writes, with the lease''s JWT: refuses a bad proof (PF007) or a token below the lease''s fence (PF001), else raises the fence to it in this transaction. See palisade_fence.sql.';

        CREATE OR REPLACE FUNCTION palisade.fence_unverified(lease text, token bigint) RETURNS bigint
        LANGUAGE plpgsql VOLATILE SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        AS $unverified$
        BEGIN
            RETURN palisade.raise(lease, token, NULL);
        END
        $unverified$;
        COMMENT ON FUNCTION palisade.fence_unverified(text, bigint) IS
            'palisade.fence believing the token without proof: for roles trusted as much as the cluster (palisade.trust).';

        -- Guards ------------------------------------------------------------------
        CREATE OR REPLACE FUNCTION palisade.fenced_here(lease text) RETURNS boolean
        LANGUAGE plpgsql VOLATILE
        AS $fenced$
        DECLARE
            v_set text;
            v_at integer;
            v_entry text[];
            v_secret bytea;
            v_lease text;
            v_fence bigint;
        BEGIN
            IF lease IS NULL OR octet_length(lease) > 128 OR lease !~ '^[A-Za-z0-9._-]+$' OR lease IN ('.', '..') THEN
                RETURN false;  -- no such lease can have been fenced (and ',' or ':' cannot fool the parse)
            END IF;
            v_set := COALESCE(current_setting('palisade.fenced', true), '');
            v_at := strpos(v_set, ',' || lease || ':');
            IF v_at = 0 THEN
                RETURN false;
            END IF;
            -- ",lease:token:mac" up to the next comma
            v_entry := string_to_array(split_part(substr(v_set, v_at + 1), ',', 1), ':');
            IF cardinality(v_entry) <> 3 OR v_entry[1] <> lease OR v_entry[2] !~ '^[0-9]{1,19}$'
               OR v_entry[2]::numeric > 9223372036854775807 THEN
                RETURN false;
            END IF;
            SELECT s.secret INTO v_secret FROM palisade.settings s;
            IF v_entry[3] IS DISTINCT FROM palisade.mark(v_secret, lease, v_entry[2]::bigint) THEN
                RETURN false;
            END IF;
            -- A genuine mark is not enough: it may outlive the lock palisade.fence
            -- took (a savepoint rolled back, or a mark carried into a later
            -- transaction of the same query message, which shares its start
            -- time). Hold the fence row again and require it at the mark's token:
            -- a raise in flight is waited for, a raise committed refuses.
            v_lease := lease;
            IF current_setting('transaction_isolation') IN ('read committed', 'read uncommitted') THEN
                SELECT f.fence INTO v_fence FROM palisade.fences f WHERE f.lease = v_lease FOR SHARE;
            ELSE
                BEGIN
                    SELECT f.fence INTO v_fence FROM palisade.fences f WHERE f.lease = v_lease FOR SHARE;
                EXCEPTION WHEN serialization_failure THEN
                    RETURN false;  -- raised after this transaction's snapshot
                END;
            END IF;
            RETURN v_fence IS NOT DISTINCT FROM v_entry[2]::bigint;
        END
        $fenced$;
        COMMENT ON FUNCTION palisade.fenced_here(text) IS
            'Whether this transaction passed palisade.fence for the lease (what the guard triggers check).';

        -- Whether a guard's row trigger, fired on a partition of the table it
        -- guards (a clone: a partitioned table's row triggers are cloned to
        -- every partition, those attached later too), may go on: only when
        -- the partition has the TRUNCATE trigger the guard makes on each
        -- partition (or a guard of its own), else PF002. A partition attached
        -- after the guard has none: every write to it is refused until the
        -- guard runs again, so no row written under the guard sits in a
        -- partition whose TRUNCATE is not refused.
        CREATE OR REPLACE FUNCTION palisade.partition_guarded(op text, rel oid, guarded text) RETURNS void
        LANGUAGE plpgsql STABLE
        AS $partition$
        BEGIN
            IF NOT EXISTS (SELECT 1 FROM pg_trigger t
                           WHERE t.tgrelid = rel AND NOT t.tgisinternal AND t.tgparentid = 0
                             AND t.tgname IN ('palisade_guard_partition', 'palisade_guard_truncate', 'palisade_guard_table')) THEN
                RAISE EXCEPTION 'palisade: % on %, a partition of guarded table % attached after the guard was made: run the guard of % again',
                        op, rel::regclass, guarded::oid::regclass, guarded::oid::regclass
                    USING ERRCODE = 'PF002',
                          DETAIL = format('table=%s guarded=%s', rel::regclass, guarded::oid::regclass),
                          HINT = 'palisade.guard (or guard_table) of a partitioned table makes a TRUNCATE trigger on each of its partitions; one attached later has none until the guard runs again.';
            END IF;
        END
        $partition$;

        -- The partitioned table whose guard covers tbl (a partition), or NULL.
        CREATE OR REPLACE FUNCTION palisade.guarded_ancestor(tbl regclass) RETURNS regclass
        LANGUAGE sql STABLE
        AS $ancestor$
            SELECT a.relid::regclass FROM pg_partition_ancestors(tbl) a
            JOIN pg_trigger t ON t.tgrelid = a.relid
            WHERE a.relid <> tbl AND NOT t.tgisinternal AND t.tgparentid = 0
              AND t.tgname IN ('palisade_guard', 'palisade_guard_table')
            LIMIT 1
        $ancestor$;

        CREATE OR REPLACE FUNCTION palisade.guard_row_trigger() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        AS $guard_row$
        DECLARE
            v_column text := TG_ARGV[0];
            v_new text;
            v_old text;
        BEGIN
            -- Only the lease column is read, and only while it is text or
            -- varchar: this runs as the schema's owner, and to_jsonb(NEW) (or
            -- a cast) would run any cast a table's owner defined for another
            -- column's type, as the schema's owner.
            IF NOT EXISTS (SELECT 1 FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
                           WHERE a.attrelid = TG_RELID AND a.attname = v_column AND NOT a.attisdropped
                             AND (a.atttypid IN ('text'::regtype, 'varchar'::regtype)
                                  OR (t.typtype = 'd' AND t.typbasetype IN ('text'::regtype, 'varchar'::regtype)))) THEN
                RAISE EXCEPTION 'palisade: the lease column % of %.% is no longer text or varchar; guard the table again',
                        quote_ident(v_column), quote_ident(TG_TABLE_SCHEMA), quote_ident(TG_TABLE_NAME)
                    USING ERRCODE = 'PF002';
            END IF;
            -- TG_ARGV[1]: the guarded table's oid. Fired on another table,
            -- this is a clone on a partition, which needs its TRUNCATE trigger.
            IF TG_NARGS > 1 AND TG_RELID::text <> TG_ARGV[1] THEN
                PERFORM palisade.partition_guarded(TG_OP, TG_RELID, TG_ARGV[1]);
            END IF;
            IF TG_OP <> 'DELETE' THEN
                EXECUTE format('SELECT ($1).%I', v_column) INTO v_new USING NEW;
                IF palisade.fenced_here(v_new) IS NOT TRUE THEN
                    RAISE EXCEPTION 'palisade: % on %.% for lease % in a transaction that did not call palisade.fence for it',
                            TG_OP, quote_ident(TG_TABLE_SCHEMA), quote_ident(TG_TABLE_NAME),
                            COALESCE(quote_literal(left(v_new, 160)), 'NULL')
                        USING ERRCODE = 'PF002',
                              DETAIL = format('table=%I.%I column=%I', TG_TABLE_SCHEMA, TG_TABLE_NAME, v_column),
                              HINT = 'Call palisade.fence(lease, proof) first in this transaction.';
                END IF;
            END IF;
            IF TG_OP <> 'INSERT' THEN
                EXECUTE format('SELECT ($1).%I', v_column) INTO v_old USING OLD;
                IF (TG_OP = 'DELETE' OR v_old IS DISTINCT FROM v_new) AND palisade.fenced_here(v_old) IS NOT TRUE THEN
                    RAISE EXCEPTION 'palisade: % on %.% of a row of lease % in a transaction that did not call palisade.fence for it',
                            TG_OP, quote_ident(TG_TABLE_SCHEMA), quote_ident(TG_TABLE_NAME),
                            COALESCE(quote_literal(left(v_old, 160)), 'NULL')
                        USING ERRCODE = 'PF002',
                              DETAIL = format('table=%I.%I column=%I', TG_TABLE_SCHEMA, TG_TABLE_NAME, v_column),
                              HINT = 'Call palisade.fence(lease, proof) first in this transaction.';
                END IF;
            END IF;
            RETURN NULL;
        END
        $guard_row$;

        CREATE OR REPLACE FUNCTION palisade.guard_table_trigger() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        AS $guard_table$
        BEGIN
            IF TG_NARGS <> 1 THEN  -- ('column', <name>): TRUNCATE of a table guarded by a lease column
                RAISE EXCEPTION 'palisade: TRUNCATE of %.%, guarded by lease column %, is refused',
                        quote_ident(TG_TABLE_SCHEMA), quote_ident(TG_TABLE_NAME), quote_ident(TG_ARGV[1])
                    USING ERRCODE = 'PF002',
                          HINT = 'Delete the rows in fenced transactions, or palisade.unguard the table first.';
            END IF;
            IF palisade.fenced_here(TG_ARGV[0]) IS NOT TRUE THEN
                RAISE EXCEPTION 'palisade: % on %.% (guarded by lease %) in a transaction that did not call palisade.fence for it',
                        TG_OP, quote_ident(TG_TABLE_SCHEMA), quote_ident(TG_TABLE_NAME), quote_literal(TG_ARGV[0])
                    USING ERRCODE = 'PF002',
                          DETAIL = format('table=%I.%I lease=%s', TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_ARGV[0]),
                          HINT = 'Call palisade.fence(lease, proof) first in this transaction.';
            END IF;
            RETURN NULL;
        END
        $guard_table$;

        -- guard_table's row trigger (TG_ARGV: the lease, the guarded table's
        -- oid): a statement trigger fires only for the table a statement
        -- names, never for rows reached through a partitioned or inheritance
        -- parent; this fires for each row, however it is reached.
        CREATE OR REPLACE FUNCTION palisade.guard_lease_row_trigger() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        AS $guard_rows$
        BEGIN
            IF TG_RELID::text <> TG_ARGV[1] THEN
                PERFORM palisade.partition_guarded(TG_OP, TG_RELID, TG_ARGV[1]);
            END IF;
            IF palisade.fenced_here(TG_ARGV[0]) IS NOT TRUE THEN
                RAISE EXCEPTION 'palisade: % on %.% (guarded by lease %) in a transaction that did not call palisade.fence for it',
                        TG_OP, quote_ident(TG_TABLE_SCHEMA), quote_ident(TG_TABLE_NAME), quote_literal(TG_ARGV[0])
                    USING ERRCODE = 'PF002',
                          DETAIL = format('table=%I.%I lease=%s', TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_ARGV[0]),
                          HINT = 'Call palisade.fence(lease, proof) first in this transaction.';
            END IF;
            IF TG_OP = 'DELETE' THEN
                RETURN OLD;
            END IF;
            RETURN NEW;
        END
        $guard_rows$;

        CREATE OR REPLACE FUNCTION palisade.unguard(tbl regclass) RETURNS void
        LANGUAGE plpgsql
        SET search_path = pg_catalog, pg_temp
        AS $unguard$
        DECLARE
            v_rel regclass;
            v_name name;
            v_cover regclass;
        BEGIN
            v_cover := palisade.guarded_ancestor(tbl);
            IF v_cover IS NOT NULL THEN
                RAISE EXCEPTION 'palisade.unguard: % is a partition of %, whose guard covers it; unguard % instead', tbl, v_cover, v_cover
                    USING ERRCODE = 'PF002';
            END IF;
            -- The table's own triggers (dropping a partitioned table's row
            -- trigger drops its clones too), and the TRUNCATE triggers its
            -- guard made on its partitions.
            FOR v_rel, v_name IN
                SELECT t.tgrelid::regclass, t.tgname FROM pg_trigger t
                WHERE NOT t.tgisinternal AND t.tgparentid = 0
                  AND ((t.tgrelid = tbl
                        AND t.tgname IN ('palisade_guard', 'palisade_guard_truncate', 'palisade_guard_table',
                                         'palisade_guard_rows', 'palisade_guard_partition'))
                       OR (t.tgname = 'palisade_guard_partition'
                           AND t.tgrelid IN (SELECT pt.relid FROM pg_partition_tree(tbl) pt)))
            LOOP
                EXECUTE format('DROP TRIGGER %I ON %s', v_name, v_rel);
            END LOOP;
        END
        $unguard$;
        COMMENT ON FUNCTION palisade.unguard(regclass) IS
            'Removes the palisade guard triggers of the table (and those its guard made on its partitions).';

        CREATE OR REPLACE FUNCTION palisade.guardable(tbl regclass) RETURNS void
        LANGUAGE plpgsql
        SET search_path = pg_catalog, pg_temp
        AS $guardable$
        DECLARE
            v_kind "char";
            v_other regclass;
        BEGIN
            IF tbl IS NULL THEN
                RAISE EXCEPTION 'palisade.guard: the table must not be null' USING ERRCODE = '22004';
            END IF;
            SELECT c.relkind INTO v_kind FROM pg_class c WHERE c.oid = tbl;
            IF v_kind IS DISTINCT FROM 'r' AND v_kind IS DISTINCT FROM 'p' THEN
                RAISE EXCEPTION 'palisade.guard: % is not a table', tbl USING ERRCODE = '42809';
            END IF;
            IF v_kind = 'r' AND EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhparent = tbl) THEN
                RAISE EXCEPTION 'palisade.guard: % has inheritance children, which a guard on it would not cover (a write straight into a child); guard each child instead: its guard holds for writes through % too',
                        tbl, tbl
                    USING ERRCODE = 'PF002',
                          HINT = 'Triggers of an inheritance parent never fire for a write that names a child.';
            END IF;
            v_other := palisade.guarded_ancestor(tbl);
            IF v_other IS NOT NULL THEN
                RAISE EXCEPTION 'palisade.guard: % is a partition of %, whose guard covers it; to guard its partitions one by one, palisade.unguard % first',
                        tbl, v_other, v_other
                    USING ERRCODE = 'PF002';
            END IF;
            IF v_kind = 'p' THEN
                SELECT pt.relid::regclass INTO v_other FROM pg_partition_tree(tbl) pt
                    JOIN pg_class c ON c.oid = pt.relid
                    WHERE c.relkind NOT IN ('r', 'p') LIMIT 1;
                IF v_other IS NOT NULL THEN
                    RAISE EXCEPTION 'palisade.guard: partition % of % is not a table (a foreign table?), whose TRUNCATE a guard cannot refuse',
                            v_other, tbl
                        USING ERRCODE = 'PF002';
                END IF;
                SELECT t.tgrelid::regclass INTO v_other FROM pg_partition_tree(tbl) pt
                    JOIN pg_trigger t ON t.tgrelid = pt.relid
                    WHERE pt.relid <> tbl AND NOT t.tgisinternal AND t.tgparentid = 0
                      AND t.tgname IN ('palisade_guard', 'palisade_guard_table')
                    LIMIT 1;
                IF v_other IS NOT NULL THEN
                    RAISE EXCEPTION 'palisade.guard: partition % of % is guarded on its own; palisade.unguard it first (the guard of % covers it)',
                            v_other, tbl, tbl
                        USING ERRCODE = 'PF002';
                END IF;
            END IF;
        END
        $guardable$;

        CREATE OR REPLACE FUNCTION palisade.guard(tbl regclass, lease_column text) RETURNS void
        LANGUAGE plpgsql
        SET search_path = pg_catalog, pg_temp
        AS $guard$
        DECLARE
            v_column_type oid;
            v_type oid;
            v_base oid;
            v_part regclass;
        BEGIN
            PERFORM palisade.guardable(tbl);
            IF lease_column IS NULL THEN
                RAISE EXCEPTION 'palisade.guard: the lease column must not be null' USING ERRCODE = '22004';
            END IF;
            SELECT a.atttypid INTO v_column_type FROM pg_attribute a
                WHERE a.attrelid = tbl AND a.attname = lease_column AND a.attnum > 0 AND NOT a.attisdropped;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'palisade.guard: table % has no column %', tbl, quote_ident(lease_column)
                    USING ERRCODE = '42703';
            END IF;
            v_base := v_column_type;
            LOOP  -- through domains to the base type
                SELECT CASE WHEN t.typtype = 'd' THEN t.typbasetype END INTO v_type FROM pg_type t WHERE t.oid = v_base;
                EXIT WHEN v_type IS NULL;
                v_base := v_type;
            END LOOP;
            IF v_base NOT IN ('text'::regtype, 'varchar'::regtype) THEN
                RAISE EXCEPTION 'palisade.guard: lease column %.% is of type %; it must be text or varchar',
                        tbl, quote_ident(lease_column), v_column_type::regtype
                    USING ERRCODE = '42804';
            END IF;
            PERFORM palisade.unguard(tbl);
            -- A row trigger: it fires for the table's rows however they are
            -- reached (through a parent too); on a partitioned table it is
            -- cloned to every partition, those attached later too.
            EXECUTE format('CREATE TRIGGER palisade_guard AFTER INSERT OR UPDATE OR DELETE ON %s '
                           'FOR EACH ROW EXECUTE FUNCTION palisade.guard_row_trigger(%L, %L)',
                           tbl, lease_column, tbl::oid::text);
            EXECUTE format('CREATE TRIGGER palisade_guard_truncate BEFORE TRUNCATE ON %s '
                           'FOR EACH STATEMENT EXECUTE FUNCTION palisade.guard_table_trigger(''column'', %L)', tbl, lease_column);
            -- A TRUNCATE that names a partition fires only that partition's
            -- TRUNCATE triggers: each gets one.
            FOR v_part IN SELECT pt.relid::regclass FROM pg_partition_tree(tbl) pt WHERE pt.relid <> tbl LOOP
                EXECUTE format('CREATE TRIGGER palisade_guard_partition BEFORE TRUNCATE ON %s '
                               'FOR EACH STATEMENT EXECUTE FUNCTION palisade.guard_table_trigger(''column'', %L)', v_part, lease_column);
            END LOOP;
        END
        $guard$;
        COMMENT ON FUNCTION palisade.guard(regclass, text) IS
            'Refuses writes to the table, or to every partition of a partitioned table (PF002), unless the transaction called palisade.fence for the row''s lease (in lease_column; the old row''s too). TRUNCATE is refused.';

        CREATE OR REPLACE FUNCTION palisade.guard_table(tbl regclass, lease text) RETURNS void
        LANGUAGE plpgsql
        SET search_path = pg_catalog, pg_temp
        AS $guard_table_fn$
        DECLARE
            v_part regclass;
        BEGIN
            PERFORM palisade.guardable(tbl);
            PERFORM palisade.check_lease(lease);
            PERFORM palisade.unguard(tbl);
            -- Once per statement that names the table (TRUNCATE too), and for
            -- each row however it is reached (through a parent too; cloned to
            -- every partition of a partitioned table, those attached later too).
            EXECUTE format('CREATE TRIGGER palisade_guard_table BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON %s '
                           'FOR EACH STATEMENT EXECUTE FUNCTION palisade.guard_table_trigger(%L)', tbl, lease);
            EXECUTE format('CREATE TRIGGER palisade_guard_rows BEFORE INSERT OR UPDATE OR DELETE ON %s '
                           'FOR EACH ROW EXECUTE FUNCTION palisade.guard_lease_row_trigger(%L, %L)',
                           tbl, lease, tbl::oid::text);
            FOR v_part IN SELECT pt.relid::regclass FROM pg_partition_tree(tbl) pt WHERE pt.relid <> tbl LOOP
                EXECUTE format('CREATE TRIGGER palisade_guard_partition BEFORE TRUNCATE ON %s '
                               'FOR EACH STATEMENT EXECUTE FUNCTION palisade.guard_table_trigger(%L)', v_part, lease);
            END LOOP;
        END
        $guard_table_fn$;
        COMMENT ON FUNCTION palisade.guard_table(regclass, text) IS
            'Refuses every write to the table, or to every partition of a partitioned table (PF002), unless the transaction called palisade.fence for this lease.';

        -- Keys and roles ------------------------------------------------------------
        -- No caller can hold a lock this needs: no foreign key points at
        -- palisade.keys, no caller locks palisade.settings, and proofs held
        -- by a transaction are skipped. Should anything still make it wait
        -- (another set_keys, the owner's own locks), it fails after 5 s
        -- (55P03) rather than hang.
        CREATE OR REPLACE FUNCTION palisade.set_keys(jwks jsonb) RETURNS integer
        LANGUAGE plpgsql VOLATILE
        SET search_path = pg_catalog, pg_temp
        SET lock_timeout = '5s'
        AS $set_keys$
        DECLARE
            v_index numeric := COALESCE((jwks ->> 'applied_index')::numeric, 0);
            v_key jsonb;
            v_x bytea;
            v_point numeric[];
            v_kids text[] := '{}';
        BEGIN
            IF jsonb_typeof(jwks -> 'keys') IS DISTINCT FROM 'array' OR jsonb_array_length(jwks -> 'keys') = 0 THEN
                RAISE EXCEPTION 'palisade.set_keys: not a JWKS with at least one key' USING ERRCODE = '22023';
            END IF;
            IF v_index < (SELECT s.keys_index FROM palisade.settings s) THEN
                RETURN 0;  -- an older key set than the one installed: nothing changes
            END IF;
            FOR v_key IN SELECT * FROM jsonb_array_elements(jwks -> 'keys') LOOP
                IF v_key ->> 'kty' IS DISTINCT FROM 'OKP' OR v_key ->> 'crv' IS DISTINCT FROM 'Ed25519'
                   OR jsonb_typeof(v_key -> 'kid') IS DISTINCT FROM 'string'
                   OR jsonb_typeof(v_key -> 'x') IS DISTINCT FROM 'string'
                   OR (v_key ->> 'x') !~ '^[A-Za-z0-9_-]{43}$' THEN
                    RAISE EXCEPTION 'palisade.set_keys: key % is not an Ed25519 JWK (kty OKP, crv Ed25519, kid, x)',
                            left(v_key::text, 200) USING ERRCODE = '22023';
                END IF;
                v_x := palisade.b64url(v_key ->> 'x');
                IF v_x IS NULL THEN
                    RAISE EXCEPTION 'palisade.set_keys: key %: x is not canonical base64url', v_key ->> 'kid'
                        USING ERRCODE = '22023';
                END IF;
                v_point := palisade.ed_decompress(v_x);
                IF v_point IS NULL THEN
                    RAISE EXCEPTION 'palisade.set_keys: key % is not a point of Ed25519', v_key ->> 'kid'
                        USING ERRCODE = '22023';
                END IF;
                IF palisade.ed_small_order(v_point[1], v_point[2]) THEN
                    RAISE EXCEPTION 'palisade.set_keys: key % is a point of small order, which would accept signatures nobody made',
                            v_key ->> 'kid'
                        USING ERRCODE = '22023';
                END IF;
                INSERT INTO palisade.keys AS k (kid, x, ax, ay) VALUES (v_key ->> 'kid', v_x, v_point[1], v_point[2])
                    ON CONFLICT (kid) DO UPDATE SET x = EXCLUDED.x, ax = EXCLUDED.ax, ay = EXCLUDED.ay
                    WHERE k.x IS DISTINCT FROM EXCLUDED.x;
                v_kids := v_kids || (v_key ->> 'kid');
            END LOOP;
            -- Retired keys go. The proofs they signed count no more (a proof
            -- counts only while its key is installed); they are deleted here
            -- unless a transaction holds them (skipped, never waited for:
            -- the lease's next palisade.prove or set_keys deletes them).
            DELETE FROM palisade.keys k WHERE k.kid <> ALL (v_kids);
            DELETE FROM palisade.proofs c WHERE c.digest IN (
                SELECT o.digest FROM palisade.proofs o
                WHERE NOT EXISTS (SELECT 1 FROM palisade.keys k WHERE k.kid = o.kid AND k.x = o.x)
                FOR UPDATE OF o SKIP LOCKED);
            UPDATE palisade.settings SET keys_index = v_index::bigint;
            RETURN cardinality(v_kids);
        END
        $set_keys$;
        COMMENT ON FUNCTION palisade.set_keys(jsonb) IS
            'Installs the cluster''s JWKS (GET /v1/jwks) as the keys proofs are checked against; keys not in it are retired, with the proofs they signed. An older set (applied_index) changes nothing. Waits 5 s at most for a lock.';

        CREATE OR REPLACE FUNCTION palisade.allow(role name) RETURNS void
        LANGUAGE plpgsql VOLATILE
        SET search_path = pg_catalog, pg_temp
        AS $allow$
        BEGIN
            EXECUTE format('GRANT USAGE ON SCHEMA palisade TO %I', role);
            EXECUTE format('GRANT EXECUTE ON FUNCTION palisade.fence(text, text), palisade.prove(text) TO %I', role);
        END
        $allow$;
        COMMENT ON FUNCTION palisade.allow(name) IS 'Lets a role fence with proof (palisade.fence, palisade.prove).';

        CREATE OR REPLACE FUNCTION palisade.trust(role name) RETURNS void
        LANGUAGE plpgsql VOLATILE
        SET search_path = pg_catalog, pg_temp
        AS $trust$
        BEGIN
            PERFORM palisade.allow(role);
            EXECUTE format('GRANT EXECUTE ON FUNCTION palisade.fence_unverified(text, bigint) TO %I', role);
        END
        $trust$;
        COMMENT ON FUNCTION palisade.trust(name) IS
            'Lets a role call palisade.fence_unverified, which believes any token: only for roles trusted as much as the cluster.';
    END IF;

    -- Version 3: guards made by older versions. A guard_table guard had only
    -- its statement trigger, which rows reached through a parent never fire:
    -- it gains its row trigger. Version 1 also guarded partitioned tables,
    -- whose TRUNCATE triggers never fired for a TRUNCATE naming a partition:
    -- their partitions gain theirs, and a palisade.guard row trigger there is
    -- made again to refuse partitions attached later. (Version 2 refused
    -- partitioned tables and tables with inheritance children; a version 1
    -- guard on a table with children still covers no child: guard them.)
    IF v_installed < 3 THEN
        FOR v_guard IN
            SELECT t.tgrelid::regclass AS tbl, t.tgname AS kind, t.tgnargs AS nargs, c.relkind AS relkind,
                   pg_catalog.convert_from(pg_catalog.substr(t.tgargs, 1, pg_catalog.position(t.tgargs, '\x00'::bytea) - 1),
                                           'UTF8') AS arg
            FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
            WHERE t.tgname IN ('palisade_guard', 'palisade_guard_table') AND NOT t.tgisinternal AND t.tgparentid = 0
              AND t.tgfoid IN ('palisade.guard_row_trigger()'::pg_catalog.regprocedure,
                               'palisade.guard_table_trigger()'::pg_catalog.regprocedure)
            -- partitioned tables first, outermost first: their row triggers'
            -- clones make those of the tables below them
            ORDER BY c.relkind <> 'p', (SELECT pg_catalog.count(*) FROM pg_catalog.pg_partition_ancestors(t.tgrelid))
        LOOP
            IF v_guard.kind = 'palisade_guard_table'
               AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger r
                               WHERE r.tgrelid = v_guard.tbl AND r.tgname = 'palisade_guard_rows') THEN
                EXECUTE pg_catalog.format('CREATE TRIGGER palisade_guard_rows BEFORE INSERT OR UPDATE OR DELETE ON %s '
                                          'FOR EACH ROW EXECUTE FUNCTION palisade.guard_lease_row_trigger(%L, %L)',
                                          v_guard.tbl, v_guard.arg, v_guard.tbl::oid::text);
            END IF;
            IF v_guard.relkind = 'p' THEN
                IF v_guard.kind = 'palisade_guard' AND v_guard.nargs = 1 THEN
                    EXECUTE pg_catalog.format('DROP TRIGGER palisade_guard ON %s', v_guard.tbl);
                    EXECUTE pg_catalog.format('CREATE TRIGGER palisade_guard AFTER INSERT OR UPDATE OR DELETE ON %s '
                                              'FOR EACH ROW EXECUTE FUNCTION palisade.guard_row_trigger(%L, %L)',
                                              v_guard.tbl, v_guard.arg, v_guard.tbl::oid::text);
                END IF;
                FOR v_part IN
                    SELECT pt.relid::regclass FROM pg_catalog.pg_partition_tree(v_guard.tbl) pt
                    JOIN pg_catalog.pg_class pc ON pc.oid = pt.relid
                    WHERE pt.relid <> v_guard.tbl AND pc.relkind IN ('r', 'p')
                      AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger r
                                      WHERE r.tgrelid = pt.relid AND r.tgname = 'palisade_guard_partition')
                LOOP
                    IF v_guard.kind = 'palisade_guard' THEN
                        EXECUTE pg_catalog.format('CREATE TRIGGER palisade_guard_partition BEFORE TRUNCATE ON %s FOR EACH STATEMENT '
                                                  'EXECUTE FUNCTION palisade.guard_table_trigger(''column'', %L)', v_part, v_guard.arg);
                    ELSE
                        EXECUTE pg_catalog.format('CREATE TRIGGER palisade_guard_partition BEFORE TRUNCATE ON %s FOR EACH STATEMENT '
                                                  'EXECUTE FUNCTION palisade.guard_table_trigger(%L)', v_part, v_guard.arg);
                    END IF;
                END LOOP;
            END IF;
        END LOOP;
    END IF;

    -- Nothing is callable but by the owner until palisade.allow / trust.
    REVOKE ALL ON ALL FUNCTIONS IN SCHEMA palisade FROM PUBLIC;

    INSERT INTO palisade.version AS v (part, version) VALUES ('fence', v_file)
        ON CONFLICT (part) DO UPDATE SET version = EXCLUDED.version, installed_at = pg_catalog.now();
END
$palisade_install$;
