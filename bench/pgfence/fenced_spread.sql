-- Each client on a lease of its own (client_id 0..c-1).
\set id random(1, 100000)
BEGIN;
SELECT palisade.fence('bench-c' || :client_id, 1);
UPDATE bench_rows SET v = v + 1 WHERE id = :id;
END;
