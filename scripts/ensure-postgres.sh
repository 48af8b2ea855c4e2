#!/usr/bin/env bash
# Makes a PostgreSQL server answer on 127.0.0.1:5432 for the tests and the
# demo, when none is configured:
#   - IDEM_TEST_DATABASE_URL or DATABASE_URL set: nothing to do;
#   - a server answers on 127.0.0.1:5432: nothing to do;
#   - a Debian cluster is installed but down: start it;
#   - none is installed and we are root with apt-get: install one, with trust
#     authentication for local connections (a throw-away test server);
#   - otherwise: say so and leave it to the test harness, which falls back to
#     a container (tools/pgcontainer, testcontainers-go) when a Docker engine answers.
set -euo pipefail

say() { printf 'ensure-postgres: %s\n' "$*" >&2; }

if [ -n "${IDEM_TEST_DATABASE_URL:-}${DATABASE_URL:-}" ]; then
  say "using the database URL from the environment"
  exit 0
fi

answers() {
  if command -v pg_isready >/dev/null 2>&1; then
    pg_isready -q -h 127.0.0.1 -p 5432 -t 2 -U postgres
  else
    (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null
  fi
}

if answers; then
  exit 0
fi

start_cluster() {
  local ver
  ver=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
  [ -n "$ver" ] || return 1
  say "starting PostgreSQL $ver"
  pg_ctlcluster --skip-systemctl-redirect "$ver" main start || pg_ctlcluster "$ver" main start
  for _ in $(seq 1 30); do answers && return 0; sleep 1; done
  return 1
}

if [ -d /etc/postgresql ] && [ -n "$(ls /etc/postgresql 2>/dev/null)" ]; then
  start_cluster && exit 0
  say "the installed cluster did not start; see /var/log/postgresql/"
  exit 1
fi

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  say "installing PostgreSQL with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq postgresql postgresql-client >/dev/null
  ver=$(ls /etc/postgresql | sort -V | tail -n 1)
  hba=/etc/postgresql/$ver/main/pg_hba.conf
  # A server installed here only serves the tests: trust local connections.
  sed -i -E 's/^(local|host)(\s+all\s+all\s+.*)(scram-sha-256|md5|peer)$/\1\2trust/' "$hba"
  sed -i -E 's/^(local\s+all\s+postgres\s+)peer$/\1trust/' "$hba"
  # The package may have started the cluster already: restart it so the new
  # authentication rules apply.
  pg_ctlcluster --skip-systemctl-redirect "$ver" main restart 2>/dev/null || pg_ctlcluster "$ver" main restart 2>/dev/null || true
  answers || start_cluster || { say "the new cluster did not start"; exit 1; }
  # The database the payments example uses by default.
  su postgres -c "createdb test" 2>/dev/null || say "could not create the database test (it may exist)"
  exit 0
fi

say "no PostgreSQL on 127.0.0.1:5432 and cannot install one (not root, or no apt-get);"
say "the tests will try a container (tools/pgcontainer, needs Docker), or set IDEM_TEST_DATABASE_URL"
exit 0
