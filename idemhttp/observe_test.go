package idemhttp_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
	"github.com/idemhq/idem/testkit/testdb"
)

// ends is an Observer that keeps the calls' ends and counts their starts.
type ends struct {
	mu     sync.Mutex
	starts int
	ends   []idem.CallEnd
}

func (e *ends) CallStart(ctx context.Context, _ idem.CallStart) context.Context {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.starts++
	return ctx
}

func (e *ends) CallEnd(_ context.Context, c idem.CallEnd) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ends = append(e.ends, c)
}

// take returns the one call observed since the last take.
func (e *ends) take(t *testing.T) idem.CallEnd {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.starts != 1 || len(e.ends) != 1 {
		t.Fatalf("%d starts, %d ends; want one of each", e.starts, len(e.ends))
	}
	c := e.ends[0]
	e.starts, e.ends = 0, nil
	return c
}

// TestObserverThroughMiddleware checks that each way of giving the
// middleware an observer reports each request once, with the status
// answered, including a request whose handler panics.
func TestObserverThroughMiddleware(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	handler := func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Panic") != "" {
			panic(http.ErrAbortHandler)
		}
		w.WriteHeader(http.StatusCreated)
	}
	for _, c := range []struct {
		name string
		mw   func(obs idem.Observer) http.Handler
	}{
		{"Config.Observer", func(obs idem.Observer) http.Handler {
			return handle(t, pool, &idemhttp.Config{Observer: obs}, http.HandlerFunc(handler))
		}},
		{"Client", func(obs idem.Observer) http.Handler {
			keys, err := idem.NewClient(pool, &idem.Config{Observer: obs})
			if err != nil {
				t.Fatal(err)
			}
			return handle(t, keys, nil, http.HandlerFunc(handler))
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			obs := &ends{}
			h := c.mw(obs)
			key := "observe-" + c.name
			send := func(key string, header ...string) {
				r := newRequest(key, header...)
				defer func() {
					if p := recover(); p != nil {
						if err, _ := p.(error); !errors.Is(err, http.ErrAbortHandler) {
							panic(p)
						}
					}
				}()
				h.ServeHTTP(discard{http.Header{}}, r)
			}

			send(key)
			if e := obs.take(t); e.Outcome != idem.OutcomeExecuted || e.HTTPStatus != http.StatusCreated {
				t.Fatalf("first: %v %d", e.Outcome, e.HTTPStatus)
			}
			send(key)
			if e := obs.take(t); e.Outcome != idem.OutcomeReplayed || e.HTTPStatus != http.StatusCreated {
				t.Fatalf("replay: %v %d", e.Outcome, e.HTTPStatus)
			}
			send("bad\x01key")
			if e := obs.take(t); e.Outcome != idem.OutcomeInvalid || e.HTTPStatus != http.StatusBadRequest {
				t.Fatalf("invalid key: %v %d", e.Outcome, e.HTTPStatus)
			}
			send(key+"-panic", "X-Panic", "1")
			if e := obs.take(t); e.Outcome != idem.OutcomeFailed || e.HTTPStatus != 0 || e.Err == nil {
				t.Fatalf("panic: %v %d %v; want failed, no status, an error", e.Outcome, e.HTTPStatus, e.Err)
			}
		})
	}
}

func newRequest(key string, header ...string) *http.Request {
	r, _ := http.NewRequest(http.MethodPost, "/charges", http.NoBody)
	r.Header.Set(idemhttp.HeaderKey, key)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	return r
}

// discard is a ResponseWriter that forgets what is written.
type discard struct{ h http.Header }

func (d discard) Header() http.Header       { return d.h }
func (discard) WriteHeader(int)             {}
func (discard) Write(p []byte) (int, error) { return len(p), nil }
