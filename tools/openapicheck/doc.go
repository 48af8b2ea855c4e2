// Package openapicheck validates idemhttp's OpenAPI components with
// kin-openapi, and checks them against the middleware's answers. It lives in
// the tools module so that kin-openapi never enters the go.sum of a library
// user; it has no non-test code.
package openapicheck
