#!/usr/bin/env bash
# Palisade and etcd side by side, in one run on this machine (release builds,
# both durable with default fsync, both on loopback). etcd is driven three
# ways: through its JSON gateway, and through its native gRPC client
# (etcd-client, one HTTP/2 connection, a keepalive stream per lease) given
# all three endpoints and given the leader alone. Installs etcd and
# protoc (for the gRPC client) from Debian's packages if they are missing.
# Prints a table with ratios against each; raw JSON goes to bench/results/.
# Only ratios from one run mean anything on a shared machine.
#   bash bench/compare.sh [SECONDS_PER_POINT]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-5}

missing=""
command -v etcd >/dev/null 2>&1 || missing="$missing etcd-server etcd-client"
command -v protoc >/dev/null 2>&1 || missing="$missing protobuf-compiler"
if [ -n "$missing" ]; then
  echo "--- installing$missing (Debian)"
  sudo_cmd=""; [ "$(id -u)" = 0 ] || sudo_cmd=sudo
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q $missing >/dev/null
fi
# palisade-bench runs the palisade binary next to it.
cargo build --release --locked -q -p palisade
cargo build --release --locked -q -p palisade-bench --features etcd-grpc
bin=target/release/palisade-bench
mkdir -p bench/results

# What the etcd that runs checks before it answers a lease renewal at its
# leader (etcd-io/etcd#16822 added a ReadIndex in v3.4.31 / v3.5.13; #18428
# skips it in v3.4.34 / v3.5.16 while the Raft ticker ran recently, relying
# on CheckQuorum to demote a partitioned leader).
etcd_version=$(etcd --version 2>/dev/null | awk '/etcd Version/ {print $3}')
at_least() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1)" = "$2" ]; }
renewal_check() {
  local v=$1 read_index skip
  case "$v" in
    3.4.*) read_index=3.4.31; skip=3.4.34 ;;
    3.5.*) read_index=3.5.13; skip=3.5.16 ;;
    *) echo "unknown for this version (3.6 and later: a ReadIndex skipped while the Raft ticker ran recently)"; return ;;
  esac
  if ! at_least "$v" "$read_index"; then
    echo "none: the leader's lessor renews without confirming leadership"
  elif ! at_least "$v" "$skip"; then
    echo "a ReadIndex round (shared by waiting renewals) before each renewal"
  else
    echo "a ReadIndex round, skipped while its Raft ticker ran within 3 ticks (CheckQuorum demotes a cut-off leader)"
  fi
}
etcd_note="etcd ${etcd_version:-?} checks before renewing a lease: $(renewal_check "${etcd_version:-0}")"
echo "--- $etcd_note"
echo "--- palisade election cluster"
"$bin" election --seconds "$seconds" --json > bench/results/palisade-election.json
echo "--- palisade gateway"
"$bin" gateway --seconds "$seconds" --json > bench/results/palisade-gateway.json
echo "--- palisade: one SDK client holding 10 000 leases"
"$bin" hold --seconds 15 --json > bench/results/palisade-hold.json
echo "--- etcd (JSON gateway and gRPC; 10 000 leases on a keepalive stream each)"
"$bin" etcd --seconds "$seconds" --hold-leases 10000 --hold-seconds 15 --json > bench/results/etcd.json

ETCD_NOTE="$etcd_note" python3 - <<'PY'
import json, os
p = json.load(open("bench/results/palisade-election.json"))
g = json.load(open("bench/results/palisade-gateway.json"))
e = json.load(open("bench/results/etcd.json"))
def pick(rows, what, c):
    for r in rows:
        if r["what"].startswith(what) and r["concurrency"] == c:
            return r
    return None
