package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

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

// TestObserverOfChecksOptions checks the start-up check integrations make of
// the per-call options they pass to every call.
func TestObserverOfChecksOptions(t *testing.T) {
	t.Parallel()
	valid := []idem.Option{
		idem.WithWait(time.Second),
		idem.WithTxOptions(pgx.TxOptions{IsoLevel: pgx.Serializable, DeferrableMode: pgx.NotDeferrable}),
		idem.WithObserver(nil),
		nil, // ignored
	}
	if _, err := idem.ObserverOf(nil, valid...); err != nil {
		t.Fatalf("valid options: %v", err)
	}
	for name, opt := range map[string]idem.Option{
		"negative wait":     idem.WithWait(-1),
		"read only":         idem.WithTxOptions(pgx.TxOptions{AccessMode: pgx.ReadOnly}),
		"begin query":       idem.WithTxOptions(pgx.TxOptions{BeginQuery: "begin"}),
		"unknown isolation": idem.WithTxOptions(pgx.TxOptions{IsoLevel: "chaos"}),
		"unknown deferral":  idem.WithTxOptions(pgx.TxOptions{DeferrableMode: "later"}),
	} {
		if _, err := idem.ObserverOf(nil, opt); !errors.Is(err, idem.ErrInvalidOption) {
			t.Errorf("ObserverOf(nil, %s) = %v, want ErrInvalidOption", name, err)
		}
		// One bad option spoils the lot, wherever it stands.
		if _, err := idem.ObserverOf(nil, append(valid, opt)...); !errors.Is(err, idem.ErrInvalidOption) {
			t.Errorf("ObserverOf(nil, valid..., %s) = %v, want ErrInvalidOption", name, err)
		}
	}
}

// TestNewClientConfig checks the deployment settings that NewClient refuses
// once, at start-up, with the sentinel a caller branches on; none of this
// touches a database.
func TestNewClientConfig(t *testing.T) {
	t.Parallel()
	for _, cfg := range []*idem.Config{
		nil,
		{},
		{Table: "billing.keys", TTL: time.Hour, SweepBatchSize: 10},
		{Table: "idempotency_keys", TTL: time.Nanosecond, MaxResultBytes: 1, IdleTimeout: -1},
	} {
		if _, err := idem.NewClient(unreachablePool(t), cfg); err != nil {
			t.Errorf("NewClient(%+v): %v", cfg, err)
		}
	}
	for name, c := range map[string]struct {
		cfg  idem.Config
		want error
	}{
		"negative TTL":         {idem.Config{TTL: -time.Second}, idem.ErrInvalidOption},
		"negative max result":  {idem.Config{MaxResultBytes: -1}, idem.ErrInvalidOption},
		"negative batch":       {idem.Config{SweepBatchSize: -1}, idem.ErrInvalidOption},
		"idle beyond postgres": {idem.Config{IdleTimeout: 1 << 62}, idem.ErrInvalidOption},
		"upper-case table":     {idem.Config{Table: "Keys"}, idem.ErrInvalidTable},
		"injected table":       {idem.Config{Table: "keys; drop table x"}, idem.ErrInvalidTable},
		"quoted table":         {idem.Config{Table: `"keys"`}, idem.ErrInvalidTable},
		"three-part table":     {idem.Config{Table: "db.billing.keys"}, idem.ErrInvalidTable},
	} {
		if _, err := idem.NewClient(unreachablePool(t), &c.cfg); !errors.Is(err, c.want) {
			t.Errorf("NewClient(%s) = %v, want %v", name, err, c.want)
		}
	}
	if _, err := idem.NewClient(nil, nil); !errors.Is(err, idem.ErrInvalidOption) {
		t.Errorf("NewClient(nil pool) = %v, want ErrInvalidOption", err)
	}
}

func TestValidateScope(t *testing.T) {
	t.Parallel()
	for _, scope := range []string{"", "t1", "user:alice", "tenant/7 — café", strings.Repeat("s", idem.MaxKeyLen)} {
		if err := idem.ValidateScope(scope); err != nil {
			t.Errorf("ValidateScope(%q): %v", scope, err)
		}
	}
	for _, scope := range []string{"bad\x00", "tab\tin", "\x7f", "\u0085", "\xff", strings.Repeat("s", idem.MaxKeyLen+1)} {
		if err := idem.ValidateScope(scope); !errors.Is(err, idem.ErrInvalidScope) {
			t.Errorf("ValidateScope(%q) = %v, want ErrInvalidScope", scope, err)
		}
	}
}

// unreachablePool is a pool that cannot connect (pgxpool connects lazily):
// NewClient checks its Config without touching the database.
func unreachablePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://idem@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
