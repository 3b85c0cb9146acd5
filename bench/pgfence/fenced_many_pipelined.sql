-- verified_many.sql with BEGIN and the fence pipelined (sent together, one
-- round trip; prepared statements), as a driver that pipelines can do: the
-- same number of round trips as unfenced.sql.
\set id random(1, 100000)
\set lease random(1, 1000)
\startpipeline
BEGIN;
SELECT palisade.fence(b.lease, b.jwt) FROM bench_jwts b WHERE b.n = :lease;
\endpipeline
UPDATE bench_rows SET v = v + 1 WHERE id = :id;
END;
