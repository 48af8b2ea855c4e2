package idemriver

import (
	"context"
	"errors"
	"fmt"

	"github.com/riverqueue/river"

	"github.com/idemhq/idem/idem"
)

// ErrUnknownOperation means a job names an operation that the Worker was
// not given: the job is cancelled (river.JobCancel), since running it
// again cannot help, and the operation stays unfinished until a Worker
// that knows it runs a job of its own, or a client retries it.
var ErrUnknownOperation = errors.New("idemriver: no operation of this name is registered with the Worker")

// Result is what a completer job records as its output when it ends
// (river.RecordOutput; read it with rivertype.JobRow.Output): how the
// operation it was inserted for ended.
type Result struct {
	// Outcome is "executed" or "refused" when this job finished the
	// operation (with an answer, or a stored refusal such as a
	// compensation's), "replayed" when it had finished before (its client
	// came back), and "not_found" when its key held nothing (forgotten, or
	// expired and swept).
	Outcome string `json:"outcome"`
}

// OutcomeNotFound is Result.Outcome for a key that held nothing.
const OutcomeNotFound = "not_found"

// Worker runs completer jobs (CompleteArgs): it resumes the job's
// operation with idem.Resumer's Resume, which continues it from what its
// steps recorded, or replays it when it already finished. Register it
// with river.AddWorker on the Workers of a client that works QueueName.
type Worker struct {
	river.WorkerDefaults[CompleteArgs]
	ops map[string]idem.Resumer
}

// NewWorker returns the Worker of the operations ops, looked up by name.
// Every operation whose OnStart inserts jobs for the Worker's River
// client must be among them. An empty list, a nil operation, an empty
// name or two operations of one name are an error wrapping
// idem.ErrInvalidOption.
func NewWorker(ops ...idem.Resumer) (*Worker, error) {
	if len(ops) == 0 {
		return nil, fmt.Errorf("%w: idemriver: NewWorker: no operations", idem.ErrInvalidOption)
	}
	byName := make(map[string]idem.Resumer, len(ops))
	for i, op := range ops {
		if op == nil {
			return nil, fmt.Errorf("%w: idemriver: NewWorker: operation %d is nil", idem.ErrInvalidOption, i)
		}
		name := op.Name()
		if name == "" {
			return nil, fmt.Errorf("%w: idemriver: NewWorker: operation %d has no name", idem.ErrInvalidOption, i)
		}
		if _, dup := byName[name]; dup {
			return nil, fmt.Errorf("%w: idemriver: NewWorker: two operations are named %q", idem.ErrInvalidOption, name)
		}
		byName[name] = op
	}
	return &Worker{ops: byName}, nil
}

// Work resumes the job's operation and tells River what to do next:
//   - the operation finished, by this job (executed, refused) or before
//     it (replayed), or its key holds nothing (idem.ErrNotFound: never
//     begun, forgotten, or expired): nil, the job is done, and its output
//     (Result) says which;
//   - another owner holds it (idem.ErrInProgress: a client at work, or
//     inside a database step; idem.ErrLeaseLost: another owner took it
//     over meanwhile): river.JobSnooze for the job's After, without
//     counting an attempt;
//   - the job names an operation the Worker does not know
//     (ErrUnknownOperation), or the key belongs to another operation or
//     to Do (idem.ErrMismatch), or the job's scope or key is invalid:
//     river.JobCancel, since no run of the job can succeed;
//   - any other error (a step's, the database's, ctx's): returned, and
//     River runs the job again under its retry policy; what the steps
//     recorded stays, and the next run continues from there.
//
// Work logs nothing; River records each error with the job. ctx, which
// River ends at its JobTimeout, governs the resume: an operation's steps
// must fit in it, or each run ends in ctx's error and the next continues.
func (w *Worker) Work(ctx context.Context, job *river.Job[CompleteArgs]) error {
	a := job.Args
	op, ok := w.ops[a.Operation]
	if !ok {
		return river.JobCancel(fmt.Errorf("%w: operation %q (scope %q, key %q): give NewWorker every operation whose OnStart inserts jobs",
			ErrUnknownOperation, a.Operation, a.Scope, a.Key))
	}
	outcome, err := op.Resume(ctx, a.Scope, a.Key)
	switch {
	case err == nil, outcome == idem.OutcomeReplayed: // a replayed refusal comes with its error
		record(ctx, outcome.String())
		return nil
	case errors.Is(err, idem.ErrNotFound):
		record(ctx, OutcomeNotFound)
		return nil
	case errors.Is(err, idem.ErrInProgress), errors.Is(err, idem.ErrLeaseLost):
		return river.JobSnooze(a.after())
	case errors.Is(err, idem.ErrMismatch), outcome == idem.OutcomeInvalid:
		return river.JobCancel(fmt.Errorf("idemriver: operation %q (scope %q, key %q) cannot be resumed: %w", a.Operation, a.Scope, a.Key, err))
	}
	return fmt.Errorf("idemriver: resume operation %q (scope %q, key %q): %w", a.Operation, a.Scope, a.Key, err)
}

// record stores how the job ended as its output. Outside a River worker
// (a test that calls Work itself) there is nowhere to store it, and the
// output is only for people and dashboards, so the error is dropped.
func record(ctx context.Context, outcome string) {
	_ = river.RecordOutput(ctx, Result{Outcome: outcome})
}
