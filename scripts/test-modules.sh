#!/usr/bin/env bash
# Runs go test -race in each module given, all at once, and prints each
# module's output in turn: a module whose tests wait on the database (most
# of them) leaves the cores to the others, where one after another would
# leave them idle. Exits non-zero if any module's tests failed.
#
# Usage: test-modules.sh MODULE_DIR...
set -uo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pids=()
i=0
for m in "$@"; do
  (cd "$m" && go test -race -count=1 ./... > "$tmp/$i.log" 2>&1; echo $? > "$tmp/$i.rc") &
  pids+=($!)
  i=$((i + 1))
done
wait "${pids[@]}"
status=0
i=0
for m in "$@"; do
  echo "go test -race ./... in $m"
  cat "$tmp/$i.log"
  [ "$(cat "$tmp/$i.rc")" = 0 ] || status=1
  i=$((i + 1))
done
exit $status
