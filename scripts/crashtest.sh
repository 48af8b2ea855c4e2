#!/usr/bin/env bash
# make crashtest: the crash test of cmd/idem-load (-crash) on a PostgreSQL
# cluster of its own. Clients retry every failure with the same key while
# the run kills the application processes with SIGKILL and crashes
# PostgreSQL with `pg_ctlcluster ... stop -m immediate`; at the end every
# operation must be answered and committed exactly once, balances exact, no
# key in progress. Extra arguments go to idem-load (-ops, -clients, -apps,
# -faults, -seed, -keep).
#
# The cluster (idemcrash, port IDEM_CRASH_PORT, default 54329) is created
# here and dropped on exit; the server on 5432 is never touched. Needs root
# (PostgreSQL is installed with apt-get when absent) and Go.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/cluster.sh

port=${IDEM_CRASH_PORT:-54329}
name=idemcrash
need_tools
ver=$(pg_version)
work=$(mktemp -d)
drop_cluster "$ver" "$name"
trap 'drop_cluster "$ver" "$name"; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
create_cluster "$ver" "$name" "$port"
start_cluster "$ver" "$name"
say "PostgreSQL $ver cluster $name on 127.0.0.1:$port"
go build -o "$work/idem-load" ./cmd/idem-load

unset DATABASE_URL IDEM_TEST_ADMIN_URL
IDEM_TEST_DATABASE_URL=$(cluster_url "$port") "$work/idem-load" -crash \
  -db-stop "pg_ctlcluster --skip-systemctl-redirect $ver $name stop -m immediate" \
  -db-start "pg_ctlcluster --skip-systemctl-redirect $ver $name start" \
  "$@"
