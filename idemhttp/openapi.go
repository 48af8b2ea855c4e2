package idemhttp

import (
	"bytes"
	_ "embed"
	"fmt"
	"time"

	"github.com/idemhq/idem/idem"
)

//go:embed openapi/idempotency.yaml
var openAPIComponents []byte

// defaultLifetime is how openapi/idempotency.yaml states the key lifetime,
// idem.DefaultTTL; OpenAPIComponents puts the Client's own in its place.
const defaultLifetime = "24 hours by default"

// OpenAPIComponents returns openapi/idempotency.yaml, the OpenAPI 3.0.3
// document of components that describes the middleware's contract: the
// Idempotency-Key header parameter (required and optional), the
// Idempotent-Replayed and Retry-After response headers, the RFC 9457
// problem schema, and a ready-made response for each of the middleware's
// own answers, with its Problem* type and what a client should do about it.
// A service's own spec references them with $ref
// ('idempotency.yaml#/components/responses/InProgress'); serve or bundle
// this copy where the spec is published. The problem types assume the
// default Config.ProblemBase.
//
// The document states the key lifetime of keys, the Client the middleware
// is given (keys.TTL(), "48 hours" or "7 days"), where the file says "24
// hours by default": the IETF draft requires a resource to publish its
// expiry policy, and the file's figure is true only of the default
// idem.Config.TTL. keys must not be nil.
func OpenAPIComponents(keys *idem.Client) []byte {
	return bytes.ReplaceAll(openAPIComponents, []byte(defaultLifetime), []byte(lifetime(keys.TTL())))
}

// lifetime writes d in the largest whole unit that states it exactly:
// "24 hours", "7 days", "90 minutes".
func lifetime(d time.Duration) string {
	const day = 24 * time.Hour
	units := []struct {
		size time.Duration
		name string
	}{{day, "day"}, {time.Hour, "hour"}, {time.Minute, "minute"}, {time.Second, "second"}}
	for _, u := range units {
		// A day is written as 24 hours, as the draft's readers count keys.
		if d%u.size != 0 || d < u.size || (u.size == day && d == day) {
			continue
		}
		n := int64(d / u.size)
		if n == 1 {
			return "1 " + u.name
		}
		return fmt.Sprintf("%d %ss", n, u.name)
	}
	return d.String()
}
