#!/usr/bin/env bash
# The docker-compose cluster, tested for real on this machine's Docker engine.
#
# Builds the static binary and the offline image (no registry needed), brings
# up docker-compose.yml, then:
#   1. stale writer: A writes, A lets go, B acquires + fences + writes,
#      A's late write (its JWT still valid) is refused by the fence (409);
#   2. kill the Raft leader's container: another node leads, the lease survives;
#   3. docker pause a worker container holding a lease past its ttl: after
#      unpause its writes are refused and it reports the loss;
#   4. disconnect an election node from the network and reconnect it: it
#      catches up;
#   5. restart the gateway container: the data survived;
#   6. profile `postgres` (the PostgreSQL image built from this host's
#      packages, no registry): a stale writer refused across two gateways
#      on one database, and one of them killed while the other serves.
# Clients speak TLS and carry the generated admin key (step 0 checks that
# a client without one is refused).
# Tears everything down on exit, failure included. Prints what it checked.
set -euo pipefail
cd "$(dirname "$0")/../.."

project=palisadetest
export ELECTION1_PORT=27001 ELECTION2_PORT=27002 ELECTION3_PORT=27003 GATEWAY_PORT=28080
export GATEWAY_PG1_PORT=28081 GATEWAY_PG2_PORT=28082
export DOCKER_BUILDKIT=0
compose() { docker-compose -p "$project" "$@"; }
bin=${PALISADE_BIN:-target/x86_64-unknown-linux-gnu/release/palisade}
E=https://127.0.0.1:27001,https://127.0.0.1:27002,https://127.0.0.1:27003
G=https://127.0.0.1:28080
inner_election=https://election1:7001,https://election2:7001,https://election3:7001
creds=$(mktemp -d)

step() { echo "--- $*"; }
ok() { echo "ok: $*"; }
fail() {
  echo "FAILED: $*"
  compose logs --tail 30 || true
  docker logs --tail 30 "${project}_worker" 2>&1 | sed 's/^/worker | /' || true
  exit 1
}
json() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }

cleanup() {
  [ -n "${KEEP:-}" ] && return 0
  docker rm -f "${project}_worker" >/dev/null 2>&1 || true
  COMPOSE_PROFILES=postgres compose down -v --remove-orphans >/dev/null 2>&1 || true
}
trap 'cleanup; rm -rf "$creds"' EXIT

if [ -n "${PALISADE_BIN:-}" ]; then
  # CI: the binary the tests just built, packed with its libraries (no
  # second compile; a release build took about a third of CI's time).
  step "image from $PALISADE_BIN"
  docker/build-image.sh "$PALISADE_BIN"
else
  step "static binary and offline image"
  RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --locked --target x86_64-unknown-linux-gnu
  docker build -q --target offline -t palisade:local . >/dev/null
fi
ok "image palisade:local built without a registry"

cleanup
compose up -d
wait_healthy() {
  for service in "$@"; do
    for _ in $(seq 1 60); do
      id=$(compose ps -q "$service")
      status=$(docker inspect -f '{{.State.Health.Status}}' "$id" 2>/dev/null || echo none)
      [ "$status" = healthy ] && break
      sleep 1
    done
    [ "$status" = healthy ] || fail "$service is $status"
  done
}
wait_healthy election1 election2 election3 gateway
ok "3 election nodes and the gateway are healthy"

step "0. clients need TLS and an API key"
# The cluster's CA and the admin key, from the volume the one-shot services wrote.
docker cp "$(compose ps -q policy)":/certs/ca.pem "$creds/ca.pem"
docker cp "$(compose ps -q policy)":/certs/admin.key "$creds/admin.key"
if out=$("$bin" lease acquire nokey --holder X --election "$E" --ca "$creds/ca.pem" 2>&1); then fail "acquire without a key: $out"; fi
echo "$out" | grep -q unauthorized || fail "acquire without a key refused for the wrong reason: $out"
export PALISADE_CA="$creds/ca.pem" PALISADE_API_KEY_FILE="$creds/admin.key"
ok "no key: $out; with the generated admin key from here on"

retry() { # retry N CMD...: run CMD until it succeeds, at most N times, 0.2 s apart
  local n=$1; shift
  for _ in $(seq 1 "$n"); do "$@" && return 0; sleep 0.2; done
  return 1
}
# The leader's id, as the first answering node sees it; fails while that node
# knows none (between elections, or on a leader whose lease lapsed), so
# callers retry it rather than read "None".
leader() {
  local id
  # (status exits 1 while a node is down: its document still names the leader)
  id=$({ "$bin" cluster status --election "$E" --json || true; } | json '["leader"]') || return 1
  [ "$id" != None ] && echo "$id"
}

