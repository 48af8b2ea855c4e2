package dbtx

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestClassifyCommit(t *testing.T) {
	t.Parallel()
	fatal := &pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P01"}
	localizedFatal := &pgconn.PgError{Severity: "FATAL"} // a server older than 9.6 sends no V field
	refused := &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "40001"}
	const commitAt = 2 // [complete; something; COMMIT]
	cases := []struct {
		name   string
		failed int
		err    error
		want   CommitOutcome
	}{
		{"all answered", -1, nil, Committed},
		{"FATAL after COMMIT's reply", commitAt + 1, fatal, Committed},
		{"reset after COMMIT's reply", commitAt + 1, io.ErrUnexpectedEOF, Committed},
		{"FATAL instead of COMMIT's reply", commitAt, fatal, Unknown},
		{"localized FATAL instead of COMMIT's reply", commitAt, localizedFatal, Unknown},
		{"reset instead of COMMIT's reply", commitAt, io.ErrUnexpectedEOF, Unknown},
		{"reset awaiting an earlier reply", 0, io.ErrUnexpectedEOF, Unknown},
		{"COMMIT refused", commitAt, refused, RolledBack},
		{"COMMIT turned into ROLLBACK", commitAt, pgx.ErrTxCommitRollback, RolledBack},
		{"statement before COMMIT refused", 0, fmt.Errorf("wrapped: %w", refused), RolledBack},
		{"FATAL before COMMIT was read", 1, fatal, RolledBack},
	}
	for _, c := range cases {
		if got := ClassifyCommit(c.failed, commitAt, c.err); got != c.want {
			t.Errorf("%s: ClassifyCommit(%d, %d, %v) = %v, want %v", c.name, c.failed, commitAt, c.err, got, c.want)
		}
	}
	if !CommitOutcomeUnknown(fatal) || CommitOutcomeUnknown(refused) || CommitOutcomeUnknown(nil) || CommitOutcomeUnknown(errors.New("x")) == false {
		t.Error("CommitOutcomeUnknown: a FATAL or an unanswered COMMIT is unknown; an ERROR reply or nil is not")
	}
}
