#!/usr/bin/env bash
# CI for the Go client: gofmt, go vet, then go test against a `palisade dev`
# cluster the tests start themselves (binary: PALISADE_BIN, default the
# repository's target/debug/palisade).
#
#   PALISADE_BIN=target/debug/palisade bash client-sdk/go/ci.sh
#
# Standard library only: no module proxy is used (GOPROXY=off). Installs
# golang-go with apt when `go` is missing and this runs as root. Build and
# test caches live under ${TMPDIR:-/tmp} unless GOCACHE is set; the source
# tree is only read. GO_TEST_FLAGS adds flags to `go test` (e.g.
# GO_TEST_FLAGS='-count=5 -timeout 900s').
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
export PALISADE_BIN="${PALISADE_BIN:-$repo/target/debug/palisade}"
case "$PALISADE_BIN" in /*) ;; *) PALISADE_BIN="$PWD/$PALISADE_BIN" ;; esac
if [ ! -x "$PALISADE_BIN" ]; then
  echo "ci.sh: no palisade binary at $PALISADE_BIN (build it, or set PALISADE_BIN)" >&2
  exit 1
fi

if ! command -v go >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "--- installing golang-go"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go >/dev/null
  else
    echo "ci.sh: go not found (Debian: apt-get install golang-go, as root)" >&2
    exit 1
  fi
fi
echo "--- $(go version)"

export GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local
export GOCACHE="${GOCACHE:-${TMPDIR:-/tmp}/palisade-go-cache}"
export GOPATH="${GOPATH:-${TMPDIR:-/tmp}/palisade-go-path}"
cd "$here"

echo "--- gofmt -l"
unformatted="$(gofmt -l .)"
if [ -n "$unformatted" ]; then
  echo "ci.sh: not gofmt-formatted:" >&2
  echo "$unformatted" >&2
  exit 1
fi

echo "--- go vet ./..."
go vet ./...

echo "--- go test ./... (against palisade dev: $PALISADE_BIN)"
# shellcheck disable=SC2086
go test -count=1 -timeout 170s ${GO_TEST_FLAGS:-} ./...
