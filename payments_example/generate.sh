#!/usr/bin/env bash
# Generates the payments example's API package from openapi.yaml:
#   api/openapi.yaml  the spec with idemhttp's components bundled in (served
#                     at GET /openapi.yaml, and what the code is made from)
#   api/api.gen.go    types, net/http server interface and client (oapi-codegen,
#                     pinned as a tool in go.mod)
# With a directory argument it writes both there instead, so that a check
# can compare them with the committed files (make generate-check).
set -euo pipefail
cd "$(dirname "$0")"
out=${1:-api}
mkdir -p "$out"
go run ./internal/bundleopenapi -o "$out/openapi.yaml" openapi.yaml
go tool oapi-codegen -config oapi-codegen.yaml -o "$out/api.gen.go" "$out/openapi.yaml"
