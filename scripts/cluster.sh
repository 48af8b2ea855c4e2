# Helpers for the tests that crash PostgreSQL: they run clusters of their
# own (Debian's pg_createcluster), on their own ports, created and dropped
# by the test, never the server the other tests use. Sourced by
# crashtest.sh and failover-test.sh.

say() { printf '%s: %s\n' "${0##*/}" "$*" >&2; }

# need_tools installs what the tests need and is missing: PostgreSQL's
# server and Debian's cluster tools (as root, with apt-get), and checks
# for Go.
need_tools() {
  if [ "$(id -u)" != 0 ]; then
    say "run as root: the test creates, crashes and drops PostgreSQL clusters of its own"
    exit 1
  fi
  if ! command -v pg_createcluster >/dev/null 2>&1 || [ -z "$(ls /usr/lib/postgresql 2>/dev/null)" ]; then
    command -v apt-get >/dev/null 2>&1 || { say "no pg_createcluster and no apt-get to install PostgreSQL"; exit 1; }
    say "installing PostgreSQL with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq postgresql postgresql-client >/dev/null
  fi
  export PATH=/usr/local/go/bin:$PATH
  command -v go >/dev/null 2>&1 || { say "Go is not installed (see go.mod for the version)"; exit 1; }
}

# pg_version prints the newest installed PostgreSQL major version.
pg_version() { ls /usr/lib/postgresql | sort -V | tail -n 1; }

# create_cluster VERSION NAME PORT creates a cluster that trusts local
# connections (a throw-away test server), not started at boot.
create_cluster() {
  local ver=$1 name=$2 port=$3
  if [ "$port" = 5432 ]; then
    say "refusing to create a cluster on 5432: crash tests use a port of their own"
    exit 1
  fi
  pg_createcluster "$ver" "$name" -p "$port" --start-conf=manual -o max_connections=200 -- --auth=trust >/dev/null
}

start_cluster() { pg_ctlcluster --skip-systemctl-redirect "$1" "$2" start; }

# drop_cluster VERSION NAME stops and drops the cluster if it exists (a
# leftover of an interrupted run, or this run's at exit).
drop_cluster() {
  if pg_lsclusters -h 2>/dev/null | awk '{print $1" "$2}' | grep -qx "$1 $2"; then
    pg_dropcluster --stop "$1" "$2"
  fi
}

# cluster_url PORT prints the URL of the postgres database on the cluster.
cluster_url() { printf 'postgres://postgres@127.0.0.1:%s/postgres?sslmode=disable' "$1"; }
