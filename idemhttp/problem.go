package idemhttp

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The problem types of the answers the middleware gives itself, as RFC 9457
// application/problem+json. They are relative references, resolved against
// the service's own URL, so they name no domain but the service's;
// Config.ProblemBase replaces their "/problems/" prefix. They are stable:
// clients may branch on them. None of these answers is stored under the key.
const (
	// ProblemMissingKey: a covered request without a key while
	// Config.Required is set. Send the request again with an
	// Idempotency-Key (or the key Config.Key reads). 400.
	ProblemMissingKey = "/problems/missing-key"
	// ProblemInvalidKey: the Idempotency-Key header is malformed (see
	// ParseKey), or Config.Key failed or read an invalid key. Send a valid
	// key. 400.
	ProblemInvalidKey = "/problems/invalid-key"
	// ProblemKeyMismatch: the key was used before with another request. Use
	// a new key for a new request; never retry this one as it is. 422.
	ProblemKeyMismatch = "/problems/key-mismatch"
	// ProblemInProgress: a request with this key is being processed. Retry
	// with the same key after Retry-After. 409.
	ProblemInProgress = "/problems/in-progress"
	// ProblemBodyTooLarge: the body exceeds Config.MaxBodyBytes. 413.
	ProblemBodyTooLarge = "/problems/body-too-large"
	// ProblemOutcomeUnknown: the connection to the database failed while
	// the transaction was committing. Retry with the same key after
	// Retry-After to learn the outcome; never with a new key. 503.
	ProblemOutcomeUnknown = "/problems/outcome-unknown"
	// ProblemUnavailable: the database could not be reached or the
	// transaction failed for a passing reason; nothing was stored. Retry
	// with the same key after Retry-After. 503.
	ProblemUnavailable = "/problems/unavailable"
	// ProblemUnauthorized: the Config.Scope function returned an error or
	// an empty scope (ContextScope: the context carries no scope), so the
	// request has no principal to scope its key by. 401.
	ProblemUnauthorized = "/problems/unauthorized"
	// ProblemInvalidRequest: the body could not be read, the fingerprint
	// function failed, or the request's principal is not a valid scope. 400.
	ProblemInvalidRequest = "/problems/invalid-request"
	// ProblemResponseTooLarge: the handler's response exceeds
	// Config.MaxResponseBytes; its writes rolled back and nothing was
	// stored. A retry will fail the same way. 500.
	ProblemResponseTooLarge = "/problems/response-too-large"
	// ProblemInternal: a failure that a retry will not cure, such as a
	// stored response that cannot be read back, or a success the handler
	// marked with NoStore, whose writes rolled back. 500.
	ProblemInternal = "/problems/internal-error"
	// ProblemRefused: an operation under NewOperationHandler refused the
	// request for good (an *idem.Refusal), and the refusal is stored
	// under the key: every retry with the key receives it again. The
	// problem's Code is the refusal's code and its Detail the refusal's
	// message. 422, or the 4xx status the refusal names (Refusal.Status).
	ProblemRefused = "/problems/refused"
	// ProblemNotFound: the status URL of an operation (ServeStatus) names a
	// key that holds nothing in the request's scope: never used, expired,
	// or used by another principal. 404.
	ProblemNotFound = "/problems/not-found"
)

// A Problem is an answer of the middleware's own: by default the RFC 9457
// body, or what Config.WriteProblem renders.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Code is the refusal's code (idem.Refusal.Code) for ProblemRefused,
	// and empty for every other type: a client branches on it as on a
	// type.
	Code string `json:"code,omitempty"`
}

var problemStatus = map[string]int{
	ProblemMissingKey:       http.StatusBadRequest,
	ProblemInvalidKey:       http.StatusBadRequest,
	ProblemKeyMismatch:      http.StatusUnprocessableEntity,
	ProblemInProgress:       http.StatusConflict,
	ProblemBodyTooLarge:     http.StatusRequestEntityTooLarge,
	ProblemOutcomeUnknown:   http.StatusServiceUnavailable,
	ProblemUnavailable:      http.StatusServiceUnavailable,
	ProblemUnauthorized:     http.StatusUnauthorized,
	ProblemInvalidRequest:   http.StatusBadRequest,
	ProblemResponseTooLarge: http.StatusInternalServerError,
	ProblemInternal:         http.StatusInternalServerError,
	ProblemRefused:          http.StatusUnprocessableEntity,
	ProblemNotFound:         http.StatusNotFound,
}

var problemTitle = map[string]string{
	ProblemMissingKey:       "Idempotency-Key required",
	ProblemInvalidKey:       "Invalid Idempotency-Key",
	ProblemKeyMismatch:      "Idempotency-Key reused for another request",
	ProblemInProgress:       "Request with this Idempotency-Key in progress",
	ProblemBodyTooLarge:     "Request body too large",
	ProblemOutcomeUnknown:   "Outcome unknown",
	ProblemUnavailable:      "Service unavailable",
	ProblemUnauthorized:     "Unauthorized",
	ProblemInvalidRequest:   "Invalid request",
	ProblemResponseTooLarge: "Response too large",
	ProblemInternal:         "Internal error",
	ProblemRefused:          "Request refused",
	ProblemNotFound:         "Operation not found",
}

// problemFor is the Problem for typ with the configured base.
func (c *Config) problemFor(typ, detail string) Problem {
	t := typ
	if c.ProblemBase != DefaultProblemBase {
		t = c.ProblemBase + strings.TrimPrefix(typ, DefaultProblemBase)
	}
	return Problem{Type: t, Title: problemTitle[typ], Status: problemStatus[typ], Detail: detail}
}

// writeProblem answers with the problem typ and returns its status. 409 and
// 503 carry Retry-After, 401 a WWW-Authenticate challenge.
func writeProblem(w http.ResponseWriter, r *http.Request, c *Config, typ, detail string) int {
	return writeProblemValue(w, r, c, c.problemFor(typ, detail))
}

// writeProblemValue answers with p, as writeProblem does.
func writeProblemValue(w http.ResponseWriter, r *http.Request, c *Config, p Problem) int {
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	if p.Status == http.StatusUnauthorized {
		h.Set("WWW-Authenticate", c.Challenge)
	}
	if p.Status == http.StatusConflict || p.Status == http.StatusServiceUnavailable {
		setRetryAfter(h, c.RetryAfter)
	}
	if c.WriteProblem != nil {
		c.WriteProblem(w, r, p)
		return p.Status
	}
	body, _ := json.Marshal(p) // strings and an int cannot fail to encode
	h.Set("Content-Type", "application/problem+json")
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
	return p.Status
}

// setRetryAfter sets Retry-After to d rounded up to whole seconds, at
// least 1.
func setRetryAfter(h http.Header, d time.Duration) {
	secs := int64((d + time.Second - 1) / time.Second)
	h.Set("Retry-After", strconv.FormatInt(max(secs, 1), 10))
}

type level int

const (
	levelWarn level = iota
	levelError
)

// report hands a 5xx of the middleware's own, and its cause, to the logger
// and the error callback. The key is not logged: it is client data.
func (m *Middleware) report(r *http.Request, p Problem, cause error, lvl level) {
	if m.log != nil {
		l := slog.LevelError
		if lvl == levelWarn {
			l = slog.LevelWarn
		}
		m.log.Log(r.Context(), l, "idemhttp: "+p.Title,
			"method", r.Method, "path", r.URL.Path, "status", p.Status, "type", p.Type, "err", cause)
	}
	if m.cfg.OnError != nil {
		m.cfg.OnError(r, p, cause)
	}
}
