#!/usr/bin/env bash
# What a fenced transaction costs in PostgreSQL: pgbench against a throwaway
# server this script starts (and removes), with palisade_fence.sql installed.
#
#   bash bench/pgfence/run.sh                       # durable commits (the defaults)
#   SYNC=off bash bench/pgfence/run.sh              # synchronous_commit=off: CPU-bound
#   DURATION=10 ROUNDS=3 CLIENTS="1 16 64" bash bench/pgfence/run.sh
#
# 1. The same transaction (one UPDATE of a random row of 100 000) with and
#    without a fence before it, the lease drawn from 1 000 (fence == token:
#    the holder's path), at each client count:
#    a. the floor: `SELECT 1` in place of the fence, what any added
#       statement costs whatever it does;
#    b. palisade.fence_unverified(lease, token): no proof (trusted roles);
#    c. palisade.fence(lease, jwt): the JWT checked (proven beforehand, as
#       the SDKs do once per JWT: a hash and a cache lookup per call);
#    d. c against b: what verification adds;
#    e. c with BEGIN and the fence pipelined (sent together, as a pipelining
#       driver can): the same number of round trips as unfenced.
# 2. At 64 clients: all on one lease against each on its own (64 leases).
# 3. A first verification (a JWT not proven before): palisade.prove, timed.
# The JWTs are signed by a key of the script's own (jwts.py, python3 with
# cryptography), installed with palisade.set_keys as `palisade sql keys`
# installs the cluster's. FENCE_SQL=file installs another fence schema (an
# older release's, say; its scripts must match).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
sql="${FENCE_SQL:-$repo/client-sdk/python/src/palisade/sql/palisade_fence.sql}"
DURATION="${DURATION:-10}"
ROUNDS="${ROUNDS:-3}"
CLIENTS="${CLIENTS:-1 16 64}"
SYNC="${SYNC:-on}"

bindir="${PALISADE_PG_BIN:-}"
if [ -z "$bindir" ]; then
  bindir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)"
