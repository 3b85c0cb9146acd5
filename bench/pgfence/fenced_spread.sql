-- Each client on a lease of its own (client_id 0..c-1), with proof.
\set id random(1, 100000)
BEGIN;
SELECT palisade.fence(b.lease, b.jwt) FROM bench_jwts b WHERE b.n = 10000 + :client_id;
UPDATE bench_rows SET v = v + 1 WHERE id = :id;
END;
