#!/usr/bin/env bash
# make failover-test: replica promotion under load (tools/idem-load
# -failover). A primary streams its WAL asynchronously to a standby made
# with pg_basebackup -R; under load the standby falls behind, the primary
# crashes and the standby is promoted. The promoted node must hold, for
# every key row, its business rows, and for every business row its key
# row; after the failover a key it lost runs again, once, and a key it
# kept replays. Runs twice: the standby stops receiving WAL (-cut stream),
# then stops replaying it (-cut pause). Extra arguments go to idem-load.
#
# The clusters (idemprimary on IDEM_PRIMARY_PORT, default 54330, and
# idemstandby on IDEM_STANDBY_PORT, default 54331) are created here and
# dropped on exit; the server on 5432 is never touched. Needs root and Go.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/cluster.sh

pport=${IDEM_PRIMARY_PORT:-54330}
sport=${IDEM_STANDBY_PORT:-54331}
need_tools
ver=$(pg_version)
work=$(mktemp -d)
cleanup() {
  drop_cluster "$ver" idemstandby
  drop_cluster "$ver" idemprimary
}
cleanup
trap 'cleanup; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
(cd tools && go build -o "$work/idem-load" ./idem-load)
unset DATABASE_URL IDEM_TEST_ADMIN_URL

for cut in stream pause; do
  create_cluster "$ver" idemprimary "$pport"
  start_cluster "$ver" idemprimary
  # The standby: a cluster whose data directory is a base backup of the
  # primary, with primary_conninfo and standby.signal written by -R.
  create_cluster "$ver" idemstandby "$sport"
  data=$(pg_lsclusters -h | awk -v v="$ver" '$1 == v && $2 == "idemstandby" {print $6}')
  rm -rf "${data:?}"/*
  su postgres -c "pg_basebackup -h 127.0.0.1 -p $pport -U postgres -D $data -R -X stream -c fast"
  start_cluster "$ver" idemstandby
  for _ in $(seq 1 60); do
    state=$(psql -h 127.0.0.1 -p "$sport" -U postgres -Atc "select status from pg_stat_wal_receiver" 2>/dev/null || true)
    [ "$state" = streaming ] && break
    sleep 1
  done
  [ "$state" = streaming ] || { say "the standby is not streaming"; exit 1; }
  say "PostgreSQL $ver: primary on $pport, asynchronous standby on $sport streaming; the standby falls behind by -cut $cut"
  IDEM_TEST_DATABASE_URL=$(cluster_url "$pport") "$work/idem-load" -failover -cut "$cut" \
    -standby-url "$(cluster_url "$sport")" \
    -primary-stop "pg_ctlcluster --skip-systemctl-redirect $ver idemprimary stop -m immediate" \
    -waldump "/usr/lib/postgresql/$ver/bin/pg_waldump" -standby-wal "$data/pg_wal" \
    "$@"
  cleanup
done
