package idemhttp

import (
	"bytes"
	_ "embed"
)

//go:embed openapi/idempotency.yaml
var openAPIComponents []byte

// OpenAPIComponents returns a copy of openapi/idempotency.yaml, the OpenAPI
// 3.0.3 document of components that describes the middleware's contract:
// the Idempotency-Key header parameter (required and optional), the
// Idempotent-Replayed and Retry-After response headers, the RFC 9457
// problem schema, and a ready-made response for each of the middleware's
// own answers, with its Problem* type and what a client should do about it.
// A service's own spec references them with $ref
// ('idempotency.yaml#/components/responses/InProgress'); serve or bundle
// this copy where the spec is published. The problem types assume the
// default Config.ProblemBase.
func OpenAPIComponents() []byte { return bytes.Clone(openAPIComponents) }
