package idemriver

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/idemhq/idem/idem"
)

// DefaultAfter is OnStart's after when it is not positive: 40 seconds,
// idem.DefaultLease and 10 seconds more. The margin covers a difference
// between the clocks of the process, which schedules the job, and of the
// database, which times the lease.
const DefaultAfter = idem.DefaultLease + 10*time.Second

// OnStart returns the function for idem.OperationConfig.OnStart that
// inserts the operation's completer job (CompleteArgs) with client's
// InsertTx, in the transaction that begins the operation: the job commits
// if and only if the operation began. The job is scheduled after after
// (River's scheduler makes it available within its interval, 5 s, of that
// time), and waits after again each time it finds the operation's owner at
// work.
//
// after must exceed the operation's idem.OperationConfig.Lease: the job
// then first runs once an owner that died at once has lost its lease, and
// finds a live client's operation finished, or still held by it. Zero or
// less means DefaultAfter, which suits the default lease.
//
// client inserts only; it need not be started, and it may be the one that
// runs Worker (see the package example for the order in which to make
// them). Its Workers, if set, must hold a Worker by the time an operation
// begins, since River refuses to insert a job no worker is registered for;
// the insert's error fails the operation's call, and nothing of it is
// kept. OnStart panics if client is nil.
func OnStart(client *river.Client[pgx.Tx], after time.Duration) func(ctx context.Context, tx pgx.Tx, ref idem.OperationRef) error {
	if client == nil {
		panic("idemriver: OnStart: nil River client")
	}
	if after <= 0 {
		after = DefaultAfter
	}
	return func(ctx context.Context, tx pgx.Tx, ref idem.OperationRef) error {
		args := CompleteArgs{Operation: ref.Operation, Scope: ref.Scope, Key: ref.Key, After: after}
		if _, err := client.InsertTx(ctx, tx, args, &river.InsertOpts{ScheduledAt: time.Now().Add(after)}); err != nil {
			return fmt.Errorf("idemriver: insert the completer's job of operation %q: %w", ref.Operation, err)
		}
		return nil
	}
}
