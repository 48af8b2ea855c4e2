package idemhttp_test

// Edges of the middleware: the handler's context, observers on panics and
// the Client's result limit.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
)

// The handler's context under a key carries the request's cancellation and
// its cause: context.Cause returns the cause an upstream middleware gave
// (WithTimeoutCause, WithCancelCause), as without a key.
func TestHandlerContextCause(t *testing.T) {
	t.Parallel()
	errUpstream := errors.New("upstream deadline for this route")
	for _, keyed := range []bool{false, true} {
		name := map[bool]string{false: "without key", true: "with key"}[keyed]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			var gotErr, gotCause error
			a := newConfigured(t, nil, func(mux *http.ServeMux, _ *app) {
				mux.HandleFunc("POST /cause", func(w http.ResponseWriter, r *http.Request) {
					cancel(errUpstream) // the upstream gives up while the handler runs
					gotErr, gotCause = r.Context().Err(), context.Cause(r.Context())
					w.WriteHeader(http.StatusNoContent)
				})
			})
			r := httptest.NewRequest(http.MethodPost, "/cause", bytes.NewReader([]byte("{}"))).WithContext(ctx)
			if keyed {
				r.Header.Set(idemhttp.HeaderKey, "k")
			}
			a.handler.ServeHTTP(httptest.NewRecorder(), r)
			if !errors.Is(gotErr, context.Canceled) || !errors.Is(gotCause, errUpstream) {
				t.Fatalf("in the handler: Err %v, Cause %v; want context.Canceled and the upstream's cause", gotErr, gotCause)
			}
		})
	}
}

// countingObserver counts CallStart and CallEnd.
type countingObserver struct {
	mu           sync.Mutex
	starts, ends int
}

func (o *countingObserver) CallStart(ctx context.Context, _ idem.CallStart) context.Context {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.starts++
	return ctx
}

func (o *countingObserver) CallEnd(context.Context, idem.CallEnd) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ends++
}

// A handler panic under a key ends the Observer's call (CallEnd runs once per
// CallStart), so a span begun for the request is ended.
func TestObserverEndsOnHandlerPanic(t *testing.T) {
	t.Parallel()
	obs := &countingObserver{}
	a := newConfigured(t, &idemhttp.Config{Observer: obs})
	func() {
		defer func() { _ = recover() }()
		a.post("k", -3) // the app panics for amount -3
	}()
	if obs.starts != 1 || obs.ends != 1 {
		t.Fatalf("handler panicked under a key: %d CallStart, %d CallEnd; want one of each", obs.starts, obs.ends)
	}
}

// A response within Config.MaxResponseBytes but over the Client's
// Config.MaxResultBytes is answered 500 response-too-large, like one over
// MaxResponseBytes.
func TestResultLimitOfTheClient(t *testing.T) {
	t.Parallel()
	a := newConfigured(t, nil) // only for its database
	keys, err := idem.NewClient(a.pool, &idem.Config{MaxResultBytes: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.NewMiddleware(keys, &idemhttp.Config{SharedKeys: true, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(bytes.Repeat([]byte("x"), 4<<10))
	}))
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set(idemhttp.HeaderKey, "k")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	wantProblem(t, w, http.StatusInternalServerError, idemhttp.ProblemResponseTooLarge)
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// A stored refusal whose body holds U+0000 is stored and replayed byte for
// byte: the middleware keeps the body as bytes and the refusal's message is
// the status text, so no client input can turn it into a 5xx.
func TestRefusalWithNULReplays(t *testing.T) {
	t.Parallel()
	const text = "no account named \x00\x00 here"
	a := newConfigured(t, nil, func(mux *http.ServeMux, a *app) {
		mux.HandleFunc("POST /nul", func(w http.ResponseWriter, r *http.Request) {
			a.runs.Add(1)
			http.Error(w, text, http.StatusNotFound)
		})
	})
	for i := range 2 {
		w := a.send(http.MethodPost, "/nul", "k", []byte("{}"))
		if w.Code != http.StatusNotFound || w.Body.String() != text+"\n" {
			t.Fatalf("answer %d: %d %q, want the stored 404", i, w.Code, w.Body.String())
		}
		wantReplayed(t, w, i == 1)
	}
	if runs := a.runs.Load(); runs != 1 {
		t.Fatalf("%d runs, want 1", runs)
	}
}
