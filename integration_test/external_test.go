package integration_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
)

// cardProcessor is a payment processor that honours idempotency keys, as
// Stripe's API does: the first request with a key charges and its answer
// is stored; every later request with the key and the same body gets the
// same answer; the key with another body is refused 422. hang, when set,
// makes it charge and then hold the answer until the caller gives up.
type cardProcessor struct {
	mu      sync.Mutex
	byKey   map[string]processorCharge
	charges int
	hang    bool
}

type processorCharge struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
}

func newCardProcessor(t *testing.T) (*cardProcessor, *httptest.Server) {
	p := &cardProcessor{byKey: map[string]processorCharge{}}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return p, srv
}

func (p *cardProcessor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	var req struct {
		Amount int64 `json:"amount"`
	}
	if key == "" || json.NewDecoder(r.Body).Decode(&req) != nil || req.Amount <= 0 {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	c, known := p.byKey[key]
	switch {
	case known && c.Amount != req.Amount:
		p.mu.Unlock()
		http.Error(w, "key reused for another charge", http.StatusUnprocessableEntity)
		return
	case !known:
		p.charges++
		c = processorCharge{ID: fmt.Sprintf("ch_%d", p.charges), Amount: req.Amount}
		p.byKey[key] = c
	}
	hang := p.hang
	p.mu.Unlock()
	if hang {
		<-r.Context().Done() // charged; the answer never comes
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(c)
}

func (p *cardProcessor) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.charges
}

func (p *cardProcessor) setHang(h bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hang = h
}

// chargeAt is the caller's side: POST /charges with the key, bounded by
// ctx.
func chargeAt(ctx context.Context, url, key string, amount int64) (processorCharge, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/charges", strings.NewReader(fmt.Sprintf(`{"amount": %d}`, amount)))
	if err != nil {
		return processorCharge{}, err
	}
	req.Header.Set("Idempotency-Key", key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return processorCharge{}, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		return processorCharge{}, &gatewayError{Code: res.StatusCode}
	}
	var c processorCharge
	return c, json.NewDecoder(res.Body).Decode(&c)
}

// processorTimeout bounds the processor call inside fn: the call holds the
// key's transaction, and a pool connection, open while it waits.
const processorTimeout = 2 * time.Second

// TestExternalCallWithDerivedKey is the synchronous pattern of
// docs/EXTERNAL_EFFECTS.md: fn calls the processor with
// idem.DeriveKey(ctx, "charge"), bounded by context.WithTimeout, then
// records the processor's charge in its transaction. The first attempt
// fails after the processor has charged (a 502 of the service's own,
// after the answer), so its transaction rolls back and the key stays free;
// the retry with the same key runs fn again, sends the same derived key,
// and the processor answers the same charge: one charge at the processor,
// one row, and the result names that charge. A third call replays without
// calling the processor. On a pool, a connection and an outer transaction.
func TestExternalCallWithDerivedKey(t *testing.T) {
	forEachVariant(t, func(t *testing.T, s *setup, v variant) {
		proc, srv := newCardProcessor(t)
		ctx := idem.ContextWithScope(context.Background(), "merchant-7")
		fail := true
		var calls int
		work := func(ctx context.Context, tx pgx.Tx) (charge, error) {
			key, err := idem.DeriveKey(ctx, "charge")
			if err != nil {
				return charge{}, err
			}
			callCtx, cancel := context.WithTimeout(ctx, processorTimeout)
			defer cancel()
			calls++
			c, err := chargeAt(callCtx, srv.URL, key, 500)
			if err != nil {
				return charge{}, err
			}
			if fail {
				fail = false
				return charge{}, &gatewayError{Code: 502} // after the processor charged
			}
			var out charge
			err = tx.QueryRow(ctx, "INSERT INTO charges (account_id, amount, ref) VALUES (1, $1, $2) RETURNING id, amount", c.Amount, c.ID).Scan(&out.ID, &out.Amount)
			return out, err
		}
		attempt := func() (c charge, outcome idem.Outcome, err error) {
			v.with(t, s.pool, func(db idem.Beginner) { c, outcome, err = idem.Run(ctx, db, "order-1", "h", work) })
			return c, outcome, err
		}

		if _, _, err := attempt(); !errors.As(err, new(*gatewayError)) {
			t.Fatalf("first attempt: %v, want the 502", err)
		}
		if s.charges() != 0 || s.count("SELECT count(*) FROM idempotency_keys") != 0 || proc.count() != 1 {
			t.Fatalf("after the failed attempt: %d rows, %d keys, %d processor charges; want 0, 0, 1",
				s.charges(), s.count("SELECT count(*) FROM idempotency_keys"), proc.count())
		}
		first, outcome, err := attempt()
		if err != nil || outcome != idem.OutcomeExecuted {
			t.Fatalf("retry: %v %v", outcome, err)
		}
		again, outcome, err := attempt()
		if err != nil || outcome != idem.OutcomeReplayed || again != first {
			t.Fatalf("replay: %+v %v %v, want %+v replayed", again, outcome, err, first)
		}
		var ref string
		if err := s.pool.QueryRow(ctx, "SELECT ref FROM charges").Scan(&ref); err != nil {
			t.Fatal(err)
		}
		if proc.count() != 1 || calls != 2 || s.charges() != 1 || ref != "ch_1" {
			t.Fatalf("processor charges %d after %d calls, %d rows with ref %q; want 1, 2, 1, ch_1", proc.count(), calls, s.charges(), ref)
		}
	})
}

// TestExternalCallTimeout: the processor charges and its answer never
// comes. The call is bounded by its context.WithTimeout; until then the
// key is held (a duplicate is ErrInProgress: the transaction, and a pool
// connection, stay open during the call), and after it fn fails, nothing
// is stored and the key is free. The retry, once the processor answers
// again, gets the charge the lost answer was for: one charge.
func TestExternalCallTimeout(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	proc, srv := newCardProcessor(t)
	proc.setHang(true)
	ctx := context.Background()
	entered := make(chan struct{}, 1)
	work := func(ctx context.Context, tx pgx.Tx) (string, error) {
		key, err := idem.DeriveKey(ctx, "charge")
		if err != nil {
			return "", err
		}
		callCtx, cancel := context.WithTimeout(ctx, processorTimeout)
		defer cancel()
		select {
		case entered <- struct{}{}:
		default:
		}
		c, err := chargeAt(callCtx, srv.URL, key, 700)
		if err != nil {
			return "", err
		}
		_, err = tx.Exec(ctx, "INSERT INTO charges (account_id, amount, ref) VALUES (1, $1, $2)", c.Amount, c.ID)
		return c.ID, err
	}
	done := make(chan error, 1)
	go func() { _, _, err := idem.Run(ctx, s.pool, "order-2", "h", work); done <- err }()
	<-entered
	if _, _, err := idem.Run(ctx, s.pool, "order-2", "h", work); !errors.Is(err, idem.ErrInProgress) {
		t.Fatalf("a duplicate during the call: %v, want ErrInProgress", err)
	}
	if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the call that timed out: %v, want context.DeadlineExceeded", err)
	}
	if s.charges() != 0 || s.keys("in_progress") != 0 || s.count("SELECT count(*) FROM idempotency_keys") != 0 {
		t.Fatal("the timed-out call left rows behind")
	}
	proc.setHang(false)
	id, outcome, err := idem.Run(ctx, s.pool, "order-2", "h", work)
	if err != nil || outcome != idem.OutcomeExecuted || id != "ch_1" || proc.count() != 1 || s.charges() != 1 {
		t.Fatalf("retry: %q %v %v, processor charges %d, rows %d; want ch_1, one charge", id, outcome, err, proc.count(), s.charges())
	}
}