# let_go LEASE TOKEN SECRET: A releases its grant; succeeds once A no
# longer holds it (a retried release whose first answer was lost is fine).
let_go() {
  "$bin" lease release "$1" --holder A --token "$2" --secret "$3" --election "$E" >/dev/null 2>&1 || true
  [ "$("$bin" lease get "$1" --election "$E" --json | json '["holder"]')" != A ]
}

step "1. stale writer refused"
# A lets go by releasing (not by expiry): its JWT stays valid for minutes,
# so the late write can be refused only by the fence, whatever the
# machine's speed (a 1.5 s lease's JWT once expired first on a loaded
# machine, and the refusal was a 401).
A=$(retry 50 "$bin" lease acquire stale --holder A --ttl-ms 600000 --election "$E" --json)
JWT_A=$(echo "$A" | json '["jwt"]'); TOKEN_A=$(echo "$A" | json '["token"]'); SECRET_A=$(echo "$A" | json '["secret"]')
retry 50 "$bin" object put stale/x --value fromA --jwt "$JWT_A" --gateway "$G" >/dev/null || fail "A's first write"
retry 50 let_go stale "$TOKEN_A" "$SECRET_A" || fail "A's release"
B=$("$bin" lease acquire stale --holder B --ttl-ms 600000 --wait-ms 10000 --election "$E" --json)
JWT_B=$(echo "$B" | json '["jwt"]'); TOKEN_B=$(echo "$B" | json '["token"]'); SECRET_B=$(echo "$B" | json '["secret"]')
[ "$TOKEN_B" -gt "$TOKEN_A" ] || fail "token $TOKEN_B is not above $TOKEN_A"
"$bin" fence bump stale --jwt "$JWT_B" --gateway "$G" >/dev/null
"$bin" object put stale/x --value fromB --jwt "$JWT_B" --gateway "$G" >/dev/null
if late=$("$bin" object put stale/x --value lateA --jwt "$JWT_A" --gateway "$G" 2>&1); then fail "late write accepted"; fi
echo "$late" | grep -q stale_token || fail "late write refused for the wrong reason: $late"
[ "$("$bin" object get stale/x --gateway "$G")" = fromB ] || fail "object changed"
ok "A (token $TOKEN_A) refused after B (token $TOKEN_B) fenced: $late"

step "2. kill the Raft leader's container"
old=$(retry 50 leader) || fail "no node names a leader"
docker kill "$(compose ps -q "election$old")" >/dev/null
retry 50 "$bin" lease renew stale --holder B --token "$TOKEN_B" --secret "$SECRET_B" --election "$E" >/dev/null || fail "renew after leader kill"
new=$(retry 50 leader)
[ -n "$new" ] && [ "$new" != "$old" ] || fail "no new leader (old $old, new $new)"
held=$("$bin" lease get stale --election "$E" --json)
[ "$(echo "$held" | json '["holder"]')" = B ] && [ "$(echo "$held" | json '["token"]')" = "$TOKEN_B" ] || fail "lease changed: $held"
compose start "election$old" >/dev/null
wait_healthy "election$old"
ok "leader $old killed; node $new leads; B still holds token $TOKEN_B"

step "3. pause a worker holding a lease past its ttl"
docker run -d --name "${project}_worker" --network "${project}_default" -v "${project}_certs:/certs:ro" palisade:local \
  worker --ca /certs/ca.pem --api-key-file /certs/admin.key --lease paused --holder W --key paused/worker --ttl-ms 1500 --interval-ms 100 \
  --election "$inner_election" --gateway https://gateway:8080 >/dev/null
retry 100 sh -c "'$bin' object get paused/worker --gateway '$G' >/dev/null 2>&1" || fail "worker never wrote"
docker pause "${project}_worker" >/dev/null
C=$("$bin" lease acquire paused --holder C --ttl-ms 600000 --wait-ms 10000 --election "$E" --json)
JWT_C=$(echo "$C" | json '["jwt"]')
"$bin" fence bump paused --jwt "$JWT_C" --gateway "$G" >/dev/null
"$bin" object put paused/worker --value fromC --jwt "$JWT_C" --gateway "$G" >/dev/null
docker unpause "${project}_worker" >/dev/null
sleep 1.5
[ "$("$bin" object get paused/worker --gateway "$G")" = fromC ] || fail "the paused worker overwrote C's value"
# No pipe into an early-exiting grep: with pipefail, the writer's SIGPIPE
# fails the check.
worker_logs=$(docker logs "${project}_worker" 2>&1)
report=""
while IFS= read -r line; do
  case "$line" in lost*) report=$line; break ;; esac
