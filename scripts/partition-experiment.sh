#!/usr/bin/env bash
# make partition-experiment: how long PostgreSQL keeps a silent client's
# transaction (and so an idempotency key) under each server setting that
# bounds it. Not a pass/fail test: it prints the seconds each case took,
# for docs/RELIABILITY.md.
#
# A client (psql) runs in a network namespace of its own, joined to the host
# by a veth pair, and talks to a PostgreSQL cluster of its own
# (idempart, port IDEM_PARTITION_PORT, default 54332). In each case the
# client opens a transaction that holds an advisory lock (as a claimed key
# does), then either the network goes silent (the namespace's end of the
# veth pair goes down: nothing is delivered and nothing is reset) or the
# client process freezes (SIGSTOP: its kernel still acknowledges every
# packet and answers keepalives). The script measures how long the server
# keeps the session.
#
# Needs root. Creates and removes the namespace, the veth pair and the
# cluster; never touches the server on 5432.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/cluster.sh

port=${IDEM_PARTITION_PORT:-54332}
name=idempart
ns=idempart
host_if=vidp0
ns_if=vidp1
host_ip=10.231.0.1
ns_ip=10.231.0.2
need_tools
ver=$(pg_version)
work=$(mktemp -d)
cleanup() {
  ip netns del "$ns" 2>/dev/null || true
  ip link del "$host_if" 2>/dev/null || true
  drop_cluster "$ver" "$name"
  rm -rf "$work"
}
cleanup
work=$(mktemp -d)
trap cleanup EXIT
trap 'exit 130' INT TERM

create_cluster "$ver" "$name" "$port"
conf=/etc/postgresql/$ver/$name
echo "listen_addresses = '127.0.0.1,$host_ip'" >>"$conf/postgresql.conf"
echo "host all all $ns_ip/32 trust" >>"$conf/pg_hba.conf"

ip netns add "$ns"
ip link add "$host_if" type veth peer name "$ns_if"
ip link set "$ns_if" netns "$ns"
ip addr add "$host_ip/24" dev "$host_if"
ip link set "$host_if" up
ip netns exec "$ns" ip addr add "$ns_ip/24" dev "$ns_if"
ip netns exec "$ns" ip link set "$ns_if" up
ip netns exec "$ns" ip link set lo up
start_cluster "$ver" "$name"

admin() { psql -X -q -At -h 127.0.0.1 -p "$port" -U postgres -d postgres -c "$1"; }

# run_case LABEL SESSION_SQL WORK_SQL STATE FAULT LIMIT
#   SESSION_SQL  settings of the client's session (SET ...)
#   WORK_SQL     what the client sends inside its transaction before the fault
#   STATE        the server-side state to wait for before the fault
#   FAULT        partition | freeze
#   LIMIT        seconds to watch before giving up
run_case() {
  local label=$1 session=$2 body=$3 state=$4 fault=$5 limit=$6
  local fifo=$work/in out=$work/out app
  app="case$RANDOM"
  rm -f "$fifo"
  mkfifo "$fifo"
  ip netns exec "$ns" psql -X -q -h "$host_ip" -p "$port" -U postgres -d postgres <"$fifo" >"$out" 2>&1 &
  local client=$!
  exec 7>"$fifo"
  printf "set application_name = '%s';\n%s\nbegin;\nselect pg_advisory_xact_lock(42);\n%s\n" "$app" "$session" "$body" >&7
  local pid=""
  for _ in $(seq 1 300); do
    pid=$(admin "select pid from pg_stat_activity where application_name = '$app' and state = '$state'")
    [ -n "$pid" ] && break
    sleep 0.1
  done
  [ -n "$pid" ] || { say "$label: the session never reached '$state'"; cat "$out" >&2; exit 1; }
  sleep 0.5 # the last packets are acknowledged
  # How long the statement under way has run, to say when it would end.
  local ran
  ran=$(admin "select extract(epoch from clock_timestamp() - query_start) from pg_stat_activity where pid = $pid")
  local t0 t1
  t0=$(date +%s.%N)
  if [ "$fault" = partition ]; then
    ip netns exec "$ns" ip link set "$ns_if" down
  else
    kill -STOP "$client"
  fi
  local result="" gone=""
  while :; do
    gone=$(admin "select count(*) = 0 from pg_stat_activity where pid = $pid")
    t1=$(date +%s.%N)
    if [ "$gone" = t ]; then
      result=$(printf '%.1f s' "$(echo "$t1 - $t0" | bc)")
      break
    fi
    if [ "$(echo "$t1 - $t0 > $limit" | bc)" = 1 ]; then
      result="still held after $limit s"
      break
    fi
    sleep 0.1
  done
  if [ "$state" = active ]; then
    result="$result (the statement ends at $(printf '%.1f' "$(echo "20 - $ran" | bc)") s)"
  fi
  printf '%-80s %s\n' "$label" "$result"
  # Undo the fault and end the client and its session.
  ip netns exec "$ns" ip link set "$ns_if" up
  kill -CONT "$client" 2>/dev/null || true
  admin "select pg_terminate_backend($pid)" >/dev/null 2>&1 || true
  exec 7>&-
  kill "$client" 2>/dev/null || true
  wait "$client" 2>/dev/null || true
}

ka="set tcp_keepalives_idle = 5; set tcp_keepalives_interval = 2; set tcp_keepalives_count = 3;"
idle="set idle_in_transaction_session_timeout = '5s';"
check="set client_connection_check_interval = '1s';"
uto="set tcp_user_timeout = '10s';"
sleep20="select pg_sleep(20);"

say "PostgreSQL $ver, cluster $name on $port; client in namespace $ns ($ns_ip); each case: seconds until the server ended the session"
run_case "idle in transaction, network silent, server defaults" "" "" "idle in transaction" partition 40
run_case "idle in transaction, network silent, idle_in_transaction_session_timeout 5s" "$idle" "" "idle in transaction" partition 40
run_case "idle in transaction, network silent, keepalives 5s+3x2s" "$ka" "" "idle in transaction" partition 40
run_case "idle in transaction, process frozen, keepalives 5s+3x2s" "$ka" "" "idle in transaction" freeze 40
run_case "idle in transaction, process frozen, idle_in_transaction_session_timeout 5s" "$idle" "" "idle in transaction" freeze 40
run_case "20 s statement, network silent, keepalives 5s+3x2s" "$ka" "$sleep20" active partition 60
run_case "20 s statement, network silent, keepalives + client_connection_check_interval 1s" "$ka $check" "$sleep20" active partition 60
run_case "20 s statement, network silent, idle_in_transaction_session_timeout 5s" "$idle" "$sleep20" active partition 60
run_case "20 s statement, network silent, tcp_user_timeout 10s" "$uto" "$sleep20" active partition 60
run_case "20 s statement, network silent, tcp_user_timeout 10s + check interval 1s" "$uto $check" "$sleep20" active partition 60
run_case "20 s statement, network silent, keepalives + tcp_user_timeout 10s + check interval 1s" "$ka $uto $check" "$sleep20" active partition 60
run_case "idle in transaction, network silent, tcp_user_timeout 10s" "$uto" "" "idle in transaction" partition 40
