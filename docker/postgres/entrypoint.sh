#!/bin/sh
# The entrypoint of palisade-postgres:local: initdb on the first start
# (password authentication, $POSTGRES_PASSWORD for the `postgres` role), then
# the server in the foreground, listening on every address of the container.
set -e
D=/var/lib/postgresql/data
BIN=/usr/lib/postgresql/15/bin
if [ ! -s "$D/PG_VERSION" ]; then
  echo "$POSTGRES_PASSWORD" >/tmp/pw
  "$BIN/initdb" -D "$D" -U postgres --pwfile=/tmp/pw -A scram-sha-256 -E UTF8 --locale=C
  rm -f /tmp/pw
  echo "host all all 0.0.0.0/0 scram-sha-256" >>"$D/pg_hba.conf"
fi
exec "$BIN/postgres" -D "$D" -c listen_addresses='*' -c unix_socket_directories=/run/postgresql
