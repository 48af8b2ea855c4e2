package settlement

import (
	"errors"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/idemhq/idem/idemriver"
	"github.com/idemhq/idem/payments_example/processor"
)

// River's settings for settlement jobs. River's defaults suit jobs that
// may run for long and must not run twice; settlement is the opposite
// (short, and safe to run twice), and every payment must be settled within
// a minute of its last answer, even when the service is killed while a job
// runs. Running a settlement job twice, even at the same time, is safe:
// both runs send the processor the same key and charge, and the processor
// answers both with the same charge; both record that charge with the same
// idempotent UPDATE (sql/record.sql), in the transaction that completes
// the job. So the settings below may run a job again early; they must
// never leave one waiting long.
const (
	// CallTimeout bounds one call to the processor: a call that has not
	// been answered by then is abandoned and retried with the same key.
	CallTimeout = 4 * time.Second

	// JobTimeout bounds one run of a job (River cancels its context): the
	// processor call and the transaction that records it. River's
	// default is 1 minute.
	JobTimeout = CallTimeout + time.Second

	// RescueStuckJobsAfter is how long a job may stay "running" before
	// River's rescuer runs it again. A job stays running after its
	// process died (SIGKILL, a crash) or after its completion could not
	// be written (the database was down). River's default is 1 hour,
	// which would leave a payment unsettled for an hour after a crash. A
	// job still running then is past JobTimeout, its context cancelled;
	// running it again is safe (see above). River requires it to exceed
	// JobTimeout.
	//
	// The value is below 9 s for a reason. The rescuer runs on River's
	// leader, at once when a process becomes leader and every 30 s after.
	// When the leader is killed, its leadership expires 9 to 15 s later
	// (River re-elects every 5 s, plus up to 1 s, with a 15 s TTL), and a
	// process that restarted in the meantime takes over within 5 s more;
	// its first rescue then already finds every job the crash interrupted
	// (8 s before it). A job is so run again within about 21 s of a crash
	// (plus RetryMax and River's 5 s scheduler interval), and within about
	// 40 s (8 s, then the next rescue) of a completion that a live process
	// could not write.
	RescueStuckJobsAfter = 8 * time.Second

	// RetryMin and RetryMax are the bounds of the Backoff between runs of
	// a failed job: 250 ms, 500 ms, 1 s, 2 s, then 4 s. RetryMax stays
	// under River's scheduler interval (5 s), so that River makes a
	// failed job available again at once, scheduled for its retry time,
	// instead of leaving it for the leader's scheduler, which is absent
	// for a while after the leader crashed.
	RetryMin = 250 * time.Millisecond
	RetryMax = 4 * time.Second

	// MaxAttempts is how often a job runs before River discards it:
	// with RetryMax between runs, about a day of the processor failing
	// every call. River's default (25) with Backoff would be under two
	// minutes. A discarded job leaves its payment unsettled (settled:
	// false); alert on it.
	MaxAttempts = 20_000

	// Workers is how many settlement jobs one process runs at once.
	Workers = 10
)

// NewClient returns a River client that runs settlement jobs (Worker) on
// pool with the settings above, calling the processor through proc; log
// receives River's logs and the jobs given up on (nil discards them).
// Start it with Start and stop it with Stop; a client that is not started
// still inserts jobs (Queue).
//
// The client also works the queue of idem's completer
// (idemriver.QueueName), with the same settings, for the workers the
// caller registers on workers before Start: NewClient adds the settlement
// Worker to workers (nil: a bundle of its own), and an operation whose
// OnStart inserts with the client needs the client first, so its
// completer (idemriver.Worker) can only be registered after NewClient
// returns. The settings suit those jobs too: a completer job that runs
// twice at once finds the operation's lease held and waits, and one
// stopped by JobTimeout (a slow processor) is run again and continues
// from the steps recorded.
func NewClient(pool *pgxpool.Pool, proc *processor.Client, log *slog.Logger, workers *river.Workers) (*river.Client[pgx.Tx], error) {
	if pool == nil || proc == nil {
		return nil, errors.New("settlement: NewClient needs a pool and a processor")
	}
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if workers == nil {
		workers = river.NewWorkers()
	}
	if err := river.AddWorkerSafely(workers, &Worker{pool: pool, processor: proc, log: log}); err != nil {
		return nil, err
	}
	return river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues: map[string]river.QueueConfig{
			QueueName:           {MaxWorkers: Workers},
			idemriver.QueueName: {MaxWorkers: Workers},
		},
		Workers:              workers,
		JobTimeout:           JobTimeout,
		RescueStuckJobsAfter: RescueStuckJobsAfter,
		RetryPolicy:          Backoff{Min: RetryMin, Max: RetryMax},
		MaxAttempts:          MaxAttempts,
		Logger:               log,
	})
}
