package integration_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
)

// errLostAnswer is what a connection that failed while an answer was on its
// way looks like to pgx.
var errLostAnswer = fmt.Errorf("read tcp 127.0.0.1:5432: %w", io.ErrUnexpectedEOF)

// lossyBeginner begins transactions on a pool; their COMMIT commits and then
// reports the answer lost.
type lossyBeginner struct{ pool *pgxpool.Pool }

func (b lossyBeginner) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := b.pool.Begin(ctx)
	return lossyCommitTx{tx}, err
}

// lossyOuter is a caller's outer transaction; the pipeline that releases
// Do's savepoint in it (with the completion) reports its answer lost in the
// same way, after the server ran it.
type lossyOuter struct{ pgx.Tx }

func (o lossyOuter) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	br := o.Tx.SendBatch(ctx, b)
	if q := b.QueuedQueries; len(q) > 0 && strings.HasPrefix(q[len(q)-1].SQL, "release savepoint") {
		return lossyResults{br}
	}
	return br
}

type lossyResults struct{ pgx.BatchResults }

func (r lossyResults) Close() error {
	if err := r.BatchResults.Close(); err != nil {
		return err
	}
	return errLostAnswer
}

type lossyCommitTx struct{ pgx.Tx }

func (t lossyCommitTx) Commit(ctx context.Context) error {
	if err := t.Tx.Commit(ctx); err != nil {
		return err
	}
	return errLostAnswer
}

// Who owns COMMIT decides what a lost answer means. When Do commits its own
// transaction, a COMMIT whose answer was lost has an unknown outcome:
// ErrOutcomeUnknown. In a caller's outer transaction Do only releases a
// savepoint; nothing is committed until the caller commits, so the same
// failure is a plain error, never ErrOutcomeUnknown, and the caller's own
// Commit is where the outcome is decided. (TestFaultSweep/outer_tx makes the
// same point with cuts on the wire.)
func TestCommitOwnerClassifiesLostAnswers(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	runs := 0

	_, err := idem.Do(ctx, lossyBeginner{s.pool}, "k-own", "h", chargeFn(ctx, 1, &runs))
	if !errors.Is(err, idem.ErrOutcomeUnknown) || !idem.Retryable(err) {
		t.Fatalf("Do's own COMMIT lost its answer: %v; want ErrOutcomeUnknown, retryable", err)
	}
	// It did commit: the retry replays.
	if _, replayed, err := runReplayed(ctx, s.pool, "k-own", "h", chargeFn(ctx, 1, &runs)); err != nil || !replayed || runs != 1 {
		t.Fatalf("retry: %v, replayed %v, fn ran %d times; want a replay", err, replayed, runs)
	}

	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	_, err = idem.Do(ctx, lossyOuter{tx}, "k-outer", "h", chargeFn(ctx, 1, &runs))
	if err == nil || errors.Is(err, idem.ErrOutcomeUnknown) {
		t.Fatalf("the savepoint's release lost its answer inside an outer transaction: %v; want a plain error (the caller owns COMMIT), never ErrOutcomeUnknown", err)
	}
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("%v: the cause is lost", err)
	}
}
