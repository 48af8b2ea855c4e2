package idem

import (
	"context"
	"time"
)

// An Outcome is how a call ended. Observers receive it, and Run returns it.
type Outcome uint8

// The outcomes of a call. Their String forms are stable: dashboards and
// alerts depend on them.
const (
	// OutcomeExecuted: fn ran and its result committed with the key.
	OutcomeExecuted Outcome = iota + 1
	// OutcomeReplayed: a stored result (or stored refusal) was returned
	// without running fn.
	OutcomeReplayed
	// OutcomeRefused: fn ran and returned a *Refusal, which committed with
	// the key (fn's writes rolled back).
	OutcomeRefused
	// OutcomeInProgress: another transaction held the key (ErrInProgress).
	OutcomeInProgress
	// OutcomeMismatch: the key was used with another request (ErrMismatch).
	OutcomeMismatch
	// OutcomeFailed: nothing was stored: fn failed or panicked, the
	// database failed, ctx ended, or a stored row could not be read.
	OutcomeFailed
	// OutcomeUnknown: the connection failed while COMMIT was on its way
	// (ErrOutcomeUnknown).
	OutcomeUnknown
	// OutcomeInvalid: the key, scope, request hash or an option was
	// invalid; nothing was sent to the database.
	OutcomeInvalid
)

var outcomeNames = [...]string{
	OutcomeExecuted:   "executed",
	OutcomeReplayed:   "replayed",
	OutcomeRefused:    "refused",
	OutcomeInProgress: "in_progress",
	OutcomeMismatch:   "mismatch",
	OutcomeFailed:     "failed",
	OutcomeUnknown:    "outcome_unknown",
	OutcomeInvalid:    "invalid",
}

// String returns the outcome's stable name: "executed", "replayed",
// "refused", "in_progress", "mismatch", "failed", "outcome_unknown" or
// "invalid".
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) && outcomeNames[o] != "" {
		return outcomeNames[o]
	}
	return "unknown"
}

// An Observer is told about every call of Do, Run and Wrap (and, through
// them, of idemhttp): traces, metrics and logs hang here. The package
// idemotel turns it into OpenTelemetry spans and metrics.
//
// CallStart runs before any database work; the context it returns is used
// for the rest of the call, is given to fn by Run and Wrap (so spans of the
// work become its children) and is passed to CallEnd. CallEnd runs once per
// CallStart, when the call returns, even when it fails validation (Do
// without a function included); when fn panics or exits its goroutine,
// CallEnd runs with OutcomeFailed while the panic unwinds.
// Both run on the caller's goroutine and must be safe for concurrent use;
// they should be fast, since they sit on the request path.
//
// Neither receives the idempotency key: it is client data, and often a
// secret that lets its holder read the stored answer.
type Observer interface {
	CallStart(ctx context.Context, call CallStart) context.Context
	CallEnd(ctx context.Context, call CallEnd)
}

// CallStart is what is known when a call begins.
type CallStart struct {
	Table string // the key table
	Scope string // the scope the key is stored under
	// Resume is true for Operation.Resume: a completer finishing an
	// operation from its stored request, not a client's call.
	Resume bool
}

// CallEnd is how a call ended.
type CallEnd struct {
	Table   string  // the key table
	Scope   string  // the scope the key is stored under
	Outcome Outcome // how it ended
	// Refused is true when the call returned a stored business refusal: a
	// first execution that refused (OutcomeRefused) or a replay of one.
	Refused bool
	// Waited is true when WithWait made the call wait for another holder
	// of the key at least once.
	Waited bool
	// Duration is the call's wall time, validation to return.
	Duration time.Duration
	// Err is the error the call returned, nil for executed and replayed
	// successes; for refusals, the refusal.
	Err error
	// HTTPStatus is the status idemhttp answered for the request, 0 outside
	// idemhttp.
	HTTPStatus int
	// Resume is true for Operation.Resume, as in CallStart.
	Resume bool
}

// observe runs call, one call of Do, Run, Wrap or an Operation (Resume's
// when resume is set), and tells the Observer of s, if any, that it started
// and how it ended. A panic or runtime.Goexit in call skips call's return;
// the observer still hears of it, as a failure (errAbandoned), so that no
// span or in-flight count is left open, and the panic goes on. waited, if
// not nil, is where call records that WithWait made it wait.
func observe[T any](ctx context.Context, s *settings, scope string, resume bool, waited *bool, call func(context.Context) (T, Outcome, error)) (T, Outcome, error) {
	obs := s.observer
	if obs == nil {
		return call(ctx)
	}
	start := time.Now()
	ctx = obs.CallStart(ctx, CallStart{Table: s.table, Scope: scope, Resume: resume})
	end := CallEnd{Table: s.table, Scope: scope, Outcome: OutcomeFailed, Err: errAbandoned, Resume: resume}
	reported := false
	defer func() {
		if !reported {
			end.Waited = waited != nil && *waited
			end.Duration = time.Since(start)
			obs.CallEnd(ctx, end)
		}
	}()
	v, outcome, err := call(ctx)
	reported = true
	end.Outcome, end.Err, end.Duration = outcome, err, time.Since(start)
	end.Waited = waited != nil && *waited
	// Only a refusal that was stored (now or before) counts: a Refusal
	// without a Code, say, fails the call and stores nothing.
	end.Refused = (outcome == OutcomeRefused || outcome == OutcomeReplayed) && isRefusal(err)
	obs.CallEnd(ctx, end)
	return v, outcome, err
}
