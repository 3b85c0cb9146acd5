#!/usr/bin/env bash
# Palisade and etcd side by side, in one run on this machine (release builds,
# both durable with default fsync, both on loopback). Installs etcd from
# Debian's packages if it is missing. Prints a table with ratios; raw JSON goes
# to bench/results/. Only ratios from one run mean anything on a shared machine.
#   bash bench/compare.sh [SECONDS_PER_POINT]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-5}

if ! command -v etcd >/dev/null 2>&1; then
  echo "--- installing etcd (Debian etcd-server)"
  sudo_cmd=""; [ "$(id -u)" = 0 ] || sudo_cmd=sudo
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q etcd-server etcd-client >/dev/null
fi
# palisade-bench runs the palisade binary next to it.
cargo build --release --locked -q -p palisade -p palisade-bench
bin=target/release/palisade-bench
mkdir -p bench/results
echo "--- palisade election cluster"
"$bin" election --seconds "$seconds" --json > bench/results/palisade-election.json
echo "--- palisade gateway"
"$bin" gateway --seconds "$seconds" --json > bench/results/palisade-gateway.json
echo "--- etcd"
"$bin" etcd --seconds "$seconds" --json > bench/results/etcd.json

python3 - <<'PY'
import json
p = json.load(open("bench/results/palisade-election.json"))
g = json.load(open("bench/results/palisade-gateway.json"))
e = json.load(open("bench/results/etcd.json"))
def pick(rows, what, c):
    for r in rows:
        if r["what"].startswith(what) and r["concurrency"] == c:
            return r
    return None
print(f"{'work':<34} {'conc':>4} {'palisade ops/s':>15} {'etcd ops/s':>11} {'ratio':>6}   {'p50 ms (P/e)':>16}")
def row(name, prow, erow, c):
    if prow and erow:
        ratio = prow["ops_per_sec"] / erow["ops_per_sec"] if erow["ops_per_sec"] else float("inf")
        print(f"{name:<34} {c:>4} {prow['ops_per_sec']:>15.0f} {erow['ops_per_sec']:>11.0f} {ratio:>6.2f}   {prow['p50_us']/1000:>7.2f}/{erow['p50_us']/1000:<7.2f}")
for c in (1, 16, 64):
    row("acquire+release vs grant+put+revoke", pick(p["load"], "acquire+release", c), pick(e["load"], "etcd grant+put+revoke", c), c)
for c in (1, 16, 64):
    row("renew vs lease keepalive", pick(p["load"], "renew", c), pick(e["load"], "etcd lease keepalive", c), c)
for c in (1, 16, 64):
    row("mix (renew/cycle/read) vs etcd mix", pick(p["load"], "mix", c), pick(e["load"], "etcd mix", c), c)
for c in (1, 16, 64):
    row("gateway fenced PUT vs 1-node put", pick(g, "gateway fenced PUT", c), pick(e["load"], "etcd single-node put", c), c)
pf, ef = p["failover"], e["failover"]
print(f"failover median ms: palisade {pf['median_ms']:.0f} (min {pf['min_ms']:.0f}, max {pf['max_ms']:.0f}); "
      f"etcd {ef['median_ms']:.0f} (min {ef['min_ms']:.0f}, max {ef['max_ms']:.0f}); ratio {pf['median_ms']/ef['median_ms']:.2f}")
PY
