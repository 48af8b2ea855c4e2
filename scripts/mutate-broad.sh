#!/usr/bin/env bash
# Generated mutations (Gremlins: flipped conditions, boundaries, arithmetic)
# of the idem package's pure logic and of the canonical-JSON parser
# (internal/canonjson), each tested with its package's own tests, in a
# scratch copy of the repository. The files whose behaviour only the
# integration tests hold (the protocol, the SQL paths) are left to the
# targeted list of `make mutate`, which runs those tests.
#
#   scripts/mutate-broad.sh            # idem's key.go, hash.go, refusal.go, errors.go; internal/canonjson
#   GREMLINS_FILES='key|hash' scripts/mutate-broad.sh
set -euo pipefail
version=v0.6.0
files=${GREMLINS_FILES:-key|hash|refusal|errors}
root=$(git rev-parse --show-toplevel)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$root"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [ -f "$f" ] && mkdir -p "$scratch/$(dirname "$f")" && cp "$f" "$scratch/$f"
done
cd "$scratch"
git init -q
# Every other file of the package is excluded by name.
exclude=$(cd idem && ls *.go | grep -v _test.go | sed 's/\.go$//' | grep -Ev "^(${files})$" | paste -sd'|')
echo "gremlins $version on idem/{${files}}.go (scratch copy $scratch)"
go run "github.com/go-gremlins/gremlins/cmd/gremlins@${version}" unleash ./idem \
  --workers 1 --timeout-coefficient 15 -E "(^|/)(${exclude})\.go$"
echo "gremlins $version on internal/canonjson"
go run "github.com/go-gremlins/gremlins/cmd/gremlins@${version}" unleash ./internal/canonjson \
  --workers 1 --timeout-coefficient 15
