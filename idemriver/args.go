package idemriver

import (
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// QueueName is the River queue of the completer's jobs: a queue of their
// own, so that other work does not hold them up and they do not hold up
// other work. The River client that runs Worker must list it in
// river.Config.Queues.
const QueueName = "idem_complete"

// CompleteArgs is a completer job: the unfinished operation to drive to
// its end, named as idem.OperationRef names it. OnStart inserts it; a
// program may insert one itself, for an operation begun without OnStart.
type CompleteArgs struct {
	// Operation is the name the operation was registered with
	// (idem.NewOperation), which Worker looks up.
	Operation string `json:"operation" river:"unique"`
	// Scope and Key are the operation's idempotency scope and key.
	Scope string `json:"scope" river:"unique"`
	Key   string `json:"key" river:"unique"`
	// After is how long the job waits each time it finds the operation's
	// owner at work (river.JobSnooze): OnStart's after, the time it
	// scheduled the job at past the operation's beginning. Zero means
	// DefaultAfter. It is not part of the job's identity.
	After time.Duration `json:"after,omitempty"`
}

// Kind is the River job kind of completer jobs: "idem_complete".
func (CompleteArgs) Kind() string { return "idem_complete" }

// InsertOpts puts completer jobs on QueueName and makes them unique by
// operation, scope and key, so that an operation has one job however
// often it is inserted. A finished job does not count (River's default
// keeps completed jobs unique too): a key used again once its operation
// finished and expired, or was forgotten (idem.Client.Forget), begins a
// new operation, which needs a job of its own.
func (CompleteArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{
		Queue: QueueName,
		UniqueOpts: river.UniqueOpts{
			ByArgs: true,
			ByState: []rivertype.JobState{
				rivertype.JobStateAvailable,
				rivertype.JobStatePending,
				rivertype.JobStateRetryable,
				rivertype.JobStateRunning,
				rivertype.JobStateScheduled,
			},
		},
	}
}

// after is how long the job waits between looks: After, or DefaultAfter.
func (a CompleteArgs) after() time.Duration {
	if a.After > 0 {
		return a.After
	}
	return DefaultAfter
}
