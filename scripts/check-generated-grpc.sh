#!/usr/bin/env bash
# Fails if the code generated from idemgrpc's .proto files differs from what
# `make generate` writes: generates it afresh, with the tools pinned in
# idemgrpc/tools.mod, into a temporary directory and compares the two trees
# (.proto sources aside), so a changed, missing or extra file fails.
set -euo pipefail
cd "$(dirname "$0")/../idemgrpc"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go tool -modfile=tools.mod buf generate -o "$tmp"
if ! diff -r -x '*.proto' "$tmp/internal/example" internal/example; then
  echo "idemgrpc: the generated code is stale; run make generate and commit the result" >&2
  exit 1
fi
echo "idemgrpc: generated code up to date"
