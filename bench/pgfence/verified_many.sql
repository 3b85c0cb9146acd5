-- fenced_many.sql with proof: palisade.fence(lease, jwt), each lease's JWT
-- proven (cached) beforehand, as the SDKs do once per JWT.
\set id random(1, 100000)
\set lease random(1, 1000)
BEGIN;
SELECT palisade.fence(b.lease, b.jwt) FROM bench_jwts b WHERE b.n = :lease;
UPDATE bench_rows SET v = v + 1 WHERE id = :id;
END;
