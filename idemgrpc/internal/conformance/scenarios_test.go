package conformance_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/idemhq/idem/idem"
	chargev1 "github.com/idemhq/idem/idemgrpc/internal/example/charge/v1"
)

// The first answer is lost after the server committed; the retry with the
// same key receives it, and the account is charged once.
func TestLostAnswerThenRetry(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, tr transport) {
		t.Parallel()
		b := newBank(t)
		c := tr.start(t, b, config{})
		ctx := context.Background()
		req := withID(uuid1, chargeOf("acct-1", 2500))

		lost := c.charge(ctx, call{lose: true}, req)
		if lost.code != codeUnavailable || !strings.Contains(lost.message, errLost.Error()) {
			t.Fatalf("the lossy client answered %d %q", lost.code, lost.message)
		}
		if n := b.charges(t); n != 1 {
			t.Fatalf("%d charges after the lost answer, want 1 (the server committed)", n)
		}
		resp := wantOK(t, c.charge(ctx, call{}, req), true)
		var id int64
		if err := b.pool.QueryRow(ctx, "select id from charges").Scan(&id); err != nil {
			t.Fatal(err)
		}
		sameProto(t, &chargev1.ChargeResponse{ChargeId: id, AccountId: "acct-1", Amount: 2500, Balance: 97500}, resp)
		if b.runs.Load() != 1 || b.charges(t) != 1 || b.balance(t, "acct-1") != 97500 {
			t.Fatalf("runs %d, charges %d, balance %d; want 1, 1, 97500", b.runs.Load(), b.charges(t), b.balance(t, "acct-1"))
		}
		// The replay is the same again, and so is one with the key in metadata.
		sameProto(t, resp, wantOK(t, c.charge(ctx, call{keys: []string{uuid1}}, req), true))
	})
}

// The client leaves once the handler has started: the handler finishes,
// its answer commits, and the retry receives it.
func TestClientLeavesAfterHandlerStarted(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, tr transport) {
		t.Parallel()
		b := newBank(t)
		b.entered = make(chan struct{}, 1)
		b.waitDone.Store(true)
		c := tr.start(t, b, config{})
		req := withID(uuid1, chargeOf("acct-1", 700))

		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan result, 1)
		go func() { done <- c.charge(ctx, call{}, req) }()
		<-b.entered
		cancel()
		if r := <-done; r.code != codeCanceled {
			t.Fatalf("the client that left got %d %q, want CANCELED", r.code, r.message)
		}
		b.waitDone.Store(false)

		// The first call may still be committing: a retry answered ABORTED
		// tries again, as a client would.
		var resp *chargev1.ChargeResponse
		for i := 0; ; i++ {
			r := c.charge(context.Background(), call{}, req)
			if r.code == codeAborted && i < 1000 {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			resp = wantOK(t, r, true)
			break
		}
		if resp.GetBalance() != 99300 || b.runs.Load() != 1 || b.charges(t) != 1 || b.balance(t, "acct-1") != 99300 {
			t.Fatalf("response %v, runs %d, charges %d, balance %d", resp, b.runs.Load(), b.charges(t), b.balance(t, "acct-1"))
		}
	})
}

