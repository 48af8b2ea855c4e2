#!/usr/bin/env bash
# Runs the tests that make test skips: those whose first statement skips
# unless IDEM_TEST_LONG=1, found in the sources (the line after `func TestX`),
# so that a newly gated test joins the long run without a list to update.
# Each package runs only its gated tests, with -race.
#
# Usage: test-long.sh [-n] MODULE_DIR...   (-n: print the runs, run nothing)
set -euo pipefail
cd "$(dirname "$0")/.."
dry=0
if [ "${1:-}" = -n ]; then dry=1; shift; fi
status=0
found=0
for m in "$@"; do
  mdir=$(realpath "$m")
  for dir in $(grep -rl --include='*_test.go' 'os.Getenv("IDEM_TEST_LONG")' "$mdir" | xargs -r -n1 dirname | sort -u); do
    # A directory of a nested module runs from that module.
    owner=$dir; while [ ! -f "$owner/go.mod" ]; do owner=$(dirname "$owner"); done
    [ "$owner" = "$mdir" ] || continue
    names=$(grep -h -A1 '^func Test' "$dir"/*_test.go | grep -B1 'os.Getenv("IDEM_TEST_LONG")' |
      grep -o '^func Test[A-Za-z0-9_]*' | sed 's/^func //' | paste -sd'|')
    [ -n "$names" ] || continue
    found=1
    pkg=.${dir#"$mdir"}
    echo "test-long: in $m: IDEM_TEST_LONG=1 go test -race -run '^($names)\$' $pkg"
    [ $dry = 1 ] && continue
    (cd "$mdir" && IDEM_TEST_LONG=1 go test -race -count=1 -timeout 30m -run "^($names)\$" "$pkg") || status=1
  done
done
[ $found = 1 ] || { echo "test-long: no test gated by IDEM_TEST_LONG found" >&2; exit 1; }
exit $status
