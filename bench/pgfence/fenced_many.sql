-- The same transaction fenced without proof (palisade.fence_unverified, a
-- trusted role's path), each on one of 1 000 leases (fence == token: the
-- holder's path, a shared row lock). The lease and token come from
-- bench_jwts, as for the verified script, so both pay the same lookup.
\set id random(1, 100000)
\set lease random(1, 1000)
BEGIN;
SELECT palisade.fence_unverified(b.lease, b.token) FROM bench_jwts b WHERE b.n = :lease;
UPDATE bench_rows SET v = v + 1 WHERE id = :id;
END;