// 32 duplicates at once: exactly one execution. Without Wait, the others
// are answered ABORTED with a RetryInfo while it runs; with Wait, they
// wait and receive its answer.
func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	const n = 32
	for _, wait := range []time.Duration{0, time.Minute} {
		t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
			t.Parallel()
			eachTransport(t, func(t *testing.T, tr transport) {
				t.Parallel()
				b := newBank(t)
				b.entered = make(chan struct{}, 1)
				b.gate = make(chan struct{})
				c := tr.start(t, b, config{wait: wait})
				req := withID(uuid1, chargeOf("acct-1", 100))

				results := make(chan result, n)
				var wg sync.WaitGroup
				for range n {
					wg.Go(func() { results <- c.charge(context.Background(), call{}, req) })
				}
				<-b.entered
				if wait == 0 {
					// Everyone but the one holding the key is answered at once.
					for range n - 1 {
						r := <-results
						wantOwn(t, r, codeAborted, "IDEMPOTENCY_KEY_IN_PROGRESS")
						if ri := retryInfoOf(r.details); ri == nil || ri.GetRetryDelay().AsDuration() != time.Second {
							t.Fatalf("RetryInfo %v, want a 1s delay", ri)
						}
					}
				}
				close(b.gate)
				wg.Wait()
				close(results)

				var first *chargev1.ChargeResponse
				fresh, replayed := 0, 0
				for r := range results {
					resp := wantOK(t, r, r.replayed)
					if r.replayed {
						replayed++
					} else {
						fresh++
					}
					if first == nil {
						first = resp
					}
					sameProto(t, first, resp)
				}
				if wait == 0 {
					if fresh != 1 || replayed != 0 {
						t.Fatalf("%d fresh and %d replayed answers, want 1 and 0", fresh, replayed)
					}
					sameProto(t, first, wantOK(t, c.charge(context.Background(), call{}, req), true))
				} else if fresh != 1 || replayed != n-1 {
					t.Fatalf("%d fresh and %d replayed answers, want 1 and %d", fresh, replayed, n-1)
				}
				if b.runs.Load() != 1 || b.charges(t) != 1 || b.balance(t, "acct-1") != 99900 {
					t.Fatalf("runs %d, charges %d, balance %d; want 1, 1, 99900", b.runs.Load(), b.charges(t), b.balance(t, "acct-1"))
				}
			})
		})
	}
}

// The same key with another request is refused, and nothing runs.
func TestMismatch(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, tr transport) {
		t.Parallel()
		b := newBank(t)
		c := tr.start(t, b, config{})
		ctx := context.Background()
		first := wantOK(t, c.charge(ctx, call{}, withID(uuid1, chargeOf("acct-1", 100))), false)

		for name, other := range map[string]*chargev1.ChargeRequest{
			"amount":  withID(uuid1, chargeOf("acct-1", 101)),
			"account": withID(uuid1, chargeOf("acct-2", 100)),
		} {
			t.Run(name, func(t *testing.T) {
				wantOwn(t, c.charge(ctx, call{}, other), codeFailedPrecondition, "IDEMPOTENCY_KEY_MISMATCH")
			})
		}
		sameProto(t, first, wantOK(t, c.charge(ctx, call{}, withID(uuid1, chargeOf("acct-1", 100))), true))
		if b.runs.Load() != 1 || b.charges(t) != 1 {
			t.Fatalf("runs %d, charges %d; want 1, 1", b.runs.Load(), b.charges(t))
		}
	})
}

// Business refusals are stored with their details and replayed; the
// handler's writes roll back.
func TestRefusalReplay(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, tr transport) {
		t.Parallel()
		b := newBank(t)
		c := tr.start(t, b, config{})
		ctx := context.Background()

		req := withID(uuid1, chargeOf("poor", 500))
		first := c.charge(ctx, call{}, req)
		want := insufficientFunds(100)
		if first.code != codeFailedPrecondition || first.message != want.message || first.replayed {
			t.Fatalf("first answer %d %q replayed=%t", first.code, first.message, first.replayed)
		}
		sameProto(t, want.details, first.details)
		if b.charges(t) != 0 || b.balance(t, "poor") != 100 || b.keyRows(t) != 1 {
			t.Fatalf("charges %d, balance %d, keys %d; want 0, 100, 1", b.charges(t), b.balance(t, "poor"), b.keyRows(t))
		}
		// Money arrives; the key still answers with its refusal.
		if _, err := b.pool.Exec(ctx, "update accounts set balance = 1000 where id = 'poor'"); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			again := c.charge(ctx, call{}, req)
			if again.code != first.code || again.message != first.message || !again.replayed {
				t.Fatalf("replay %d %q replayed=%t, want the first refusal, replayed", again.code, again.message, again.replayed)
			}
			sameProto(t, first.details, again.details)
		}

		// NOT_FOUND is stored too.
		missing := withID(uuid2, chargeOf("nobody", 5))
		nf := c.charge(ctx, call{}, missing)
		if nf.code != codeNotFound || nf.replayed {
			t.Fatalf("unknown account: %d %q replayed=%t", nf.code, nf.message, nf.replayed)
		}
		if _, err := b.pool.Exec(ctx, "insert into accounts values ('nobody', 100)"); err != nil {
			t.Fatal(err)
		}
		if r := c.charge(ctx, call{}, missing); r.code != codeNotFound || r.message != nf.message || !r.replayed {
			t.Fatalf("unknown account, replay: %d %q replayed=%t", r.code, r.message, r.replayed)
		}
		if b.runs.Load() != 2 || b.charges(t) != 0 {
			t.Fatalf("runs %d, charges %d; want 2, 0", b.runs.Load(), b.charges(t))
		}
	})
}

