package idemhttptest

import (
	"net/http"
	"net/http/httptest"
	"sync"

	"github.com/idemhq/idem/idem"
)

// Faults makes chosen requests fail after the handler ran, the way a
// handler fails when something breaks at the last moment: the kit arms it
// for a key, and its Middleware, installed inside idemhttp's, runs the
// handler for that key's next request, discards the handler's response and
// answers 503 in its place. idemhttp then rolls the transaction back and
// leaves the key free, as it does for any 5xx unless its Config.StoreStatus
// says otherwise, and the kit checks that nothing of the attempt remains and
// that a retry executes.
//
// The zero value is ready to use. A Faults never armed does nothing: the
// middleware can stay in a test's handler stack. Install it only in tests.
//
//	var faults idemhttptest.Faults
//	handler := mw.Handler(faults.Middleware(mux)) // inside idemhttp
//	idemhttptest.Suite{Handler: handler, Faults: &faults, ...}.Run(t)
type Faults struct {
	mu    sync.Mutex
	armed map[string]bool // key -> fired
}

// Middleware returns next wrapped in the fault: a request whose key
// (idem.KeyFromContext, which idemhttp sets) is armed runs next, whose
// response is discarded, and is answered 503. Other requests pass through.
// It must run inside idemhttp's middleware, where the key is known.
func (f *Faults) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k, ok := idem.KeyFromContext(r.Context())
		if !ok || !f.fire(k.Key) {
			next.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(httptest.NewRecorder(), r)
		http.Error(w, "idemhttptest: injected failure after the handler ran", http.StatusServiceUnavailable)
	})
}

// arm makes the next request with key fail.
func (f *Faults) arm(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.armed == nil {
		f.armed = map[string]bool{}
	}
	f.armed[key] = false
}

// fire reports whether key is armed and not yet fired, and fires it.
func (f *Faults) fire(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	fired, armed := f.armed[key]
	if !armed || fired {
		return false
	}
	f.armed[key] = true
	return true
}

// disarm forgets key and reports whether it fired.
func (f *Faults) disarm(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	fired := f.armed[key]
	delete(f.armed, key)
	return fired
}
