package idemriver_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemriver"
)

// resumer is an operation that answers every Resume with outcome and err,
// and remembers what it was asked.
type resumer struct {
	name    string
	outcome idem.Outcome
	err     error
	asked   []string
}

func (r *resumer) Name() string { return r.name }

func (r *resumer) Resume(_ context.Context, scope, key string) (idem.Outcome, error) {
	r.asked = append(r.asked, scope+"/"+key)
	return r.outcome, r.err
}

func TestNewWorkerRefusesAmbiguousOperations(t *testing.T) {
	cases := []struct {
		name string
		ops  []idem.Resumer
		ok   bool
	}{
		{"one", []idem.Resumer{&resumer{name: "a"}}, true},
		{"two", []idem.Resumer{&resumer{name: "a"}, &resumer{name: "b"}}, true},
		{"none", nil, false},
		{"nil", []idem.Resumer{nil}, false},
		{"empty name", []idem.Resumer{&resumer{name: "a"}, &resumer{name: ""}}, false},
		{"duplicate", []idem.Resumer{&resumer{name: "a"}, &resumer{name: "b"}, &resumer{name: "a"}}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w, err := idemriver.NewWorker(tc.ops...)
			if tc.ok != (err == nil) || tc.ok != (w != nil) {
				t.Fatalf("NewWorker: %v, %v; want ok %v", w, err, tc.ok)
			}
			if !tc.ok && !errors.Is(err, idem.ErrInvalidOption) {
				t.Fatalf("NewWorker: %v, want an error wrapping idem.ErrInvalidOption", err)
			}
		})
	}
}

// Work turns each way Resume ends into what River does next: done,
// snoozed for the job's After, cancelled, or retried with the error.
func TestWorkTellsRiverWhatNext(t *testing.T) {
	const (
		done = iota
		snooze
		cancel
		retry
	)
	errStep := errors.New("the processor answered 503")
	cases := []struct {
		name    string
		outcome idem.Outcome
		err     error
		want    int
	}{
		{"executed", idem.OutcomeExecuted, nil, done},
		{"refused", idem.OutcomeRefused, nil, done},
		{"replayed", idem.OutcomeReplayed, nil, done},
		{"replayed refusal", idem.OutcomeReplayed, idem.Refuse("declined", "no"), done},
		{"not found", idem.OutcomeFailed, idem.ErrNotFound, done},
		{"in progress", idem.OutcomeInProgress, idem.ErrInProgress, snooze},
		{"lease lost", idem.OutcomeFailed, fmt.Errorf("%w: operation %q", idem.ErrLeaseLost, "charge"), snooze},
		{"another operation's key", idem.OutcomeMismatch, fmt.Errorf("%w: the key belongs to operation %q", idem.ErrMismatch, "other"), cancel},
		{"invalid key", idem.OutcomeInvalid, idem.ErrInvalidKey, cancel},
		{"step failed", idem.OutcomeFailed, errStep, retry},
		{"outcome unknown", idem.OutcomeUnknown, idem.ErrOutcomeUnknown, retry},
		{"ctx ended", idem.OutcomeFailed, context.DeadlineExceeded, retry},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			op := &resumer{name: "charge", outcome: tc.outcome, err: tc.err}
			w, err := idemriver.NewWorker(op)
			if err != nil {
				t.Fatal(err)
			}
			job := &river.Job[idemriver.CompleteArgs]{
				JobRow: &rivertype.JobRow{ID: 1},
				Args:   idemriver.CompleteArgs{Operation: "charge", Scope: "acct", Key: "k1", After: 7 * time.Second},
			}
			err = w.Work(t.Context(), job)
			if len(op.asked) != 1 || op.asked[0] != "acct/k1" {
				t.Fatalf("Resume was asked %v, want [acct/k1]", op.asked)
			}
			var (
				snoozed  *river.JobSnoozeError
				canceled *river.JobCancelError
			)
			switch tc.want {
			case done:
				if err != nil {
					t.Fatalf("Work: %v, want nil (done)", err)
				}
			case snooze:
				if !errors.As(err, &snoozed) || snoozed.Duration != 7*time.Second {
					t.Fatalf("Work: %v, want a snooze of the job's After (7s)", err)
				}
			case cancel:
				if !errors.As(err, &canceled) || !errors.Is(err, tc.err) {
					t.Fatalf("Work: %v, want a cancel wrapping %v", err, tc.err)
				}
			case retry:
				if err == nil || errors.As(err, &snoozed) || errors.As(err, &canceled) || !errors.Is(err, tc.err) {
					t.Fatalf("Work: %v, want a plain error wrapping %v", err, tc.err)
				}
				if !strings.Contains(err.Error(), `"charge"`) || !strings.Contains(err.Error(), `"k1"`) {
					t.Fatalf("Work: %q, want the operation and key named", err)
				}
			}
		})
	}
}

// A job without After waits DefaultAfter; one naming an operation the
// Worker was not given is cancelled with ErrUnknownOperation, without
// resuming anything.
func TestWorkDefaultsAndUnknownOperation(t *testing.T) {
	op := &resumer{name: "charge", outcome: idem.OutcomeInProgress, err: idem.ErrInProgress}
	w, err := idemriver.NewWorker(op)
	if err != nil {
		t.Fatal(err)
	}
	job := &river.Job[idemriver.CompleteArgs]{JobRow: &rivertype.JobRow{ID: 1}, Args: idemriver.CompleteArgs{Operation: "charge", Key: "k"}}
	var snoozed *river.JobSnoozeError
	if err := w.Work(t.Context(), job); !errors.As(err, &snoozed) || snoozed.Duration != idemriver.DefaultAfter {
		t.Fatalf("Work without After: %v, want a snooze of DefaultAfter", err)
	}

	op.asked = nil
	job.Args.Operation = "refund"
	err = w.Work(t.Context(), job)
	var canceled *river.JobCancelError
	if !errors.As(err, &canceled) || !errors.Is(err, idemriver.ErrUnknownOperation) || !strings.Contains(err.Error(), `"refund"`) {
		t.Fatalf("Work of an unknown operation: %v, want a cancel wrapping ErrUnknownOperation that names it", err)
	}
	if len(op.asked) != 0 {
		t.Fatalf("an unknown operation's job resumed %v", op.asked)
	}
}
