package idemhttptest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idemhttp"
	"github.com/idemhq/idem/idemhttptest"
	"github.com/idemhq/idem/testkit/testdb"
)

// defect is a mistake the kit must catch in a service.
type defect int

const (
	correct            defect = iota
	poolWrites                // the handler writes through the pool, not idemhttp.Tx
	noMiddleware              // the route is not behind idemhttp: every retry runs the handler
	stores5xx                 // Config.StoreStatus stores every status, 5xx included
	fingerprintNothing        // Config.Fingerprint hashes nothing: any body replays
	envelope                  // a middleware outside idemhttp stamps every response
	racyDedupe                // a dedupe of the service's own: check, then act
	faultsOutside             // Faults' middleware is installed outside idemhttp
)

// service is POST /charges: it inserts a charge of the body's amount and
// answers 201 with the charge as JSON.
type service struct {
	pool    *pgxpool.Pool
	faults  idemhttptest.Faults
	handler http.Handler

	// racyDedupe's state: the answers it remembers by key, and how many
	// requests were built but not yet answered.
	mu          sync.Mutex
	seen        map[string][]byte
	outstanding atomic.Int64
	checked     map[string]chan struct{}
	raced       map[string]bool
}

func newService(t *testing.T, d defect) *service {
	t.Helper()
	s := &service{pool: testdb.New(t), seen: map[string][]byte{}, checked: map[string]chan struct{}{}, raced: map[string]bool{}}
	if _, err := s.pool.Exec(t.Context(), `create table charges (id bigserial primary key, amount int not null)`); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", func(w http.ResponseWriter, r *http.Request) { s.charge(w, r, d) })
	cfg := &idemhttp.Config{
		Required: true,
		Scope:    func(*http.Request) (string, error) { return "account:1", nil }, // one signed-in client
		Logger:   slog.New(slog.DiscardHandler),
	}
	switch d {
	case stores5xx:
		cfg.StoreStatus = func(int) bool { return true }
	case fingerprintNothing:
		cfg.Fingerprint = func(*http.Request, []byte) (string, error) { return "same", nil }
	}
	mw, err := idemhttp.NewMiddleware(s.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	switch d {
	case noMiddleware, racyDedupe:
		s.handler = mux
	case faultsOutside:
		s.handler = s.faults.Middleware(mw.Handler(mux))
	case envelope:
		s.handler = stamp(mw.Handler(s.faults.Middleware(mux)))
	default:
		s.handler = mw.Handler(s.faults.Middleware(mux))
	}
	return s
}

type execer interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func (s *service) charge(w http.ResponseWriter, r *http.Request, d defect) {
	var req struct {
		Amount int    `json:"amount"`
		Note   string `json:"note"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Amount <= 0 {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	if d == racyDedupe {
		s.racyCharge(w, r, req.Amount)
		return
	}
	var db execer = idemhttp.Tx(r.Context())
	if d == poolWrites || d == noMiddleware {
		db = s.pool
	}
	var id int64
	if err := db.QueryRow(r.Context(), "insert into charges (amount) values ($1) returning id", req.Amount).Scan(&id); err != nil {
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/charges/%d", id))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%d,"amount":%d}`, id, req.Amount)
}

// racyCharge remembers answers by key in memory: it looks the key up, and
// only after charging stores the answer. Two duplicates that both look
// before either stores both charge. To make the race certain, a request
// that finds the key absent while other requests are outstanding waits for
// a second one to find it absent too.
func (s *service) racyCharge(w http.ResponseWriter, r *http.Request, amount int) {
	defer s.outstanding.Add(-1)
	key := r.Header.Get(idemhttp.HeaderKey)
	s.mu.Lock()
	body, seen := s.seen[key]
	var wait chan struct{}
	if !seen && !s.raced[key] && s.outstanding.Load() > 1 {
		if ch, ok := s.checked[key]; ok {
			close(ch) // the second one: release the first
			s.raced[key] = true
		} else {
			wait = make(chan struct{})
			s.checked[key] = wait
		}
	}
	s.mu.Unlock()
	if seen {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set(idemhttp.HeaderReplayed, "true")
		w.WriteHeader(http.StatusCreated)
		w.Write(body)
		return
	}
	if wait != nil {
		<-wait
	}
	var id int64
	if err := s.pool.QueryRow(r.Context(), "insert into charges (amount) values ($1) returning id", amount).Scan(&id); err != nil {
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	body = fmt.Appendf(nil, `{"id":%d,"amount":%d}`, id, amount)
	s.mu.Lock()
	s.seen[key] = body
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write(body)
}

// stamp wraps every JSON answer of next in an envelope that says when it
// was served: outside idemhttp, so replays differ from the first answer.
func stamp(next http.Handler) http.Handler {
	var served atomic.Int64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &buffer{header: http.Header{}}
		next.ServeHTTP(rec, r)
		for k, v := range rec.header {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.status)
		fmt.Fprintf(w, `{"data":%s,"served":%d}`, rec.body.Bytes(), served.Add(1))
	})
}

type buffer struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (b *buffer) Header() http.Header { return b.header }
func (b *buffer) WriteHeader(status int) {
	if b.status == 0 {
		b.status = status
	}
}
func (b *buffer) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.status = http.StatusOK
	}
	return b.body.Write(p)
}

// suite returns the kit's Suite for s.
func (s *service) suite() idemhttptest.Suite {
	return idemhttptest.Suite{
		Handler: s.handler,
		DB:      s.pool,
		Faults:  &s.faults,
		Request: func(t testing.TB) *http.Request {
			s.outstanding.Add(1)
			r, err := http.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":500,"note":"kit"}`))
			if err != nil {
				t.Fatal(err)
			}
			r.Header.Set("Content-Type", "application/json")
			return r
		},
		Effects: func(ctx context.Context) (n int, err error) {
			err = s.pool.QueryRow(ctx, "select count(*) from charges").Scan(&n)
			return n, err
		},
	}
}

// results runs suite outside the test and returns the failures of each
// scenario by name.
func results(t *testing.T, suite idemhttptest.Suite) map[string][]string {
	t.Helper()
	res, err := suite.Results(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	failures := map[string][]string{}
	for _, r := range res {
		failures[r.Scenario] = r.Failures
		for _, f := range r.Failures {
			t.Logf("%s: %s", r.Scenario, f)
		}
	}
	return failures
}

// kitObjects counts what the kit leaves in the database: its fault's
// tables, functions and triggers, and the keys in the key table.
func kitObjects(t *testing.T, pool *pgxpool.Pool) (objects, keys int) {
	t.Helper()
	err := pool.QueryRow(t.Context(), `select
		(select count(*) from pg_class where relname like 'idemtest\_%')
		+ (select count(*) from pg_proc where proname like 'idemtest\_%')
		+ (select count(*) from pg_trigger where tgname like 'idemtest\_%'),
		(select count(*) from idempotency_keys)`).Scan(&objects, &keys)
	if err != nil {
		t.Fatal(err)
	}
	return objects, keys
}
