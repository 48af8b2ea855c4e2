#!/usr/bin/env bash
# Runs idem's database tests, and a short multi-process load, through
# PgBouncer in transaction pooling mode with few server connections, so that
# consecutive transactions of one client land on different server sessions.
# Anything idem kept in a session (a prepared statement, a setting, a session
# lock) would break here.
#
#   PGBOUNCER_PORT        listen port (default 6432)
#   PGBOUNCER_POOL_SIZE   server connections per database (default 2)
#   IDEM_PGBOUNCER_MODES  pgx exec modes to run the tests in
#                         (default "exec simple_protocol")
#   IDEM_PGBOUNCER_PKGS   packages of the root module to test (default: those
#                         with database tests); the payments example, a
#                         module of its own, runs after them unless
#                         IDEM_PGBOUNCER_EXAMPLE=0
#   IDEM_PGBOUNCER_GOTEST extra go test flags (default "-timeout 5m")
#
# Two tests are skipped: the psql test, as psql rejects pgx's
# default_query_exec_mode URL parameter, and, with simple_protocol only, the
# fault tests, whose rules pick messages of the extended protocol.
#   IDEM_PGBOUNCER_LOAD_OPS  calls for the load run; 0 skips it (default 20000)
#   IDEM_PGBOUNCER_LOAD_MODE pgx exec mode of the load run (default exec)
#
# The upstream server is PostgreSQL on 127.0.0.1:5432 (user postgres, trust);
# databases are created there directly (IDEM_TEST_ADMIN_URL), and every test
# connection goes through PgBouncer.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH

say() { printf 'test-pgbouncer: %s\n' "$*" >&2; }

port=${PGBOUNCER_PORT:-6432}
pool_size=${PGBOUNCER_POOL_SIZE:-2}
modes=${IDEM_PGBOUNCER_MODES:-exec simple_protocol}
pkgs=${IDEM_PGBOUNCER_PKGS:-./idem/ ./integration_test/ ./idemhttp/...}
example=${IDEM_PGBOUNCER_EXAMPLE:-1}
load_ops=${IDEM_PGBOUNCER_LOAD_OPS:-20000}
load_mode=${IDEM_PGBOUNCER_LOAD_MODE:-exec}
gotest_flags=${IDEM_PGBOUNCER_GOTEST:--timeout 5m}
upstream="postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

if ! command -v pgbouncer >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing pgbouncer with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq pgbouncer >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq pgbouncer >/dev/null; }
  else
    say "pgbouncer is not installed (and this is not root with apt-get): install it and run again"
    exit 1
  fi
fi
say "$(pgbouncer --version | head -n 1)"

dir=$(mktemp -d /tmp/idem-pgbouncer.XXXXXX)
chmod 755 "$dir"
run_as=()
if [ "$(id -u)" = 0 ]; then
  # PgBouncer refuses to run as root; it drops to this user itself.
  run_as=(-u postgres)
  chown postgres "$dir"
fi

stop() {
  if [ -f "$dir/pgbouncer.pid" ]; then
    kill "$(cat "$dir/pgbouncer.pid")" 2>/dev/null || true
    for _ in $(seq 1 50); do [ -f "$dir/pgbouncer.pid" ] || break; sleep 0.1; done
  fi
  rm -rf "$dir"
}
trap stop EXIT
trap 'exit 130' INT TERM

if (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null; then
  say "something already listens on 127.0.0.1:$port; set PGBOUNCER_PORT"
  exit 1
fi

cat >"$dir/userlist.txt" <<'EOF'
"postgres" ""
EOF
cat >"$dir/pgbouncer.ini" <<EOF
[databases]
; Every database, including the ones each test creates, through one entry.
* = host=127.0.0.1 port=5432

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
admin_users = postgres
pool_mode = transaction
default_pool_size = $pool_size
; A test that holds more transactions open at once than the pool has
; connections gets extra ones after a second instead of waiting forever.
reserve_pool_size = 4
reserve_pool_timeout = 1
max_client_conn = 1000
max_db_connections = 0
ignore_startup_parameters = extra_float_digits,application_name
; Tests drop their databases with FORCE; forget those pools quickly.
autodb_idle_timeout = 10
server_check_delay = 0
pidfile = $dir/pgbouncer.pid
logfile = $dir/pgbouncer.log
EOF
chown postgres "$dir"/* 2>/dev/null || true

pgbouncer -d "${run_as[@]}" "$dir/pgbouncer.ini"
up=
for _ in $(seq 1 50); do
  if (exec 3<>/dev/tcp/127.0.0.1/"$port") 2>/dev/null; then up=1; break; fi
  sleep 0.1
done
if [ -z "$up" ]; then
  say "pgbouncer did not start:"
  cat "$dir/pgbouncer.log" >&2 || true
  exit 1
fi
say "listening on 127.0.0.1:$port, pool_mode=transaction, default_pool_size=$pool_size"

bouncer_url() { echo "postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable&default_query_exec_mode=$1"; }

status=0
for mode in $modes; do
  skip='^TestSchemaFilesWithPsql$'
  [ "$mode" = simple_protocol ] && skip='^(TestSchemaFilesWithPsql|TestFault.*)$'
  say "go test $pkgs with default_query_exec_mode=$mode (skipping $skip)"
  # shellcheck disable=SC2086 # word lists
  if ! IDEM_TEST_DATABASE_URL=$(bouncer_url "$mode") IDEM_TEST_ADMIN_URL=$upstream \
      go test -race -count=1 -skip "$skip" $gotest_flags $pkgs; then
    say "FAILED with default_query_exec_mode=$mode"
    status=1
  fi
  if [ "$example" != 0 ]; then
    say "go test ./... in payments_example with default_query_exec_mode=$mode"
    # shellcheck disable=SC2086 # word lists
    if ! (cd payments_example && IDEM_TEST_DATABASE_URL=$(bouncer_url "$mode") IDEM_TEST_ADMIN_URL=$upstream \
        go test -race -count=1 -skip "$skip" $gotest_flags ./...); then
      say "FAILED: payments_example with default_query_exec_mode=$mode"
      status=1
    fi
  fi
done

if [ "$load_ops" != 0 ]; then
  say "idem-load, $load_ops calls from 4 processes, through PgBouncer (default_query_exec_mode=$load_mode)"
  if ! (cd tools && IDEM_TEST_DATABASE_URL=$(bouncer_url "$load_mode") IDEM_TEST_ADMIN_URL=$upstream \
      go run ./idem-load -ops "$load_ops"); then
    say "FAILED: idem-load through PgBouncer"
    status=1
  fi
fi

totals=$(psql -h 127.0.0.1 -p "$port" -U postgres -d pgbouncer -AtF= -c 'SHOW TOTALS' 2>/dev/null |
  awk -F= '$1 == "total_xact_count" || $1 == "total_query_count" { printf "%s=%s ", $1, $2 }')
say "pgbouncer totals for the pools still open: ${totals:-unavailable}(server connections per database: at most $pool_size, plus 4 in reserve)"
errors=$(grep -c -E 'ERROR|FATAL' "$dir/pgbouncer.log" || true)
say "pgbouncer log: $errors ERROR/FATAL lines"
grep -E 'ERROR|FATAL' "$dir/pgbouncer.log" | sed -E 's/^[^ ]+ [^ ]+ [^ ]+ //' | sort | uniq -c | sort -rn | head -n 10 >&2 || true

if [ "$status" = 0 ]; then say "PASS"; else say "FAIL"; fi
exit "$status"
