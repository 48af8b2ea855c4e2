package idemhttp

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// The problem types of the answers the middleware gives itself, as RFC 9457
// application/problem+json. They are stable: clients may branch on them.
// None of these answers is stored under the key.
const (
	// ProblemMissingKey: a covered request without a key while WithRequired
	// is set. 400.
	ProblemMissingKey = "https://idem.dev/problems/missing-key"
	// ProblemInvalidKey: the Idempotency-Key header is malformed (see
	// ParseKey). 400.
	ProblemInvalidKey = "https://idem.dev/problems/invalid-key"
	// ProblemKeyMismatch: the key was used before with another request. Use
	// a new key for a new request. 422.
	ProblemKeyMismatch = "https://idem.dev/problems/key-mismatch"
	// ProblemInProgress: a request with this key is being processed. Retry
	// with the same key after Retry-After. 409.
	ProblemInProgress = "https://idem.dev/problems/in-progress"
	// ProblemBodyTooLarge: the body exceeds WithMaxBodyBytes. 413.
	ProblemBodyTooLarge = "https://idem.dev/problems/body-too-large"
	// ProblemOutcomeUnknown: the connection to the database failed while
	// the transaction was committing. Retry with the same key after
	// Retry-After to learn the outcome; never with a new key. 503.
	ProblemOutcomeUnknown = "https://idem.dev/problems/outcome-unknown"
	// ProblemUnavailable: the database could not be reached or the
	// transaction failed for a passing reason; nothing was stored. Retry
	// with the same key after Retry-After. 503.
	ProblemUnavailable = "https://idem.dev/problems/unavailable"
	// ProblemUnauthorized: the WithScope function returned an error, so the
	// request has no principal to scope its key by. 401.
	ProblemUnauthorized = "https://idem.dev/problems/unauthorized"
	// ProblemInvalidRequest: the body could not be read, or the
	// WithFingerprint function returned an error. 400.
	ProblemInvalidRequest = "https://idem.dev/problems/invalid-request"
	// ProblemInternal: a failure that a retry will not cure, such as an
	// invalid scope or a stored response that cannot be decoded. 500.
	ProblemInternal = "https://idem.dev/problems/internal-error"
)

// A Problem is the RFC 9457 body of the middleware's own answers.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

var problemStatus = map[string]int{
	ProblemMissingKey:     http.StatusBadRequest,
	ProblemInvalidKey:     http.StatusBadRequest,
	ProblemKeyMismatch:    http.StatusUnprocessableEntity,
	ProblemInProgress:     http.StatusConflict,
	ProblemBodyTooLarge:   http.StatusRequestEntityTooLarge,
	ProblemOutcomeUnknown: http.StatusServiceUnavailable,
	ProblemUnavailable:    http.StatusServiceUnavailable,
	ProblemUnauthorized:   http.StatusUnauthorized,
	ProblemInvalidRequest: http.StatusBadRequest,
	ProblemInternal:       http.StatusInternalServerError,
}

var problemTitle = map[string]string{
	ProblemMissingKey:     "Idempotency-Key required",
	ProblemInvalidKey:     "Invalid Idempotency-Key",
	ProblemKeyMismatch:    "Idempotency-Key reused for another request",
	ProblemInProgress:     "Request with this Idempotency-Key in progress",
	ProblemBodyTooLarge:   "Request body too large",
	ProblemOutcomeUnknown: "Outcome unknown",
	ProblemUnavailable:    "Service unavailable",
	ProblemUnauthorized:   "Unauthorized",
	ProblemInvalidRequest: "Invalid request",
	ProblemInternal:       "Internal error",
}

// writeProblem answers with the problem typ. 409 and 503 carry Retry-After.
func writeProblem(w http.ResponseWriter, typ, detail string, retryAfter time.Duration) {
	p := Problem{Type: typ, Title: problemTitle[typ], Status: problemStatus[typ], Detail: detail}
	body, _ := json.Marshal(p) // strings and an int cannot fail to encode
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if p.Status == http.StatusConflict || p.Status == http.StatusServiceUnavailable {
		secs := int64((retryAfter + time.Second - 1) / time.Second)
		h.Set("Retry-After", strconv.FormatInt(max(secs, 1), 10))
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}
