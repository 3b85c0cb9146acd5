-- Every client on one lease: the holder's transactions share its fence.
\set id random(1, 100000)
BEGIN;
SELECT palisade.fence('bench-one', 1);
UPDATE bench_rows SET v = v + 1 WHERE id = :id;
END;
