package idemhttp

import (
	"errors"
	"net/http"

	"github.com/idemhq/idem/idem"
)

// WriteOutcome answers an HTTP request for a call of idem made in its
// handler without the middleware: idem.Run, the function idem.Wrap returns,
// or idem.Operation.Run behind any router. It reports whether it wrote the
// answer. outcome and err are what the call returned.
//
// A call that failed (err not nil) is answered here, and WriteOutcome
// returns true: a refusal (an *idem.Refusal, stored now or replayed) with
// ProblemRefused, the refusal's code and message, and its 4xx status (422
// when it names none); every other error with the problem the middleware
// and NewOperationHandler answer it with: 409 ProblemInProgress and 503
// ProblemOutcomeUnknown or ProblemUnavailable with Retry-After, 422
// ProblemKeyMismatch, 400 for a key, scope or request that idem refused,
// 500 ProblemResponseTooLarge or ProblemInternal for the rest. A replayed
// refusal carries Idempotent-Replayed: true. The answers are those of the
// default Config: problem types under DefaultProblemBase, Retry-After of
// DefaultRetryAfter, an RFC 9457 body. The cause of a 5xx never reaches
// the client; log err yourself.
//
// A call that succeeded (err nil) is the handler's to answer: WriteOutcome
// sets Idempotent-Replayed: true when outcome is idem.OutcomeReplayed, and
// returns false without writing anything else.
//
//	resp, outcome, err := charge(r.Context(), key, req) // from idem.Wrap
//	if idemhttp.WriteOutcome(w, r, outcome, err) {
//		return
//	}
//	w.WriteHeader(http.StatusCreated)
//	json.NewEncoder(w).Encode(resp)
func WriteOutcome(w http.ResponseWriter, r *http.Request, outcome idem.Outcome, err error) bool {
	replayed := outcome == idem.OutcomeReplayed
	if err == nil {
		if replayed {
			w.Header().Set(HeaderReplayed, "true")
		}
		return false
	}
	if refusal, ok := storedRefusal(outcome, err); ok {
		writeRefusal(w, r, &defaultProblems, refusal, replayed)
		return true
	}
	typ, detail := callProblem(outcome, err, r.Context().Err() != nil)
	writeProblem(w, r, &defaultProblems, typ, detail)
	return true
}

// defaultProblems is the Config WriteOutcome answers with: the defaults of
// every field its problems read.
var defaultProblems = Config{ProblemBase: DefaultProblemBase, RetryAfter: DefaultRetryAfter, Challenge: "Bearer"}

// storedRefusal returns the refusal a call stored now or replayed, if err
// is one.
func storedRefusal(outcome idem.Outcome, err error) (*idem.Refusal, bool) {
	if outcome != idem.OutcomeRefused && outcome != idem.OutcomeReplayed {
		return nil, false
	}
	refusal, ok := errors.AsType[*idem.Refusal](err)
	return refusal, ok && refusal != nil
}

// writeRefusal answers with a stored refusal: ProblemRefused with the
// refusal's code, message and 4xx status, or 422.
func writeRefusal(w http.ResponseWriter, r *http.Request, cfg *Config, refusal *idem.Refusal, replayed bool) {
	p := cfg.problemFor(ProblemRefused, refusal.Message)
	p.Code = refusal.Code
	if refusal.Status >= 400 && refusal.Status <= 499 {
		p.Status = refusal.Status
	}
	if replayed {
		w.Header().Set(HeaderReplayed, "true")
	}
	writeProblemValue(w, r, cfg, p)
}

// callProblem is the problem type and detail that answer a call of idem
// that failed with err, neither succeeding nor storing a refusal: the one
// mapping of the middleware, NewOperationHandler and WriteOutcome.
// clientLeft says that the request's context ended.
func callProblem(outcome idem.Outcome, err error, clientLeft bool) (typ, detail string) {
	switch {
	case errors.Is(err, idem.ErrMismatch):
		return ProblemKeyMismatch, "this key was used with a different request; use a new key for a new request"
	case errors.Is(err, idem.ErrInProgress):
		return ProblemInProgress, "a request with this key is being processed; retry later with the same key"
	case errors.Is(err, idem.ErrOutcomeUnknown):
		return ProblemOutcomeUnknown, "the outcome of this request is unknown; retry with the same key to learn it"
	case errors.Is(err, idem.ErrInvalidKey):
		return ProblemInvalidKey, "the idempotency key is malformed"
	case errors.Is(err, idem.ErrInvalidScope):
		return ProblemInvalidRequest, "the request's principal cannot scope an idempotency key"
	case outcome == idem.OutcomeInvalid && errors.Is(err, idem.ErrInvalidOption):
		// The request cannot be stored or hashed exactly (two keys equal
		// under case folding, invalid UTF-8): bad input, answered as a body
		// that cannot be fingerprinted.
		return ProblemInvalidRequest, "the request could not be fingerprinted"
	case errors.Is(err, idem.ErrResultTooLarge):
		return ProblemResponseTooLarge, "the result exceeds the size the service stores; it was not stored"
	case idem.Retryable(err) || clientLeft:
		return ProblemUnavailable, "the request did not finish; retry with the same key"
	}
	return ProblemInternal, "the request could not be processed"
}
