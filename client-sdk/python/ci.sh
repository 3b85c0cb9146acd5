#!/usr/bin/env bash
# CI for the Python client: a venv, the package with pytest, mypy and
# psycopg, `mypy --strict` on the package, then the pytest suite against a
# `palisade dev` cluster it starts itself (binary: PALISADE_BIN) and, for the
# fenced PostgreSQL transactions, a throwaway PostgreSQL server it also starts
# itself (installed with apt-get when missing and running as root).
#
#   PALISADE_BIN=target/debug/palisade bash client-sdk/python/ci.sh [pytest paths/args; default tests]
#
# Read-only on the source tree: the package is built from a copy, and the
# venv (reused while pyproject.toml and the Python version stay the same),
# caches and bytecode live under ${TMPDIR:-/tmp}. PALISADE_PY_VENV picks
# another venv directory; PYTHON another interpreter (default python3).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
export PALISADE_BIN="${PALISADE_BIN:-$repo/target/debug/palisade}"
case "$PALISADE_BIN" in /*) ;; *) PALISADE_BIN="$PWD/$PALISADE_BIN" ;; esac
if [ ! -x "$PALISADE_BIN" ]; then
  echo "ci.sh: no palisade binary at $PALISADE_BIN (build it, or set PALISADE_BIN)" >&2
  exit 1
fi

python="${PYTHON:-python3}"
apt_install() {
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "--- installing: $*"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    return 1
  fi
}
if ! command -v "$python" >/dev/null 2>&1; then
  apt_install python3 python3-venv || {
    echo "ci.sh: $python not found (Debian: apt-get install python3 python3-venv)" >&2
    exit 1
  }
fi
if ! "$python" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  apt_install python3-venv || {
    echo "ci.sh: '$python -m venv' is unavailable: the venv/ensurepip module is missing" >&2
    echo "ci.sh: on Debian/Ubuntu run: apt-get install python3-venv (as root)" >&2
    exit 1
  }
fi
# PostgreSQL for tests/test_postgres.py (tests/pgserver.py finds its binaries).
if [ -z "${PALISADE_PG_BIN:-}" ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
    && ! command -v pg_config >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  apt_install postgresql || {
    echo "ci.sh: PostgreSQL's initdb/pg_ctl not found (Debian: apt-get install postgresql, as root;" >&2
    echo "ci.sh: or set PALISADE_PG_BIN to the directory holding them)" >&2
    exit 1
  }
fi

"$python" -c 'import sys; sys.exit(sys.version_info < (3, 9))' || {
  echo "ci.sh: Python >= 3.9 is needed, found $("$python" --version 2>&1)" >&2
  exit 1
}

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export PYTHONDONTWRITEBYTECODE=1

key="$( (cat "$here/pyproject.toml"; "$python" --version) | sha256sum | cut -c1-12)"
venv="${PALISADE_PY_VENV:-${TMPDIR:-/tmp}/palisade-py-venv-$key}"
pip=(-q --disable-pip-version-check --no-input)
if ! "$venv/bin/python" -c 'import httpx, jwt, cryptography, h2, pytest, mypy, setuptools, psycopg' >/dev/null 2>&1; then
  echo "--- venv $venv"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install "${pip[@]}" --upgrade pip
  "$venv/bin/python" -m pip install "${pip[@]}" 'setuptools>=61' wheel \
    'httpx>=0.24,<1' 'PyJWT[crypto]>=2.4,<3' 'h2>=4.1,<5' 'pytest>=7' 'mypy>=1.5' 'psycopg[binary]>=3.1,<4'
fi

echo "--- pip install client-sdk/python (from a copy)"
mkdir -p "$tmp/pkg"
cp -r "$here/pyproject.toml" "$here/README.md" "$here/src" "$tmp/pkg/"
"$venv/bin/python" -m pip install "${pip[@]}" --no-build-isolation --force-reinstall --no-deps "$tmp/pkg"
"$venv/bin/python" -m pip check >/dev/null || { "$venv/bin/python" -m pip check; exit 1; }

echo "--- mypy --strict (package)"
(cd "$tmp/pkg" && "$venv/bin/mypy" --strict --cache-dir "$tmp/mypy-cache" src/palisade)

echo "--- pytest (against palisade dev: $PALISADE_BIN)"
cd "$here"
"$venv/bin/python" -m pytest -q -p no:cacheprovider "${@:-tests}"
