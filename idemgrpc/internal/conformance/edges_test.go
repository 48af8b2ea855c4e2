package conformance_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemgrpc"
	"github.com/idemhq/idem/idemgrpc/idemconnect"
	chargev1 "github.com/idemhq/idem/idemgrpc/internal/example/charge/v1"
	"github.com/idemhq/idem/idemgrpc/internal/unary"
	"github.com/idemhq/idem/testkit/faultproxy"
	"github.com/idemhq/idem/testkit/testdb"
)

// With the package's ContextScope, a keyed call whose context carries no
// principal, or whose Scope function names an empty one, is refused before
// anything runs: keys never fall into one space every such caller shares.
// A second caller who sends the first one's key runs a charge of her own.
func TestNoPrincipalIsRefused(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]config{
		"ContextScope": {contextScope: true},
		"empty scope": {scope: func(ctx context.Context) (string, error) {
			s, _ := idem.ScopeFromContext(ctx)
			return s, nil // "" without a caller
		}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			eachTransport(t, func(t *testing.T, tr transport) {
				t.Parallel()
				b := newBank(t)
				c := tr.start(t, b, cfg)
				ctx := context.Background()
				req := withID(uuid1, chargeOf("acct-1", 100))
				for range 2 {
					wantOwn(t, c.charge(ctx, call{}, req), codeUnauthenticated, "NO_PRINCIPAL")
				}
				if b.runs.Load() != 0 || b.keyRows(t) != 0 {
					t.Fatalf("runs %d, keys %d without a principal; want 0, 0", b.runs.Load(), b.keyRows(t))
				}
				alice := wantOK(t, c.charge(ctx, call{caller: "alice"}, req), false)
				bob := wantOK(t, c.charge(ctx, call{caller: "bob"}, req), false)
				if alice.GetChargeId() == bob.GetChargeId() {
					t.Fatalf("bob received alice's charge %v", alice)
				}
			})
		})
	}
}

// A refusal whose status message holds U+0000 is stored and replayed
// exactly, like any other: it never turns into INTERNAL.
func TestStatusMessageWithNUL(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, tr transport) {
		t.Parallel()
		b := newBank(t)
		c := tr.start(t, b, config{})
		req := withID(uuid1, chargeOf("acct-1", nulAmount))
		for i := range 3 {
			r := c.charge(context.Background(), call{}, req)
			if r.code != codeFailedPrecondition || r.message != nulMessage || r.replayed != (i > 0) {
				t.Fatalf("answer %d: %d %q replayed=%t, want FAILED_PRECONDITION %q", i, r.code, r.message, r.replayed, nulMessage)
			}
		}
		if b.runs.Load() != 1 || b.charges(t) != 0 || b.keyRows(t) != 1 {
			t.Fatalf("runs %d, charges %d, keys %d; want 1, 0, 1", b.runs.Load(), b.charges(t), b.keyRows(t))
		}
	})
}

// A stored status is stored once, in the reply: the key's refusal names
// the code alone, without a second copy of the message.
func TestRefusedStatusStoredOnce(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, tr transport) {
		t.Parallel()
		b := newBank(t)
		c := tr.start(t, b, config{})
		if r := c.charge(context.Background(), call{}, withID(uuid1, chargeOf("poor", 500))); r.code != codeFailedPrecondition {
			t.Fatalf("%d %q, want FAILED_PRECONDITION", r.code, r.message)
		}
		var code string
		var message *string
		if err := b.pool.QueryRow(context.Background(),
			"select refusal->>'code', refusal->>'message' from idempotency_keys").Scan(&code, &message); err != nil {
			t.Fatal(err)
		}
		if code != "rpc_failed_precondition" || message != nil {
			t.Fatalf("refusal code %q, message %q; want the code alone", code, deref(message))
		}
	})
}

// COMMIT's own reply decides the answer, on both paths. With a key, a
// COMMIT that was never answered (the connection cut, or a FATAL in its
// place) is UNAVAILABLE with OUTCOME_UNKNOWN and a retry delay, never a
// plain failure, and a retry with the key learns the outcome; a COMMIT
// confirmed before the connection failed is the handler's response.
// Without a key, the plain transaction's commit cannot tell a confirmed
// COMMIT from the FATAL after it, so every failed commit is
// OUTCOME_UNKNOWN.
func TestCommitOutcome(t *testing.T) {
	t.Parallel()
	for _, f := range []struct {
		name      string
		action    faultproxy.Action
		confirmed bool // COMMIT's reply reached the client
	}{
		{"answer lost", faultproxy.CutBefore, false},
		{"FATAL instead of the answer", faultproxy.FatalBefore, false},
		{"confirmed, then FATAL", faultproxy.FatalAfter, true},
		{"confirmed, then reset", faultproxy.CutAfter, true},
	} {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			eachTransport(t, func(t *testing.T, tr transport) {
				t.Parallel()
				u := testdb.URL(t)
				hp, err := testdb.HostPort(u)
				if err != nil {
					t.Fatal(err)
				}
				proxy, err := faultproxy.Start(hp)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = proxy.Close() })
				pool, err := pgxpool.New(context.Background(), testdb.WithHostPort(u, proxy.Addr()))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(pool.Close)
				b := newBankOn(t, pool)
				c := tr.start(t, b, config{})
				ctx := context.Background()
				keyed := withID(uuid1, chargeOf("acct-1", 100))

				// COMMIT's CommandComplete is the message the fault strikes.
				proxy.SetRule(faultproxy.Once(faultproxy.ServerTag("COMMIT"), f.action))
				if r := c.charge(ctx, call{}, keyed); f.confirmed {
					wantOK(t, r, false)
				} else {
					wantOwn(t, r, codeUnavailable, "OUTCOME_UNKNOWN")
					if retryInfoOf(r.details) == nil {
						t.Fatal("no RetryInfo")
					}
				}
				proxy.SetRule(faultproxy.Once(faultproxy.ServerTag("COMMIT"), f.action))
				wantOwn(t, c.charge(ctx, call{}, chargeOf("acct-1", 100)), codeUnavailable, "OUTCOME_UNKNOWN")

				wantOK(t, c.charge(ctx, call{}, keyed), true)
				if b.runs.Load() != 2 || b.charges(t) != 2 || b.balance(t, "acct-1") != 99800 {
					t.Fatalf("runs %d, charges %d, balance %d; want 2, 2, 99800 (both COMMITs were carried out)",
						b.runs.Load(), b.charges(t), b.balance(t, "acct-1"))
				}
			})
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return "(none)"
	}
	return *s
}