# etcd's gRPC client twice: given all three endpoints ("grpc", as users
# often connect: most calls then reach a follower, which forwards them) and
# given the leader alone ("grpc@L", etcd at its best). P/grpcL is the ratio
# to hold ourselves to.
print(f"{'work':<36} {'conc':>4} {'palisade/s':>11} {'etcd json/s':>11} {'etcd grpc/s':>11} {'grpc@L/s':>11} {'P/json':>6} {'P/grpc':>6} {'P/grpcL':>7}   {'p50 ms P/json/grpc/grpc@L':>26}")
def row(name, prow, jrow, grow, c, lrow=None):
    if not prow:
        return
    def ratio(other):
        return f"{prow['ops_per_sec'] / other['ops_per_sec']:>6.2f}" if other and other["ops_per_sec"] else f"{'-':>6}"
    def ops(r):
        return f"{r['ops_per_sec']:>11.0f}" if r else f"{'-':>11}"
    def p50(r):
        return f"{r['p50_us']/1000:.2f}" if r else "-"
    print(f"{name:<36} {c:>4} {ops(prow)} {ops(jrow)} {ops(grow)} {ops(lrow)} {ratio(jrow)} {ratio(grow)} {ratio(lrow):>7}   {p50(prow)}/{p50(jrow)}/{p50(grow)}/{p50(lrow)}")
def exact(rows, what, c):
    for r in rows:
        if r["what"] == what and r["concurrency"] == c:
            return r
    return pick(rows, what, c)
for c in (1, 16, 64):
    row("acquire+release vs grant+put+revoke", pick(p["load"], "acquire+release", c), pick(e["load"], "etcd grant+put+revoke", c), pick(e["load"], "etcd grpc grant+put+revoke", c), c, pick(e["load"], "etcd grpc@leader grant+put+revoke", c))
for c in (1, 16, 64):
    row("renew vs lease keepalive", exact(p["load"], "renew", c), pick(e["load"], "etcd lease keepalive", c), pick(e["load"], "etcd grpc lease keepalive", c), c, pick(e["load"], "etcd grpc@leader lease keepalive", c))
# Every other renew row (HTTP/1.1, the SDK's batching, batch requests)
# against the same keepalive figures.
others = sorted({r["what"] for r in p["load"] if r["what"].startswith("renew") and r["what"] != "renew"})
for what in others:
    for c in (1, 16, 64):
        row(what[:36], exact(p["load"], what, c), pick(e["load"], "etcd lease keepalive", c), pick(e["load"], "etcd grpc lease keepalive", c), c, pick(e["load"], "etcd grpc@leader lease keepalive", c))
for c in (1, 16, 64):
    row("mix (renew/cycle/read) vs etcd mix", pick(p["load"], "mix", c), pick(e["load"], "etcd mix", c), None, c)
for c in (1, 16, 64):
    row("gateway fenced PUT vs 1-node put", pick(g, "gateway fenced PUT", c), pick(e["load"], "etcd single-node put", c), pick(e["load"], "etcd grpc single-node put", c), c)
ph, eh = json.load(open("bench/results/palisade-hold.json")), e.get("hold") or {}
if eh:
    print(f"10 000 leases renewed every ttl/3 (3 s): leader CPU per renewal palisade {ph['leader_cpu_us_per_renewal']:.1f} us "
          f"({ph['renewals_per_sec']:.0f}/s, {ph['leader_cpu_percent']:.0f}% of a core, batches of {ph['mean_batch']:.0f}), "
          f"etcd {eh['leader_cpu_us_per_keepalive']:.1f} us ({eh['keepalives_per_sec']:.0f}/s, {eh['leader_cpu_percent']:.0f}%); "
          f"ratio {eh['leader_cpu_us_per_keepalive'] / ph['leader_cpu_us_per_renewal']:.2f}x less CPU")
pf, ef = p["failover"], e["failover"]
print(os.environ["ETCD_NOTE"])
print("palisade checks before renewing: the leader lease (a quorum ack sent < min election timeout - margin ago), no round of its own")
print(f"failover median ms: palisade {pf['median_ms']:.0f} (min {pf['min_ms']:.0f}, max {pf['max_ms']:.0f}); "
      f"etcd {ef['median_ms']:.0f} (min {ef['min_ms']:.0f}, max {ef['max_ms']:.0f}); ratio {pf['median_ms']/ef['median_ms']:.2f}")
PY
