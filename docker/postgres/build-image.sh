#!/usr/bin/env bash
# Builds `palisade-postgres:local`, the PostgreSQL 15 of docker-compose's
# `postgres` profile, without a registry: this host's Debian PostgreSQL 15
# (its binaries, the libraries they load, its share files and time zones),
# a shell for the entrypoint, packed as a root filesystem and imported with
# `docker import`. Needs `apt-get install -y postgresql` on the host.
#
#   docker/postgres/build-image.sh        # then: docker-compose --profile postgres up -d
set -euo pipefail
cd "$(dirname "$0")"
PG=/usr/lib/postgresql/15
if [ ! -x "$PG/bin/postgres" ]; then
  echo "error: needs PostgreSQL 15 on this host: apt-get install -y postgresql" >&2
  exit 2
fi
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/usr/bin "$root"/usr/lib "$root"/usr/lib64 "$root"/usr/local/bin "$root"/etc \
  "$root"/tmp "$root"/var/lib/postgresql "$root"/run/postgresql
ln -s usr/bin "$root/bin"
ln -s usr/lib "$root/lib"
ln -s usr/lib64 "$root/lib64"
chmod 1777 "$root/tmp"

copy() { # each path, symlinks followed, at the same place in the image
  for f in "$@"; do
    mkdir -p "$root$(dirname "$f")"
    cp -aL "$f" "$root$f"
  done
}
copy "$PG" /usr/share/postgresql/15 /usr/share/zoneinfo /usr/bin/dash /usr/bin/rm
ln -s dash "$root/usr/bin/sh"
# Every library the binaries and PostgreSQL's modules (plpgsql) load.
for f in "$PG"/bin/* "$PG"/lib/*.so /usr/bin/dash /usr/bin/rm; do
  ldd "$f" 2>/dev/null | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }'
done | sort -u | while read -r lib; do copy "$lib"; done

echo 'postgres:x:999:999:PostgreSQL:/var/lib/postgresql:/bin/sh' >"$root/etc/passwd"
echo 'postgres:x:999:' >"$root/etc/group"
cp entrypoint.sh "$root/usr/local/bin/palisade-postgres"
chmod 755 "$root/usr/local/bin/palisade-postgres"
chown 999:999 "$root/var/lib/postgresql" "$root/run/postgresql"

tar -C "$root" --numeric-owner -c . | docker import \
  -c 'USER postgres' \
  -c 'ENV POSTGRES_PASSWORD=palisade' \
  -c 'EXPOSE 5432' \
  -c 'VOLUME /var/lib/postgresql' \
  -c 'ENTRYPOINT ["/usr/local/bin/palisade-postgres"]' \
  - palisade-postgres:local