type noDB struct{}

func (noDB) Begin(context.Context) (pgx.Tx, error) { return nil, errors.New("no database") }

// Each package's constructor refuses, at start-up, a configuration under
// which calls would silently go unprotected or fail: keys without a scope,
// a database that was never set, methods it cannot cover.
func TestConstructorChecksConfig(t *testing.T) {
	t.Parallel()
	scope := func(context.Context) (string, error) { return "caller", nil }
	for _, tr := range transports {
		for name, c := range map[string]struct {
			db  idem.Beginner
			cfg config
		}{
			"no scope":          {noDB{}, config{}},
			"scope and shared":  {noDB{}, config{scope: scope, shared: true}},
			"typed nil pool":    {(*pgxpool.Pool)(nil), config{shared: true}},
			"no methods":        {noDB{}, config{shared: true, methods: map[string]method{}}},
			"streaming method":  {noDB{}, config{shared: true, methods: map[string]method{chargev1.ChargeService_ListCharges_FullMethodName: {}}}},
			"key field amount":  {noDB{}, config{shared: true, methods: map[string]method{chargev1.ChargeService_Charge_FullMethodName: {keyField: "amount"}}}},
			"negative response": {noDB{}, config{shared: true, maxResponseBytes: -1}},
		} {
			if err := tr.check(c.db, c.cfg); !errors.Is(err, idem.ErrInvalidOption) {
				t.Errorf("%s, %s: %v, want an error wrapping idem.ErrInvalidOption", tr.name(), name, err)
			}
		}
		for name, cfg := range map[string]config{"ContextScope": {contextScope: true}, "SharedKeys": {shared: true}} {
			if err := tr.check(noDB{}, cfg); err != nil {
				t.Errorf("%s, %s: %v", tr.name(), name, err)
			}
		}
	}
}

// DefaultStoreCode of each package stores the codes that report the
// outcome of an operation that ran, and no other.
func TestDefaultStoreCode(t *testing.T) {
	t.Parallel()
	stored := map[int32]bool{codeNotFound: true, 6: true, codeFailedPrecondition: true, 11: true} // NOT_FOUND, ALREADY_EXISTS, FAILED_PRECONDITION, OUT_OF_RANGE
	for _, tr := range transports {
		for c := int32(0); c <= codeUnauthenticated; c++ {
			if got := tr.defaultStore(c); got != stored[c] {
				t.Errorf("%s: DefaultStoreCode(%d) = %t", tr.name(), c, got)
			}
		}
	}
}

// The Reason constants, spelled out in each package for its
// documentation, are the reasons the interceptors send.
func TestReasonConstants(t *testing.T) {
	t.Parallel()
	for _, c := range [][3]string{
		{idemgrpc.ReasonMissingKey, idemconnect.ReasonMissingKey, unary.ReasonMissingKey},
		{idemgrpc.ReasonInvalidKey, idemconnect.ReasonInvalidKey, unary.ReasonInvalidKey},
		{idemgrpc.ReasonKeyMismatch, idemconnect.ReasonKeyMismatch, unary.ReasonKeyMismatch},
		{idemgrpc.ReasonInProgress, idemconnect.ReasonInProgress, unary.ReasonInProgress},
		{idemgrpc.ReasonOutcomeUnknown, idemconnect.ReasonOutcomeUnknown, unary.ReasonOutcomeUnknown},
		{idemgrpc.ReasonUnavailable, idemconnect.ReasonUnavailable, unary.ReasonUnavailable},
		{idemgrpc.ReasonUnauthenticated, idemconnect.ReasonUnauthenticated, unary.ReasonUnauthenticated},
		{idemgrpc.ReasonInvalidRequest, idemconnect.ReasonInvalidRequest, unary.ReasonInvalidRequest},
		{idemgrpc.ReasonResponseTooLarge, idemconnect.ReasonResponseTooLarge, unary.ReasonResponseTooLarge},
		{idemgrpc.ReasonCallEnded, idemconnect.ReasonCallEnded, unary.ReasonCallEnded},
		{idemgrpc.ReasonInternal, idemconnect.ReasonInternal, unary.ReasonInternal},
	} {
		if c[0] != c[2] || c[1] != c[2] {
			t.Errorf("idemgrpc %q, idemconnect %q; the interceptors send %q", c[0], c[1], c[2])
		}
	}
}
