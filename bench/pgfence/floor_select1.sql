-- The floor: fenced_many.sql with `SELECT 1` in place of the fence. What
-- any statement added to the transaction costs, whatever it does.
\set id random(1, 100000)
BEGIN;
SELECT 1;
UPDATE bench_rows SET v = v + 1 WHERE id = :id;
END;