done <<< "$worker_logs"
[ -n "$report" ] || fail "the worker did not report the loss"
docker rm -f "${project}_worker" >/dev/null
ok "worker paused past its ttl: C's value stands; the worker reported: $report"

step "4. partition an election node and heal it"
l=$(retry 50 leader) || fail "no node names a leader"; f=$(( l % 3 + 1 ))
container=$(compose ps -q "election$f")
docker network disconnect "${project}_default" "$container"
for i in 1 2 3 4 5; do retry 50 "$bin" lease acquire "partition-$i" --holder P --ttl-ms 600000 --election "$E" >/dev/null || fail "acquire with a node cut off"; done
target=$({ "$bin" cluster status --election "$E" --json || true; } | json '["commit_index"]')
# Reconnect under the service name: compose's DNS alias is not restored otherwise.
docker network connect --alias "election$f" "${project}_default" "$container"
# Ask the node itself (from inside its container: published ports may not
# follow a container that was disconnected and reconnected).
caught_up() {
  applied=$({ docker exec "$container" /palisade cluster status --election https://127.0.0.1:7001 \
    --ca /certs/ca.pem --api-key-file /certs/admin.key --json 2>/dev/null || true; } \
    | json '["applied_index"]' 2>/dev/null || echo 0)
  [ "${applied:-0}" != None ] && [ "${applied:-0}" -ge "$target" ]
}
retry 100 caught_up || fail "node $f did not catch up to $target"
ok "node $f cut off while 5 leases were granted, then caught up to index $target"

step "5. restart the gateway container"
docker restart "$(compose ps -q gateway)" >/dev/null
wait_healthy gateway
[ "$(retry 50 "$bin" object get stale/x --gateway "$G")" = fromB ] || fail "object lost on restart"
fence=$("$bin" fence get stale --gateway "$G" --json | json '["fence"]')
[ "$fence" = "$TOKEN_B" ] || fail "fence is $fence, expected $TOKEN_B"
ok "gateway restarted: stale/x = fromB, fence = $fence"

step "6. two gateways on PostgreSQL (profile postgres)"
if [ ! -x /usr/lib/postgresql/15/bin/postgres ] && [ -z "${PALISADE_PG_STRICT:-}" ]; then
  echo "skipped: no PostgreSQL 15 on this host to build the image from (apt-get install -y postgresql)"
  echo "compose test: 5 scenarios passed, the PostgreSQL one skipped"
  exit 0
fi
docker/postgres/build-image.sh >/dev/null
ok "image palisade-postgres:local built from this host's PostgreSQL, without a registry"
export COMPOSE_PROFILES=postgres
compose up -d postgres gateway-pg1 gateway-pg2
wait_healthy postgres gateway-pg1 gateway-pg2
P1=https://127.0.0.1:28081
P2=https://127.0.0.1:28082
A=$(retry 50 "$bin" lease acquire pgstale --holder A --ttl-ms 600000 --election "$E" --json)
JWT_A=$(echo "$A" | json '["jwt"]'); TOKEN_A=$(echo "$A" | json '["token"]'); SECRET_A=$(echo "$A" | json '["secret"]')
retry 50 "$bin" object put pgstale/x --value fromA --jwt "$JWT_A" --gateway "$P1" >/dev/null || fail "A's write through gateway-pg1"
retry 50 let_go pgstale "$TOKEN_A" "$SECRET_A" || fail "A's release"
B=$("$bin" lease acquire pgstale --holder B --ttl-ms 600000 --wait-ms 10000 --election "$E" --json)
JWT_B=$(echo "$B" | json '["jwt"]')
"$bin" object put pgstale/x --value fromB --jwt "$JWT_B" --gateway "$P2" >/dev/null
if late=$("$bin" object put pgstale/x --value lateA --jwt "$JWT_A" --gateway "$P1" 2>&1); then fail "A's late write accepted by gateway-pg1"; fi
echo "$late" | grep -q stale_token || fail "late write refused for the wrong reason: $late"
[ "$("$bin" object get pgstale/x --gateway "$P1")" = fromB ] || fail "gateway-pg1 does not see B's write"
docker kill "$(compose ps -q gateway-pg1)" >/dev/null
[ "$(retry 50 "$bin" object get pgstale/x --gateway "$P2")" = fromB ] || fail "gateway-pg2 lost B's write"
"$bin" object put pgstale/y --value after --jwt "$JWT_B" --gateway "$P2" >/dev/null || fail "gateway-pg2 stopped serving"
ok "B wrote through gateway-pg2 after A through gateway-pg1; A's late write refused by gateway-pg1 ($late); gateway-pg1 killed, gateway-pg2 serves"

echo "compose test: all 6 scenarios passed"
