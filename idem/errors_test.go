package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/idem"
)

func TestRetryable(t *testing.T) {
	t.Parallel()
	cases := []struct {
		err  error
		want bool
	}{
		{nil, false},
		{idem.ErrInProgress, true},
		{fmt.Errorf("wrapped: %w", idem.ErrOutcomeUnknown), true},
		{&pgconn.PgError{Code: "40001"}, true},
		{&pgconn.PgError{Code: "40P01"}, true},
		{&pgconn.PgError{Code: "55P03"}, true}, // lock_timeout: the holder will end
		// The server ended an idle session: the transaction rolled back
		// whole and the key is free (Config.IdleTimeout; idle_session_timeout).
		{&pgconn.PgError{Severity: "FATAL", Code: "25P03"}, true},
		{fmt.Errorf("charge: %w", &pgconn.PgError{Severity: "FATAL", Code: "25P03"}), true},
		{&pgconn.PgError{Severity: "FATAL", Code: "57P05"}, true},
		// statement_timeout, pg_cancel_backend or a client's cancel request:
		// one SQLSTATE, and two of the three are a decision to stop.
		{&pgconn.PgError{Code: "57014"}, false},
		{fmt.Errorf("idem: commit: %w", &pgconn.PgError{Code: "57014"}), false},
		{fmt.Errorf("%w: %w", idem.ErrOutcomeUnknown, &pgconn.PgError{Code: "57014"}), true},
		{&pgconn.PgError{Code: "08006"}, true},
		{&pgconn.PgError{Code: "23505"}, false},
		{idem.ErrMismatch, false},
		{idem.ErrInvalidKey, false},
		{idem.Refuse("declined", ""), false},
		{errors.New("fn's own error"), false},
		{io.ErrUnexpectedEOF, true}, // a connection closed mid-exchange
		{context.Canceled, false},
		{fmt.Errorf("%w: %w", idem.ErrOutcomeUnknown, context.Canceled), true},
	}
	for _, c := range cases {
		if got := idem.Retryable(c.err); got != c.want {
			t.Errorf("Retryable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func TestRefusalIs(t *testing.T) {
	t.Parallel()
	declined := idem.Refuse("card_declined", "declined")
	replayed := &idem.Refusal{Code: "card_declined", Message: "declined", Status: 402}
	if !errors.Is(fmt.Errorf("charge: %w", replayed), declined) {
		t.Fatal("refusals with one code must match")
	}
	if errors.Is(replayed, idem.Refuse("insufficient_funds", "")) {
		t.Fatal("refusals with other codes must not match")
	}
	if got := declined.WithStatus(402); got.Status != 402 || declined.Status != 0 {
		t.Fatal("WithStatus must copy")
	}
	if declined.Error() != "refused: card_declined: declined" {
		t.Fatalf("Error() = %q", declined.Error())
	}
}

func TestCheckOptions(t *testing.T) {
	t.Parallel()
	if err := idem.CheckOptions(idem.WithTTL(time.Hour), idem.WithTable("billing.keys"), idem.WithScope("t1")); err != nil {
		t.Fatalf("valid options: %v", err)
	}
	for _, c := range []struct {
		opt  idem.Option
		want error
	}{
		{idem.WithTTL(0), idem.ErrInvalidOption},
		{idem.WithWait(-1), idem.ErrInvalidOption},
		{idem.WithTable("Keys"), idem.ErrInvalidTable},
		{idem.WithScope("bad\x00"), idem.ErrInvalidScope},
	} {
		if err := idem.CheckOptions(c.opt); !errors.Is(err, c.want) {
			t.Errorf("CheckOptions: %v, want %v", err, c.want)
		}
	}
}
