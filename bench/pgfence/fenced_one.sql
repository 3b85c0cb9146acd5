-- Every client on one lease, with proof: the holder's transactions share
-- its fence.
\set id random(1, 100000)
BEGIN;
SELECT palisade.fence(b.lease, b.jwt) FROM bench_jwts b WHERE b.n = 0;
UPDATE bench_rows SET v = v + 1 WHERE id = :id;
END;