// Two callers with the same key are two keys: two executions, and neither
// ever receives the other's answer.
func TestScopeIsolation(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, tr transport) {
		t.Parallel()
		b := newBank(t)
		b.keys = make(chan idem.CallKey, 2)
		c := tr.start(t, b, config{contextScope: true})
		ctx := context.Background()
		req := withID(uuid1, chargeOf("acct-1", 100))

		a := wantOK(t, c.charge(ctx, call{caller: "alice"}, req), false)
		bb := wantOK(t, c.charge(ctx, call{caller: "bob"}, req), false)
		if a.GetChargeId() == bb.GetChargeId() {
			t.Fatalf("bob received alice's charge %v", a)
		}
		for _, want := range []string{"alice", "bob"} {
			if k := <-b.keys; k.Scope != want || k.Key != uuid1 {
				t.Fatalf("the handler ran under %+v, want scope %q and key %q", k, want, uuid1)
			}
		}
		sameProto(t, a, wantOK(t, c.charge(ctx, call{caller: "alice"}, req), true))
		sameProto(t, bb, wantOK(t, c.charge(ctx, call{caller: "bob"}, req), true))
		if b.runs.Load() != 2 || b.charges(t) != 2 || b.balance(t, "acct-1") != 99800 {
			t.Fatalf("runs %d, charges %d, balance %d; want 2, 2, 99800", b.runs.Load(), b.charges(t), b.balance(t, "acct-1"))
		}
	})
}

// With a Scope function that fails, a keyed call is refused before
// anything runs.
func TestScopeFailure(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, tr transport) {
		t.Parallel()
		b := newBank(t)
		c := tr.start(t, b, config{scope: func(ctx context.Context) (string, error) {
			if s, ok := idem.ScopeFromContext(ctx); ok {
				return s, nil
			}
			return "", errors.New("no caller")
		}})
		ctx := context.Background()
		wantOwn(t, c.charge(ctx, call{}, withID(uuid1, chargeOf("acct-1", 100))), codeUnauthenticated, "NO_PRINCIPAL")
		wantOK(t, c.charge(ctx, call{caller: "alice"}, withID(uuid1, chargeOf("acct-1", 100))), false)
		if b.runs.Load() != 1 || b.charges(t) != 1 {
			t.Fatalf("runs %d, charges %d; want 1, 1", b.runs.Load(), b.charges(t))
		}
	})
}

// The key comes from the metadata or from the request_id field.
func TestKeySources(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, tr transport) {
		t.Parallel()
		b := newBank(t)
		c := tr.start(t, b, config{})
		ctx := context.Background()

		t.Run("metadata", func(t *testing.T) {
			req := chargeOf("acct-1", 10)
			first := wantOK(t, c.charge(ctx, call{keys: []string{"order-17/charge"}}, req), false)
			sameProto(t, first, wantOK(t, c.charge(ctx, call{keys: []string{"order-17/charge"}}, req), true))
		})
		t.Run("request_id", func(t *testing.T) {
			req := withID(uuid1, chargeOf("acct-1", 20))
			first := wantOK(t, c.charge(ctx, call{}, req), false)
			sameProto(t, first, wantOK(t, c.charge(ctx, call{}, req), true))
			// The same key in the metadata too.
			sameProto(t, first, wantOK(t, c.charge(ctx, call{keys: []string{uuid1}}, req), true))
		})
		t.Run("request_id not a UUID", func(t *testing.T) {
			for _, id := range []string{"order-17", "00000000-0000-0000-0000-000000000000", strings.ToUpper(uuid2) + "x"} {
				r := c.charge(ctx, call{}, withID(id, chargeOf("acct-1", 30)))
				wantOwn(t, r, codeInvalidArgument, "IDEMPOTENCY_KEY_INVALID")
				var field string
				for _, d := range r.details {
					if br, ok := d.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) == 1 {
						field = br.GetFieldViolations()[0].GetField()
					}
				}
				if field != "request_id" {
					t.Fatalf("BadRequest field %q, want request_id", field)
				}
			}
		})
		t.Run("request_id and metadata disagree", func(t *testing.T) {
			wantOwn(t, c.charge(ctx, call{keys: []string{uuid1}}, withID(uuid2, chargeOf("acct-1", 40))),
				codeInvalidArgument, "IDEMPOTENCY_KEY_INVALID")
		})
		if b.runs.Load() != 2 || b.charges(t) != 2 {
			t.Fatalf("runs %d, charges %d; want 2, 2", b.runs.Load(), b.charges(t))
		}
	})
}