// TestExternalCallThroughIdemhttp is the same pattern in an HTTP handler
// behind idemhttp: the handler derives the processor's key from the
// request's (idem.DeriveKey(r.Context(), ...)), and a 503 it answers after
// the processor charged is not stored, so the client's retry charges the
// same processor charge and is answered 201; the retry after that is a
// replay.
func TestExternalCallThroughIdemhttp(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	proc, psrv := newCardProcessor(t)
	mw, err := idemhttp.NewMiddleware(s.pool, &idemhttp.Config{
		Required: true,
		// One merchant's requests: the scope an authentication middleware
		// would establish.
		Scope: func(*http.Request) (string, error) { return "merchant-7", nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	fail := true
	handler := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, err := idem.DeriveKey(r.Context(), "charge")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), processorTimeout)
		defer cancel()
		c, err := chargeAt(ctx, psrv.URL, key, 900)
		if err != nil || fail {
			fail = false
			http.Error(w, "the processor is unsure; retry", http.StatusServiceUnavailable) // not stored
			return
		}
		if _, err := idemhttp.Tx(r.Context()).Exec(r.Context(), "INSERT INTO charges (account_id, amount, ref) VALUES (1, $1, $2)", c.Amount, c.ID); err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, c.ID)
	}))
	srv := httptest.NewServer(handler)
	defer srv.Close()
	post := func() (int, string, bool) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"amount": 900}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemhttp.HeaderKey, "order-3")
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(bytes.TrimSpace(b)), res.Header.Get(idemhttp.HeaderReplayed) == "true"
	}
	if status, _, _ := post(); status != http.StatusServiceUnavailable {
		t.Fatalf("first: %d, want 503", status)
	}
	status, body, replayed := post()
	if status != http.StatusCreated || replayed || body != "ch_1" {
		t.Fatalf("retry: %d %q replayed=%v, want 201 ch_1", status, body, replayed)
	}
	status, body, replayed = post()
	if status != http.StatusCreated || !replayed || body != "ch_1" {
		t.Fatalf("replay: %d %q replayed=%v", status, body, replayed)
	}
	if proc.count() != 1 || s.charges() != 1 {
		t.Fatalf("%d processor charges, %d rows; want 1 and 1", proc.count(), s.charges())
	}
}
