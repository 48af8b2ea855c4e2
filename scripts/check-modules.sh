#!/usr/bin/env bash
# Fails unless every Go module of the repository builds from what a clone
# holds, and can be published:
#  - every package of each module, and every package its tests import,
#    loads with no go.work and a read-only go.mod, so go.sum is complete and
#    no workspace of the developer's is needed (go vet, which make test runs
#    first, type-checks them all; CHECK_MODULES_LINK=1: go build ./...,
#    every package compiled and every command linked, as make test-long
#    does);
#  - every replace of a module points inside the repository;
#  - no file that a package, its tests or its //go:embed use is ignored by
#    git (a clone would not have it);
#  - the go command could make each module's zip (golang.org/x/mod/zip's
#    checks: no file name Windows reserves, such as nul or con, no names that
#    collide when case is folded, the size limits): otherwise no user can
#    download the version.
# A fresh clone's test run (.ci/run) builds every module from that clone too.
#
# Usage: check-modules.sh MODULE_DIR...
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export GOWORK=off GOFLAGS=-mod=readonly
status=0
fail() { echo "check-modules: $*" >&2; status=1; }

files='{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}'
for f in CgoFiles EmbedFiles TestGoFiles XTestGoFiles TestEmbedFiles XTestEmbedFiles; do
  files+="{{range .$f}}{{\$d}}/{{.}}{{\"\\n\"}}{{end}}"
done

for m in "$@"; do
  # Loading every package with its tests' imports finds a missing go.sum
  # line or an import that no required module provides; compiling them
  # (what go build adds, seconds per module in a fresh clone, where no
  # package of the repository is in the build cache) is left to
  # CHECK_MODULES_LINK=1, which links the commands too.
  if [ "${CHECK_MODULES_LINK:-}" = 1 ]; then
    (cd "$m" && go build ./...) || fail "module $m does not build with GOWORK=off -mod=readonly"
  else
    (cd "$m" && go list -deps -test -f '' ./... >/dev/null) || fail "module $m does not load with GOWORK=off -mod=readonly"
  fi
  while read -r dir; do
    [ -z "$dir" ] && continue
    case $(realpath -m "$m/$dir") in
      "$root"|"$root"/*) ;;
      *) fail "$m/go.mod replaces a module with $dir, outside the repository" ;;
    esac
  done < <(cd "$m" && go mod edit -json | jq -r '.Replace[]? | select(.New.Version == null) | .New.Path')
  ignored=$(cd "$m" && go list -e -f "$files" ./... | sed "s#^$root/##" | git -C "$root" check-ignore --stdin || true)
  [ -z "$ignored" ] || fail "$m uses files that git ignores, which a clone lacks: $ignored"
done
(cd tools && go run ./modcheck "${@/#/$root/}") || status=1
exit $status
