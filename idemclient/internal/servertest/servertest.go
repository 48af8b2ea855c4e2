// Package servertest holds the servers the module's tests send to: a real
// idem server (idemhttp's middleware on PostgreSQL) and a server that
// answers as a test scripts, for the answers idem never gives; each records
// the key and the body of every request it receives.
package servertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemclient"
	"github.com/idemhq/idem/idemhttp"
	"github.com/idemhq/idem/testkit/testdb"
)

// Seen records what a server received: the Idempotency-Key and the body of
// every request, in order.
type Seen struct {
	mu     sync.Mutex
	keys   []string
	bodies []string
}

func (s *Seen) record(r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys = append(s.keys, r.Header.Get(idemclient.HeaderKey))
	s.bodies = append(s.bodies, string(body))
}

// Requests returns the Idempotency-Key and the body of every request seen,
// in order.
func (s *Seen) Requests() (keys, bodies []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...), append([]string(nil), s.bodies...)
}

// Idem is a real idem server: idemhttp's middleware on a real
// PostgreSQL, in front of POST /charges, which inserts a charge in the
// key's transaction and answers 201. Keys are per Basic user; a request
// without one is answered 401.
type Idem struct {
	*httptest.Server
	Seen
	Charges func() int // committed charges

	Failures atomic.Int32  // the next requests the handler answers 503 (not stored)
	Status   atomic.Int32  // when set, the status every request is answered with, after inserting
	Entered  chan struct{} // when set, receives once POST /charges has inserted
	Release  chan struct{} // when set, POST /charges waits for it before answering
}

// NewIdem returns a real idem server on a database of the test's own; the
// test's end closes it.
func NewIdem(t *testing.T) *Idem {
	t.Helper()
	pool := testdb.New(t)
	ctx := t.Context()
	if _, err := pool.Exec(ctx, "create table charges (id bigserial primary key, amount text not null)"); err != nil {
		t.Fatal(err)
	}
	keys, err := idem.NewClient(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.NewMiddleware(keys, &idemhttp.Config{
		Required: true,
		Scope: func(r *http.Request) (string, error) {
			if user, _, ok := r.BasicAuth(); ok {
				return "user:" + user, nil
			}
			return "", errors.New("not signed in")
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	s := &Idem{}
	s.Charges = func() int {
		var n int
		if err := pool.QueryRow(context.Background(), "select count(*) from charges").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", func(w http.ResponseWriter, r *http.Request) {
		if s.Failures.Add(-1) >= 0 {
			http.Error(w, "try again", http.StatusServiceUnavailable) // 5xx: rolled back, the key stays free
			return
		}
		body, _ := io.ReadAll(r.Body)
		var id int64
		err := idemhttp.Tx(r.Context()).QueryRow(r.Context(),
			"insert into charges (amount) values ($1) returning id", string(body)).Scan(&id)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if s.Entered != nil {
			s.Entered <- struct{}{}
			<-s.Release
		}
		if st := int(s.Status.Load()); st != 0 {
			http.Error(w, http.StatusText(st), st)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	})
	inner := mw.Handler(mux)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.record(r)
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

// Post returns a POST of body to url, signed in as alice, with key as its
// Idempotency-Key unless key is "".
func Post(t *testing.T, url, key, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth("alice", "")
	if key != "" {
		req.Header.Set(idemclient.HeaderKey, key)
	}
	return req
}

// Scripted is a server that answers as a test says, for what idem never
// answers itself: answers lists the status of each attempt in turn (0: hang
// up without an answer), and every attempt after them is answered 201.
type Scripted struct {
	*httptest.Server
	Seen
	answers    []int
	RetryAfter string // the Retry-After of every answer but the 201
	Problem    string // when set, the problem type of every answer but the 201
	n          atomic.Int32
	at         []time.Time // when each attempt arrived
}

// NewScripted returns a server that answers its requests with answers, in
// order (0: the connection reset; past the last, 201); Start serves it.
func NewScripted(t *testing.T, answers ...int) *Scripted {
	t.Helper()
	s := &Scripted{answers: answers}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.record(r)
		i := int(s.n.Add(1)) - 1
		s.mu.Lock()
		s.at = append(s.at, time.Now())
		s.mu.Unlock()
		if i >= len(s.answers) {
			w.Header().Set(idemclient.HeaderReplayed, "true")
			w.WriteHeader(http.StatusCreated)
			return
		}
		st := s.answers[i]
		if st == 0 {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close() // the connection reset: no answer at all
			}
			return
		}
		if s.RetryAfter != "" {
			w.Header().Set("Retry-After", s.RetryAfter)
		}
		if s.Problem != "" {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(st)
			fmt.Fprintf(w, `{"type":%q,"title":"t","status":%d}`, s.Problem, st)
			return
		}
		http.Error(w, strconv.Itoa(st), st)
	}))
	return s
}

// Start starts s, closed when t ends, and returns it.
func (s *Scripted) Start(t *testing.T) *Scripted {
	s.Server.Start()
	t.Cleanup(s.Close)
	return s
}

// Arrivals returns when each request arrived, in order.
func (s *Scripted) Arrivals() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.at...)
}

// SameKey fails t unless keys has n entries, all the same and not empty.
func SameKey(t *testing.T, keys []string, n int) {
	t.Helper()
	if len(keys) != n {
		t.Fatalf("the server received %d requests (keys %q), want %d", len(keys), keys, n)
	}
	for _, k := range keys {
		if k == "" || k != keys[0] {
			t.Fatalf("keys %q: want one key on every attempt", keys)
		}
	}
}
