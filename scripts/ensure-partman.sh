#!/usr/bin/env bash
# Makes the pg_partman extension available to the local test server, for
# the test of the partitioned key table managed by pg_partman:
#   - IDEM_TEST_DATABASE_URL or DATABASE_URL set: nothing to do (the server
#     is not ours to change; the test skips if the extension is missing);
#   - the extension is already available: nothing to do;
#   - we are root with apt-get: install postgresql-<version>-partman for
#     the local cluster's version (Debian 12 ships pg_partman 4.7);
#   - otherwise: say so; the test skips with the same reason.
# Installing the package needs no restart: idem runs pg_partman's
# maintenance itself, so the background worker is not used.
set -euo pipefail

say() { printf 'ensure-partman: %s\n' "$*" >&2; }

if [ -n "${IDEM_TEST_DATABASE_URL:-}${DATABASE_URL:-}" ]; then
  exit 0
fi

available() {
  psql -h 127.0.0.1 -U postgres -d postgres -Atqc \
    "SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_partman'" 2>/dev/null | grep -qx 1
}

if ! command -v psql >/dev/null 2>&1; then
  say "no psql on this machine; the pg_partman test will skip"
  exit 0
fi
if available; then
  exit 0
fi
ver=$(psql -h 127.0.0.1 -U postgres -d postgres -Atqc "SHOW server_version_num" 2>/dev/null | cut -c1-2 || true)
if [ -z "$ver" ]; then
  say "no server answers on 127.0.0.1:5432; the pg_partman test will skip"
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  say "installing postgresql-$ver-partman with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq "postgresql-$ver-partman" >/dev/null 2>&1; then
    apt-get update -qq
    apt-get install -y -qq "postgresql-$ver-partman" >/dev/null || {
      say "could not install postgresql-$ver-partman; the pg_partman test will skip"
      exit 0
    }
  fi
  available || say "postgresql-$ver-partman is installed but the server does not list pg_partman"
  exit 0
fi
say "pg_partman is not installed and cannot be (not root, or no apt-get); the pg_partman test will skip"
exit 0