fi
if [ -z "$bindir" ] || [ ! -x "$bindir/pgbench" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    bindir="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
  else
    echo "run.sh: no PostgreSQL binaries (set PALISADE_PG_BIN, or apt-get install postgresql)" >&2
    exit 1
  fi
fi

as_pg=()
dir="$(mktemp -d /tmp/pgfence-bench.XXXXXX)"
chmod 755 "$dir"
if [ "$(id -u)" = 0 ]; then
  chown postgres: "$dir"
  as_pg=(runuser -u postgres --)
fi
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
stop() {
  "${as_pg[@]}" "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap stop EXIT

"${as_pg[@]}" "$bindir/initdb" -D "$dir/data" -A trust -U postgres -E UTF8 --locale=C \
  --no-instructions >/dev/null
"${as_pg[@]}" "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 -o \
  "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200 -c synchronous_commit=$SYNC" \
  start >/dev/null
export PGHOST=127.0.0.1 PGPORT="$port" PGUSER=postgres PGDATABASE=postgres
psql=("$bindir/psql" -X -q -v ON_ERROR_STOP=1)

if ! python3 -c 'import cryptography' 2>/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-cryptography >/dev/null
  else
    echo "run.sh: jwts.py needs python3 with cryptography (apt-get install python3-cryptography)" >&2
    exit 1
  fi
fi
python3 "$here/jwts.py" "$dir/jwks.json" >"$dir/jwts.tsv"

"${psql[@]}" -f "$sql"
"${psql[@]}" -o /dev/null -v jwks="$(cat "$dir/jwks.json")" <<SQL
CREATE TABLE bench_rows (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0);
INSERT INTO bench_rows (id) SELECT g FROM generate_series(1, 100000) g;
CREATE TABLE bench_jwts (n int PRIMARY KEY, lease text NOT NULL, token bigint NOT NULL, jwt text NOT NULL);
\copy bench_jwts FROM '$dir/jwts.tsv'
SELECT palisade.set_keys(:'jwks'::jsonb);
-- Every JWT used below is proven (cached) and its lease fenced at token 1
-- first: the runs measure the holder's path, not a lease's first use.
SELECT count(palisade.prove(jwt)) FROM bench_jwts WHERE n < 20000;
SELECT count(palisade.fence_unverified(lease, token)) FROM bench_jwts WHERE n < 20000;
VACUUM ANALYZE;
CHECKPOINT;
SQL
postmaster="$(head -1 "$dir/data/postmaster.pid")"
tck="$(getconf CLK_TCK)"
# The server's CPU time so far, in clock ticks: the postmaster's own, its
# reaped children's (backends that ended) and its live children's.
server_cpu() {
  local total=0 pid stat
  stat="$(cut -d')' -f2- "/proc/$postmaster/stat")"
  total=$(echo "$stat" | awk '{print $12 + $13 + $14 + $15}')
  for pid in $(ps -o pid= --ppid "$postmaster"); do
    stat="$(cut -d')' -f2- "/proc/$pid/stat" 2>/dev/null)" || continue
    total=$(( total + $(echo "$stat" | awk '{print $12 + $13}') ))
  done
  echo "$total"
}

# run SCRIPT CLIENTS MODE -> "tps cpu_us_per_transaction"
# CPU: the server's and pgbench's, per transaction: unlike tps it barely
# depends on what else the machine runs.
run() {
  local threads=$(( $2 < 2 ? $2 : 2 ))
  local out before after
  before="$(server_cpu)"
  out="$("$bindir/pgbench" -n -M "$3" -T "$DURATION" -c "$2" -j "$threads" -f "$here/$1" 2>&1; times)" || {
    echo "$out" >&2
    exit 1
  }
  sleep 0.3  # the postmaster reaps the ended backends
  after="$(server_cpu)"
  local tps txns client
  tps="$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -1)"
  txns="$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' | head -1)"
  if [ -z "$tps" ] || [ -z "$txns" ] || [ "$txns" = 0 ]; then
    echo "$out" >&2
    exit 1
  fi
  # `times`: its last line is the children's (pgbench's) user and system time.
  client="$(echo "$out" | tail -1 | awk '{
    t = 0
    for (i = 1; i <= 2; i++) { split($i, a, "m"); sub("s", "", a[2]); t += a[1] * 60 + a[2] }
    print t }')"
  echo "$tps $(awk -v s="$((after - before))" -v k="$tck" -v c="$client" -v n="$txns" \
    'BEGIN { printf "%.1f", (s / k + c) * 1e6 / n }')"
}

median() { tr ' ' '\n' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "PostgreSQL $("$bindir/postgres" --version | awk '{print $3}'), synchronous_commit=$SYNC," \
  "$(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); $ROUNDS rounds of ${DURATION}s per cell"
echo "tps: the median of the rounds; cpu: server + pgbench CPU per transaction (us), median;"
echo "ratios: fenced / base for tps, base / fenced for cpu (both: higher is better, 1 = free)"
printf '%-44s %7s %9s %9s %6s %8s %8s %6s\n' "measurement" "clients" "base tps" "fenc tps" "ratio" \
  "base cpu" "fenc cpu" "ratio"

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }

compare() {  # label clients mode base_script fenced_script
  local base=() fenced=() base_cpu=() fenced_cpu=() r x
  for r in $(seq 1 "$ROUNDS"); do
    x="$(run "$4" "$2" "$3")"; base+=("${x%% *}"); base_cpu+=("${x##* }")
    x="$(run "$5" "$2" "$3")"; fenced+=("${x%% *}"); fenced_cpu+=("${x##* }")
  done
  local b f bc fc
  b="$(echo "${base[*]}" | median)"
  f="$(echo "${fenced[*]}" | median)"
  bc="$(echo "${base_cpu[*]}" | median)"
  fc="$(echo "${fenced_cpu[*]}" | median)"
  printf '%-44s %7s %9.0f %9.0f %6s %8.1f %8.1f %6s\n' "$1" "$2" "$b" "$f" "$(ratio "$f" "$b")" \
    "$bc" "$fc" "$(ratio "$bc" "$fc")"
  echo "    rounds: tps ${base[*]} | ${fenced[*]}; cpu ${base_cpu[*]} | ${fenced_cpu[*]}" >>"$detail"
}
detail="$dir/rounds.txt"

for c in $CLIENTS; do
  compare "floor: SELECT 1 for the fence, own trip" "$c" prepared unfenced.sql floor_select1.sql
  compare "unverified/unfenced, fence own trip" "$c" prepared unfenced.sql fenced_many.sql
  compare "verified/unfenced, fence own trip" "$c" prepared unfenced.sql verified_many.sql
  compare "verified/unverified, fence own trip" "$c" prepared fenced_many.sql verified_many.sql
  compare "verified/unfenced, BEGIN+fence pipelined" "$c" prepared unfenced.sql fenced_many_pipelined.sql
done
compare "one lease / a lease per client (verified)" 64 prepared fenced_spread.sql fenced_one.sql
echo "a first verification (palisade.prove of a JWT not proven before), 20 JWTs:"
"$bindir/psql" -X -A -t <<'SQL'
DO $$
DECLARE
  v_jwt text;
  v_started timestamptz;
  v_ms numeric[] := '{}';
BEGIN
  FOR v_jwt IN SELECT jwt FROM bench_jwts WHERE n >= 20000 ORDER BY n LOOP
    v_started := clock_timestamp();
    PERFORM palisade.prove(v_jwt);
    v_ms := v_ms || round(extract(epoch FROM clock_timestamp() - v_started)::numeric * 1000, 1);
  END LOOP;
  RAISE NOTICE 'ms: %', v_ms;
END
$$;
SQL
echo "each round (base | fenced):"
cat "$detail"