// Invalid keys are refused before any database work; a Required method
// refuses a call without a key.
func TestInvalidKey(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, tr transport) {
		t.Parallel()
		b := newBank(t)
		c := tr.start(t, b, config{methods: map[string]method{
			chargev1.ChargeService_Charge_FullMethodName: {required: true, keyField: "request_id"},
		}})
		ctx := context.Background()
		for name, cl := range map[string]call{
			"too long":   {keys: []string{strings.Repeat("k", 256)}},
			"two values": {keys: []string{"a", "b"}},
		} {
			t.Run(name, func(t *testing.T) {
				wantOwn(t, c.charge(ctx, cl, chargeOf("acct-1", 10)), codeInvalidArgument, "IDEMPOTENCY_KEY_INVALID")
			})
		}
		t.Run("missing", func(t *testing.T) {
			wantOwn(t, c.charge(ctx, call{}, chargeOf("acct-1", 10)), codeInvalidArgument, "IDEMPOTENCY_KEY_MISSING")
		})
		if b.runs.Load() != 0 || b.charges(t) != 0 || b.keyRows(t) != 0 {
			t.Fatalf("runs %d, charges %d, keys %d; want 0, 0, 0", b.runs.Load(), b.charges(t), b.keyRows(t))
		}
	})
}

// A failure of the handler is not stored: its writes roll back, the key
// stays free, and the retry executes once.
func TestHandlerFailureNotStored(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, tr transport) {
		t.Parallel()
		b := newBank(t)
		b.failures.Store(1)
		c := tr.start(t, b, config{})
		ctx := context.Background()
		req := withID(uuid1, chargeOf("acct-1", failAmount))

		if r := c.charge(ctx, call{}, req); r.code != codeUnavailable || r.message != "the ledger is down" || r.replayed {
			t.Fatalf("first call: %d %q replayed=%t, want the handler's UNAVAILABLE", r.code, r.message, r.replayed)
		}
		if b.charges(t) != 0 || b.keyRows(t) != 0 {
			t.Fatalf("charges %d, keys %d after the failure; want 0, 0", b.charges(t), b.keyRows(t))
		}
		first := wantOK(t, c.charge(ctx, call{}, req), false)
		sameProto(t, first, wantOK(t, c.charge(ctx, call{}, req), true))
		if b.runs.Load() != 2 || b.charges(t) != 1 || b.balance(t, "acct-1") != 100000-failAmount {
			t.Fatalf("runs %d, charges %d, balance %d; want 2, 1, %d", b.runs.Load(), b.charges(t), b.balance(t, "acct-1"), 100000-failAmount)
		}

		// INVALID_ARGUMENT from the handler is validation: not stored either.
		bad := withID(uuid2, chargeOf("acct-1", 0))
		for range 2 {
			if r := c.charge(ctx, call{}, bad); r.code != codeInvalidArgument || r.replayed || reasonOf(r.details) != "" {
				t.Fatalf("invalid amount: %d %q replayed=%t", r.code, r.message, r.replayed)
			}
		}
		if b.runs.Load() != 4 || b.keyRows(t) != 1 {
			t.Fatalf("runs %d, keys %d; want 4, 1", b.runs.Load(), b.keyRows(t))
		}
	})
}

// Streaming methods pass through untouched, key or not: no transaction,
// nothing stored.
func TestStreamingPassesThrough(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, tr transport) {
		t.Parallel()
		b := newBank(t)
		c := tr.start(t, b, config{})
		ctx := context.Background()
		a := wantOK(t, c.charge(ctx, call{}, withID(uuid1, chargeOf("acct-1", 10))), false)
		bb := wantOK(t, c.charge(ctx, call{}, withID(uuid2, chargeOf("acct-1", 20))), false)
		for range 2 {
			got, err := c.listCharges(ctx, "acct-1", uuid1)
			if err != nil {
				t.Fatal(err)
			}
			sameProto(t, []*chargev1.ChargeResponse{
				{ChargeId: a.GetChargeId(), AccountId: "acct-1", Amount: 10},
				{ChargeId: bb.GetChargeId(), AccountId: "acct-1", Amount: 20},
			}, got)
		}
		if b.sawTx.Load() != 0 || b.keyRows(t) != 2 {
			t.Fatalf("streaming calls with a transaction %d, keys %d; want 0, 2", b.sawTx.Load(), b.keyRows(t))
		}
	})
}

