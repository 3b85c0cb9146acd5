#!/usr/bin/env bash
# Builds `palisade:local` from a palisade binary this host already built,
# without a registry and without another compile: the binary (debug info
# stripped) and the shared libraries it loads, packed as a root filesystem
# and imported with `docker import`. CI's docker-compose test packs the
# debug binary the tests just built; the Dockerfile's `offline` stage packs
# a static release binary instead (docker-compose.yml's comment).
#
#   docker/build-image.sh target/debug/palisade
set -euo pipefail
bin=${1:?usage: docker/build-image.sh PATH-TO-PALISADE}
[ -x "$bin" ] || { echo "error: $bin is not an executable" >&2; exit 2; }
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/tmp"
chmod 1777 "$root/tmp"
objcopy --strip-debug "$bin" "$root/palisade"
# Every library the binary loads, at the same place in the image (a static
# binary has none).
ldd "$bin" 2>/dev/null | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }' | sort -u |
  while read -r lib; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
tar -C "$root" -c . | docker import -c 'ENTRYPOINT ["/palisade"]' - palisade:local >/dev/null
