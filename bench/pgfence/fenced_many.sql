-- The same transaction fenced, each on one of 1 000 leases (fence == token:
-- the holder's path, a shared lock).
\set id random(1, 100000)
\set lease random(1, 1000)
BEGIN;
SELECT palisade.fence('bench-' || :lease, 1);
UPDATE bench_rows SET v = v + 1 WHERE id = :id;
END;
