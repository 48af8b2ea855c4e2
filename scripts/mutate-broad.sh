#!/usr/bin/env bash
# Generated mutations (Gremlins: flipped conditions, boundaries, arithmetic)
# of the idem package's pure logic, each tested with the package's own tests,
# in a scratch copy of the repository. The files whose behaviour only the
# integration tests hold (the protocol, the SQL paths) are left to the
# targeted list of `make mutate`, which runs those tests.
#
#   scripts/mutate-broad.sh            # key.go, hash.go, refusal.go, errors.go, canonical.go
#   GREMLINS_FILES='key|hash' scripts/mutate-broad.sh
set -euo pipefail
version=v0.6.0
files=${GREMLINS_FILES:-key|hash|refusal|errors|canonical}
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
