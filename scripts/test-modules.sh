#!/usr/bin/env bash
# Runs go test -race over the modules given, at most JOBS (default 2) at a
# time, and prints each one's output whole when it ends. Most tests wait on
# the database or on a timer rather than on the cores, so a second module's
# tests (or its compilation) fill the time one module alone leaves idle;
# past that, the test processes' connections add up (each test gets a
# database of its own and a pool on it, and the server takes 100
# connections in all), and the two cores are busy anyway.
#
# A SPEC is
#   DIR                   the module in DIR, ./...
#   DIR:PKG,PKG...        those packages of it
#   DIR:!PKG,PKG...       every package of it but those
#   DIR:PKG@RE[@RE...]    one package as several processes, from one build:
#                         one per RE, for the tests whose name it matches
#                         (-run), and one for the others (-skip). The tests
#                         of a package that do not call t.Parallel run one
#                         after another, each with its parallel subtests:
#                         N processes take 1/N as long over them, and
#                         between them run every test.
# When anything failed, it ends with a summary: each failed spec, its
# failed tests and packages. go vet is off: make test runs the full go vet
# first. GOTESTFLAGS is added
# to every go test command (e.g. GOTESTFLAGS='-run TestX$').
#
# Usage: test-modules.sh [-j JOBS] [-p PARALLEL] SPEC...
#   -p PARALLEL: go test -parallel (how many of a package's parallel tests
#   run at once; go test's default is the number of cores).
set -uo pipefail
cd "$(dirname "$0")/.."
usage() { echo "usage: $0 [-j JOBS] [-p PARALLEL] SPEC..." >&2; exit 2; }
jobs=2
parallel=
while getopts j:p: opt; do
  case $opt in
    j) jobs=$OPTARG ;;
    p) parallel=$OPTARG ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || usage

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
flags=(-race -count=1 -vet=off)
[ -z "$parallel" ] || flags+=(-parallel "$parallel")
# shellcheck disable=SC2206 # GOTESTFLAGS is a list of flags
[ -z "${GOTESTFLAGS:-}" ] || flags+=(${GOTESTFLAGS})

# packages DIR LIST: the packages of LIST (comma-separated; a leading !
# means every package of the module in DIR but those), one a line.
packages() {
  local dir=$1 list=$2
  case $list in
    # shellcheck disable=SC2046 # one argument per package
    '!'*) (cd "$dir" && go list ./... | grep -vxF -f <(go list $(tr ',' ' ' <<< "${list#!}"))) ;;
    *) tr ',' '\n' <<< "$list" ;;
  esac
}

# split DIR PKG REGEXPS: PKG's test binary, built once, run at once as one
# process per REGEXP of REGEXPS (@-separated; -test.run) and one for the
# tests that none matches (-test.skip).
split() {
  local dir=$1 pkg=$2 start=$SECONDS bin status=0 i
  local res=() skip=
  IFS=@ read -ra res <<< "$3"
  bin=$tmp/$(basename "$pkg")-$RANDOM.test
  (cd "$dir" && go test "${flags[@]}" -c -o "$bin" "$pkg") || return 1
  echo "built in $((SECONDS - start)) s"
  local tflags=(-test.paniconexit0 -test.count=1 -test.timeout=10m)
  [ -z "$parallel" ] || tflags+=(-test.parallel="$parallel")
  local sel=() pids=()
  for re in "${res[@]}"; do
    sel+=("-test.run=$re")
    skip=${skip:+$skip|}$re
  done
  sel+=("-test.skip=$skip")
  start=$SECONDS
  for i in "${!sel[@]}"; do
    (cd "$dir/$pkg" && "$bin" "${tflags[@]}" "${sel[$i]}" > "$bin.$i.log" 2>&1
     rc=$?; echo "($((SECONDS - start)) s)" >> "$bin.$i.log"; exit $rc) &
    pids+=($!)
  done
  for i in "${!sel[@]}"; do
    wait "${pids[$i]}" || status=1
    echo "$pkg ${sel[$i]}:"
    cat "$bin.$i.log"
  done
  return $status
}

# run I SPEC: SPEC's go test, its output in $tmp/I.log and its exit status
# in $tmp/I.rc.
run() {
  local i=$1 spec=$2 dir list start=$SECONDS
  dir=${spec%%:*}
  list=./...
  [ "$dir" = "$spec" ] || list=${spec#*:}
  {
    case $list in
      *@*) split "$dir" "${list%%@*}" "${list#*@}" ;;
      # shellcheck disable=SC2046 # one argument per package
      *) (cd "$dir" && go test "${flags[@]}" $(packages "$dir" "$list" | tr '\n' ' ')) ;;
    esac
  } > "$tmp/$i.log" 2>&1
  echo $? > "$tmp/$i.rc"
  echo "($((SECONDS - start)) s)" >> "$tmp/$i.log"
}

specs=("$@")
status=0
next=0 # the next spec to start
running=0
printed=()
while [ $next -lt ${#specs[@]} ] || [ $running -gt 0 ]; do
  while [ $running -lt "$jobs" ] && [ $next -lt ${#specs[@]} ]; do
    run $next "${specs[$next]}" &
    next=$((next + 1))
    running=$((running + 1))
  done
  wait -n
  running=$((running - 1))
  # Print every spec that has ended, as it ends.
  for ((i = 0; i < next; i++)); do
    [ -z "${printed[$i]:-}" ] && [ -f "$tmp/$i.rc" ] || continue
    printed[$i]=1
    echo "go test -race ${specs[$i]}"
    cat "$tmp/$i.log"
    [ "$(cat "$tmp/$i.rc")" = 0 ] || status=1
  done
done

# A summary of what failed, last, where it is seen: each failed spec's
# failed tests (--- FAIL, nested ones included), failed packages (FAIL
# lines) and panics, from its output above.
if [ $status -ne 0 ]; then
  echo
  echo "FAILED:"
  for ((i = 0; i < ${#specs[@]}; i++)); do
    [ "$(cat "$tmp/$i.rc")" = 0 ] && continue
    echo "  go test -race ${specs[$i]}"
    if ! grep -E -e '--- FAIL' -e $'^FAIL(\t|$)' -e '^panic: ' -e '\[(build|setup) failed\]' "$tmp/$i.log" | sed 's/^/    /'; then
      echo "    no test failed: the build or the command did (see its output above)"
    fi
  done
fi
exit $status