// Unary methods that are not listed pass through untouched, key or not.
func TestUncoveredMethodPassesThrough(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, tr transport) {
		t.Parallel()
		b := newBank(t)
		c := tr.start(t, b, config{})
		for range 2 {
			got, err := c.getBalance(context.Background(), "acct-1", uuid1)
			if err != nil || got != 100000 {
				t.Fatalf("balance %d, %v", got, err)
			}
		}
		if b.sawTx.Load() != 0 || b.keyRows(t) != 0 {
			t.Fatalf("calls with a transaction %d, keys %d; want 0, 0", b.sawTx.Load(), b.keyRows(t))
		}
	})
}

// Without a key, a covered method runs in a plain transaction: it commits
// a response and rolls back an error, and nothing is stored.
func TestWithoutKey(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, tr transport) {
		t.Parallel()
		b := newBank(t)
		c := tr.start(t, b, config{})
		ctx := context.Background()
		a := wantOK(t, c.charge(ctx, call{}, chargeOf("acct-1", 10)), false)
		bb := wantOK(t, c.charge(ctx, call{}, chargeOf("acct-1", 10)), false)
		if a.GetChargeId() == bb.GetChargeId() {
			t.Fatal("a call without a key was replayed")
		}
		if r := c.charge(ctx, call{}, chargeOf("poor", 500)); r.code != codeFailedPrecondition || r.replayed {
			t.Fatalf("refusal without a key: %d %q", r.code, r.message)
		}
		if b.runs.Load() != 3 || b.charges(t) != 2 || b.keyRows(t) != 0 {
			t.Fatalf("runs %d, charges %d, keys %d; want 3, 2, 0", b.runs.Load(), b.charges(t), b.keyRows(t))
		}
	})
}

// An answer over MaxResponseBytes is not stored and its writes roll back.
func TestResponseTooLarge(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, tr transport) {
		t.Parallel()
		b := newBank(t)
		c := tr.start(t, b, config{maxResponseBytes: 16})
		wantOwn(t, c.charge(context.Background(), call{}, withID(uuid1, chargeOf("acct-1", 10))), codeInternal, "RESPONSE_TOO_LARGE")
		if b.runs.Load() != 1 || b.charges(t) != 0 || b.keyRows(t) != 0 {
			t.Fatalf("runs %d, charges %d, keys %d; want 1, 0, 0", b.runs.Load(), b.charges(t), b.keyRows(t))
		}
	})
}

// The Observer sees each keyed call's outcome, and calls refused before
// any database work as invalid.
func TestObserver(t *testing.T) {
	t.Parallel()
	eachTransport(t, func(t *testing.T, tr transport) {
		t.Parallel()
		b := newBank(t)
		obs := &recorder{}
		c := tr.start(t, b, config{observer: obs})
		ctx := context.Background()
		req := withID(uuid1, chargeOf("acct-1", 10))
		wantOK(t, c.charge(ctx, call{}, req), false)
		wantOK(t, c.charge(ctx, call{}, req), true)
		wantOwn(t, c.charge(ctx, call{keys: []string{"a", "b"}}, chargeOf("acct-1", 10)), codeInvalidArgument, "IDEMPOTENCY_KEY_INVALID")
		wantOK(t, c.charge(ctx, call{}, chargeOf("acct-1", 10)), false) // no key: not a call of idem
		if got, want := strings.Join(obs.outcomes(), " "), "executed replayed invalid"; got != want {
			t.Fatalf("outcomes %q, want %q", got, want)
		}
	})
}

type recorder struct {
	mu  sync.Mutex
	got []string
}

func (r *recorder) CallStart(ctx context.Context, _ idem.CallStart) context.Context { return ctx }

func (r *recorder) CallEnd(_ context.Context, c idem.CallEnd) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, c.Outcome.String())
}

func (r *recorder) outcomes() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}
