package idemhttp_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
)

// TestWriteOutcome: every way a call of idem can end, answered by
// WriteOutcome: the problem, its status, Retry-After on 409 and 503, and
// Idempotent-Replayed on a replay.
func TestWriteOutcome(t *testing.T) {
	t.Parallel()
	refusal := idem.Refuse("card_declined", "the card was declined").WithStatus(http.StatusPaymentRequired)
	tests := []struct {
		name     string
		outcome  idem.Outcome
		err      error
		status   int
		typ      string // "" for no problem: WriteOutcome writes nothing
		retry    bool
		replayed bool
	}{
		{"executed", idem.OutcomeExecuted, nil, 0, "", false, false},
		{"replayed", idem.OutcomeReplayed, nil, 0, "", false, true},
		{"refused", idem.OutcomeRefused, refusal, 402, idemhttp.ProblemRefused, false, false},
		{"refusal_replayed", idem.OutcomeReplayed, refusal, 402, idemhttp.ProblemRefused, false, true},
		{"refusal_without_status", idem.OutcomeRefused, idem.Refuse("declined", "no"), 422, idemhttp.ProblemRefused, false, false},
		{"in_progress", idem.OutcomeInProgress, idem.ErrInProgress, 409, idemhttp.ProblemInProgress, true, false},
		{"mismatch", idem.OutcomeMismatch, idem.ErrMismatch, 422, idemhttp.ProblemKeyMismatch, false, false},
		{"outcome_unknown", idem.OutcomeUnknown, fmt.Errorf("%w: lost", idem.ErrOutcomeUnknown), 503, idemhttp.ProblemOutcomeUnknown, true, false},
		{"invalid_key", idem.OutcomeInvalid, fmt.Errorf("%w: too long", idem.ErrInvalidKey), 400, idemhttp.ProblemInvalidKey, false, false},
		{"invalid_scope", idem.OutcomeInvalid, fmt.Errorf("%w: too long", idem.ErrInvalidScope), 400, idemhttp.ProblemInvalidRequest, false, false},
		{"unhashable_request", idem.OutcomeInvalid, fmt.Errorf("%w: invalid UTF-8", idem.ErrInvalidOption), 400, idemhttp.ProblemInvalidRequest, false, false},
		{"result_too_large", idem.OutcomeFailed, idem.ErrResultTooLarge, 500, idemhttp.ProblemResponseTooLarge, false, false},
		{"commit_rolled_back", idem.OutcomeFailed, pgx.ErrTxCommitRollback, 500, idemhttp.ProblemInternal, false, false},
		{"lease_lost", idem.OutcomeFailed, idem.ErrLeaseLost, 503, idemhttp.ProblemUnavailable, true, false},
		{"a_refusal_that_failed", idem.OutcomeFailed, refusal, 500, idemhttp.ProblemInternal, false, false},
		{"other", idem.OutcomeFailed, errors.New("boom"), 500, idemhttp.ProblemInternal, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w := httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodPost, "/charges", nil)
			wrote := idemhttp.WriteOutcome(w, r, tt.outcome, tt.err)
			if wrote != (tt.typ != "") {
				t.Fatalf("wrote %v, want %v", wrote, tt.typ != "")
			}
			if got := w.Header().Get(idemhttp.HeaderReplayed); (got == "true") != tt.replayed {
				t.Errorf("%s: %q, want replayed=%v", idemhttp.HeaderReplayed, got, tt.replayed)
			}
			if !wrote {
				if w.Body.Len() != 0 || w.Code != http.StatusOK {
					t.Errorf("wrote %d %q for a success", w.Code, w.Body)
				}
				return
			}
			wantStatus(t, w, tt.status)
			if got := w.Header().Get("Retry-After"); (got == "1") != tt.retry {
				t.Errorf("Retry-After %q, want it: %v", got, tt.retry)
			}
			if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("Content-Type %q", ct)
			}
		})
	}
}

// TestWriteOutcomeAsMiddleware: WriteOutcome answers what the middleware
// answers, byte for byte: a key reused with another request (422) and a
// retry while the first request runs (409).
func TestWriteOutcomeAsMiddleware(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := newApp(t, nil)
	wantStatus(t, a.post("k-used", 1), http.StatusCreated)
	viaMiddleware := a.post("k-used", 2)
	wantProblem(t, viaMiddleware, http.StatusUnprocessableEntity, idemhttp.ProblemKeyMismatch)

	charge := idem.Wrap(a.pool, "charge", func(_ context.Context, _ pgx.Tx, amount int) (int, error) { return amount, nil })
	if _, _, err := charge(ctx, "k-used", 1); err != nil {
		t.Fatal(err)
	}
	_, outcome, err := charge(ctx, "k-used", 2)
	direct := httptest.NewRecorder()
	idemhttp.WriteOutcome(direct, httptest.NewRequest(http.MethodPost, "/charges", nil), outcome, err)
	same(t, "mismatch", viaMiddleware, direct)

	// A request held in the handler and its retry, through the middleware;
	// a call whose key another call holds, through WriteOutcome.
	a.gate, a.entered = make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); a.post("k-held", 3) }()
	<-a.entered
	viaMiddleware = a.post("k-held", 3)
	_, outcome, err = idem.Run(ctx, a.pool, "k-busy", "h", func(context.Context, pgx.Tx) (int, error) {
		_, outcome, err := idem.Run(ctx, a.pool, "k-busy", "h", func(context.Context, pgx.Tx) (int, error) { return 0, nil })
		return 0, fmt.Errorf("inner: %w", &outcomeErr{outcome, err})
	})
	close(a.gate)
	<-done
	var inner *outcomeErr
	if !errors.As(err, &inner) {
		t.Fatalf("outer call: %v %v", outcome, err)
	}
	direct = httptest.NewRecorder()
	idemhttp.WriteOutcome(direct, httptest.NewRequest(http.MethodPost, "/charges", nil), inner.outcome, inner.err)
	same(t, "in progress", viaMiddleware, direct)
}

// outcomeErr carries an inner call's ending out of an outer one.
type outcomeErr struct {
	outcome idem.Outcome
	err     error
}

func (e *outcomeErr) Error() string { return fmt.Sprint(e.outcome, e.err) }

// same fails unless two answers have the same status, problem headers and
// body.
func same(t *testing.T, name string, want, got *httptest.ResponseRecorder) {
	t.Helper()
	if got.Code != want.Code || got.Body.String() != want.Body.String() {
		t.Errorf("%s: WriteOutcome answered %d %s; the middleware %d %s", name, got.Code, got.Body, want.Code, want.Body)
	}
	for _, h := range []string{"Content-Type", "Cache-Control", "Retry-After", idemhttp.HeaderReplayed} {
		if got.Header().Get(h) != want.Header().Get(h) {
			t.Errorf("%s: %s %q, the middleware's %q", name, h, got.Header().Get(h), want.Header().Get(h))
		}
	}
}
