#!/usr/bin/env bash
# The checksums of the generated files and of everything they are made from
# (sources, generator configuration, generator versions), kept in
# scripts/generated.sum. `make generate` records them after generating;
# `make generate-check` (part of make test) compares them, which needs no
# generator: a changed .proto or spec without a regeneration, and a
# hand-edited generated file, fail in milliseconds. Building the generators
# (buf alone takes minutes of CPU on a cold build cache) and regenerating is
# `make generate-check-full`, which make test-long runs.
#
# Usage: generated-sum.sh record | check
set -euo pipefail
cd "$(dirname "$0")/.."
sum=scripts/generated.sum

current() {
  {
    git ls-files --cached --others --exclude-standard -- \
      payments_example/openapi.yaml payments_example/oapi-codegen.yaml \
      payments_example/generate.sh 'payments_example/internal/bundleopenapi/*.go' \
      'idemhttp/openapi/*' payments_example/api \
      idemgrpc/buf.yaml idemgrpc/buf.gen.yaml idemgrpc/tools.mod idemgrpc/tools.sum \
      idemgrpc/internal/example
  } | grep -v '_test\.go$' | LC_ALL=C sort -u | while IFS= read -r f; do
    [ -f "$f" ] && sha256sum -- "$f"
  done
  # The generators' versions, which the payments example pins in its go.mod.
  (cd payments_example && go mod edit -json) |
    jq -r '.Require[] | select(.Path | test("oapi-codegen|kin-openapi")) | "\(.Path) \(.Version)"' |
    sha256sum | sed 's/-$/payments_example\/go.mod (generator versions)/'
}

case ${1:-} in
  record) current > "$sum" ;;
  check)
    if ! diff -u "$sum" <(current) >&2; then
      echo "a generated file, or what it is made from, changed since the last make generate: run make generate and commit the result" >&2
      exit 1
    fi ;;
  *) echo "usage: $0 record|check" >&2; exit 2 ;;
esac
