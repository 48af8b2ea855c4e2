package idem

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/internal/dbtx"
)

// Commit commits tx, an outer transaction that Do, Run or a wrapped function
// ran in, and classifies a failure the way Do does for the transactions it
// commits itself: an error wrapping ErrOutcomeUnknown when COMMIT was sent
// and no reply confirmed or refused it (the connection closed, a FATAL
// arrived, ctx ended), so that the caller retries with the same keys rather
// than with new ones. Any other error means nothing committed.
//
// pgx's Commit does not separate COMMIT's reply from a FATAL that follows
// it, so a session terminated right after a confirmed COMMIT is reported as
// unknown too: a retry with the same key then replays.
func Commit(ctx context.Context, tx pgx.Tx) error {
	err := tx.Commit(ctx)
	if err == nil {
		return nil
	}
	if dbtx.CommitOutcomeUnknown(err) {
		return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	}
	return fmt.Errorf("idem: commit: %w", err)
}
