-- The baseline: one UPDATE in a transaction, no fence.
\set id random(1, 100000)
BEGIN;
UPDATE bench_rows SET v = v + 1 WHERE id = :id;
END;
