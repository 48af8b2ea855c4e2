#!/usr/bin/env bash
# make crashtest: the crash tests of tools/idem-load (-crash) on a PostgreSQL
# cluster of their own. Clients retry every failure with the same key while
# the run kills the application processes with SIGKILL and crashes
# PostgreSQL with `pg_ctlcluster ... stop -m immediate`; at the end every
# operation must be answered and committed exactly once, balances exact, no
# key in progress.
#
# Two services, one after the other (IDEM_CRASH_SERVICES, default
# "app payments"):
#   app       idem-load's built-in idemhttp application;
#   payments  the payments example's service, built from payments_example
#             (a module of its own: its dependencies come from the Go
#             module proxy), settling every payment at the example's fake
#             processor unless IDEM_CRASH_PROCESSOR=0.
# Extra arguments go to every idem-load run (-ops, -clients, -apps,
# -faults, -seed, -keep; -accounts for payments).
#
# The cluster (IDEM_CRASH_CLUSTER, default idemcrash, on port
# IDEM_CRASH_PORT, default 54329) is created here and dropped on exit; the
# server on 5432 is never touched. Needs root (PostgreSQL is installed with
# apt-get when absent) and Go.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/cluster.sh

services=${IDEM_CRASH_SERVICES:-app payments}
for svc in $services; do
  case $svc in
    app|payments) ;;
    *) say "unknown service $svc in IDEM_CRASH_SERVICES (app, payments)"; exit 2 ;;
  esac
done
port=${IDEM_CRASH_PORT:-54329}
name=${IDEM_CRASH_CLUSTER:-idemcrash}
need_tools
ver=$(pg_version)
work=$(mktemp -d)
drop_cluster "$ver" "$name"
trap 'drop_cluster "$ver" "$name"; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
create_cluster "$ver" "$name" "$port"
start_cluster "$ver" "$name"
say "PostgreSQL $ver cluster $name on 127.0.0.1:$port"
(cd tools && go build -o "$work/idem-load" ./idem-load)
case " $services " in
  *" payments "*)
    # Built inside its own module; the root module does not import it.
    (cd payments_example && go build -o "$work/payments" . && go build -o "$work/processor" ./cmd/processor)
    ;;
esac

unset DATABASE_URL IDEM_TEST_ADMIN_URL
run() {
  IDEM_TEST_DATABASE_URL=$(cluster_url "$port") "$work/idem-load" -crash \
    -db-stop "pg_ctlcluster --skip-systemctl-redirect $ver $name stop -m immediate" \
    -db-start "pg_ctlcluster --skip-systemctl-redirect $ver $name start" \
    "$@"
}
# Every service runs even when one fails; the status is the worst.
failed=
for svc in $services; do
  say "crash test: $svc"
  case $svc in
    app) run "$@" || failed="$failed $svc" ;;
    payments)
      if [ "${IDEM_CRASH_PROCESSOR:-1}" = 0 ]; then
        run -payments "$work/payments" "$@" || failed="$failed $svc"
      else
        run -payments "$work/payments" -processor "$work/processor" "$@" || failed="$failed $svc"
      fi
      ;;
  esac
done
if [ -n "$failed" ]; then
  say "FAILED:$failed"
  exit 1
fi
say "passed: $services"
