package settlement

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/idemhq/idem/payments_example/processor"
)

// Worker runs settlement jobs: it charges through the processor with the
// job's key and records the processor's charge on the payment.
type Worker struct {
	river.WorkerDefaults[Args]
	pool      *pgxpool.Pool
	processor *processor.Client
	log       *slog.Logger
}

// Work settles one payment. A run may be the first, a retry after a
// failure, or a second run of a job that River rescued while it was still
// running (see RescueStuckJobsAfter): all of them send the same key and
// charge, so the processor charges once and answers the same charge id,
// and all of them record that id the same way.
//
// Work returns an error, and River runs the job again after Backoff, when
// the outcome is unknown: the processor failed, took longer than
// CallTimeout or lost its answer, or the database did not record it. It
// cancels the job (river.JobCancel: no more runs) only when running it
// again cannot succeed: the processor rejected the request, the payment is
// gone, or it is already settled by another charge; the error is logged
// and the payment stays unsettled, for a person to look at.
func (w *Worker) Work(ctx context.Context, job *river.Job[Args]) error {
	callCtx, cancel := context.WithTimeout(ctx, CallTimeout)
	id, err := w.processor.Charge(callCtx, job.Args.Key, job.Args.Charge)
	cancel()
	if errors.Is(err, processor.ErrRejected) {
		return w.give(ctx, job, err)
	}
	if err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		if err := record(ctx, tx, job.Args.PaymentID, id); err != nil {
			return err
		}
		// Completing the job in the transaction that records the charge
		// means a recorded charge never leaves its job to run again.
		_, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job)
		if errors.Is(err, rivertype.ErrNotFound) {
			// The job is no longer running: River rescued it while this
			// run was still going, and another run is due or done. The
			// charge is the same either way; record it.
			return nil
		}
		return err
	})
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, errNoPayment), errors.Is(err, errOtherCharge),
		errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UniqueViolation: // the charge id settles another payment
		return w.give(ctx, job, err)
	case err != nil:
		return fmt.Errorf("settlement: record the charge of payment %s: %w", job.Args.PaymentID, err)
	}
	return nil
}

// give cancels job for good, logging why.
func (w *Worker) give(ctx context.Context, job *river.Job[Args], err error) error {
	w.log.ErrorContext(ctx, "settlement: giving up; the payment stays unsettled",
		"payment_id", job.Args.PaymentID, "job_id", job.ID, "err", err)
	return river.JobCancel(err)
}
