// Package api is the payments example's HTTP contract, generated from
// ../openapi.yaml by `make generate`: the request and response types, the
// net/http server interface the service implements (ServerInterface,
// HandlerWithOptions), and the client the demo drives it with
// (ClientWithResponses). Only this file is written by hand.
package api

import (
	"bytes"
	_ "embed"
)

//go:embed openapi.yaml
var spec []byte

// Spec returns a copy of the service's OpenAPI document with every
// reference resolved, as served at GET /openapi.yaml: ../openapi.yaml with
// idemhttp's idempotency components bundled in.
func Spec() []byte { return bytes.Clone(spec) }
