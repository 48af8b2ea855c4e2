package payments_test

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

	"github.com/google/uuid"
	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/time/rate"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
	"github.com/idemhq/idem/payments_example/api"
	"github.com/idemhq/idem/payments_example/internal/payments"
	"github.com/idemhq/idem/payments_example/internal/spectest"
	"github.com/idemhq/idem/testkit/testdb"
)

// env is one test's service: its own database, the handler under test
// served by httptest, a client whose every request and response is checked
// against the OpenAPI spec, and the pool to check the database with.
type env struct {
	t      *testing.T
	pool   *pgxpool.Pool
	srv    *httptest.Server
	client *http.Client
}

func setup(t *testing.T, handler func(testing.TB, *pgxpool.Pool) http.Handler) *env {
	t.Helper()
	pool := testdb.New(t)
	if err := payments.Migrate(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(handler(t, pool))
	t.Cleanup(srv.Close)
	client := &http.Client{Transport: spectest.New(t).Transport(t, srv.Client().Transport)}
	return &env{t: t, pool: pool, srv: srv, client: client}
}

// protected is the service without its rate limit: the tests send many
// payments at once on purpose; TestRateLimit checks the limit.
func protected(t testing.TB, pool *pgxpool.Pool) http.Handler {
	keys, err := idem.NewClient(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := payments.NewHandler(pool, keys, &payments.Config{PaymentRate: rate.Inf})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func unprotected(_ testing.TB, pool *pgxpool.Pool) http.Handler {
	return payments.NewUnprotectedHandler(pool, nil, nil)
}

// request is one request of a test. An empty auth or key sends no
// Authorization or Idempotency-Key header.
type request struct {
	method, path string
	auth         string // the API key
	key          string // the Idempotency-Key
	body         string
	header       http.Header // more headers
	// invalid marks a request the test sends outside the spec on purpose;
	// its response is still checked against the spec.
	invalid bool
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) replayed() bool { return r.header.Get(idemhttp.HeaderReplayed) == "true" }

// send sends one request. It is safe to call from several goroutines.
func (e *env) send(rq request) response {
	e.t.Helper()
	ctx := e.t.Context()
	if rq.invalid {
		ctx = spectest.ExpectInvalidRequest(ctx)
	}
	req, err := http.NewRequestWithContext(ctx, rq.method, e.srv.URL+rq.path, strings.NewReader(rq.body))
	if err != nil {
		e.t.Error(err)
		return response{}
	}
	for k, v := range rq.header {
		req.Header[k] = v
	}
	if rq.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if rq.auth != "" {
		req.Header.Set("Authorization", "Bearer "+rq.auth)
	}
	if rq.key != "" {
		req.Header.Set(idemhttp.HeaderKey, rq.key)
	}
	res, err := e.client.Do(req)
	if err != nil {
		e.t.Error(err)
		return response{}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Error(err)
	}
	return response{status: res.StatusCode, header: res.Header, body: b}
}

// pay sends POST /payments with the API key auth and the Idempotency-Key.
func (e *env) pay(auth, key, body string) response {
	e.t.Helper()
	return e.send(request{method: "POST", path: "/payments", auth: auth, key: key, body: body})
}

// signUp opens an account and returns it with its API key, its balance
// set to balance in the database (sign-up opens every account with
// payments.OpeningBalance).
func (e *env) signUp(owner string, balance int64) api.AccountCreated {
	e.t.Helper()
	res := e.send(request{method: "POST", path: "/accounts", body: fmt.Sprintf(`{"owner": %q}`, owner)})
	if res.status != http.StatusCreated {
		e.t.Fatalf("sign up: %d %s", res.status, res.body)
	}
	var a api.AccountCreated
	decodeInto(e.t, res, &a)
	if _, err := e.pool.Exec(e.t.Context(), "update accounts set balance = $2 where id = $1", a.Id, balance); err != nil {
		e.t.Fatal(err)
	}
	a.Balance = balance
	return a
}

// balance and payments read the truth from the database, not from the API.
func (e *env) balance(accountID uuid.UUID) int64 {
	e.t.Helper()
	var b int64
	if err := e.pool.QueryRow(e.t.Context(), "select balance from accounts where id = $1", accountID).Scan(&b); err != nil {
		e.t.Fatal(err)
	}
	return b
}

func (e *env) payments(accountID uuid.UUID) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(e.t.Context(), "select count(*) from payments where account_id = $1", accountID).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// keys counts the rows of the idempotency key table.
func (e *env) keys() int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(e.t.Context(), "select count(*) from idempotency_keys").Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

func decodeInto(t *testing.T, res response, v any) {
	t.Helper()
	if err := json.Unmarshal(res.body, v); err != nil {
		t.Fatalf("decode %s: %v", res.body, err)
	}
}

func payment(accountID uuid.UUID, amount int64) string {
	return fmt.Sprintf(`{"account_id": %q, "amount": %d, "currency": "USD"}`, accountID, amount)
}

// wantProblem checks an error answer: its status, problem+json, and the
// problem's type.
func wantProblem(t *testing.T, res response, status int, typ string) {
	t.Helper()
	if res.status != status {
		t.Fatalf("status %d, want %d; body %.300s", res.status, status, res.body)
	}
	if ct := res.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/problem+json") {
		t.Errorf("Content-Type %q, want application/problem+json", ct)
	}
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
	}
	decodeInto(t, res, &p)
	if p.Type != typ || p.Status != status {
		t.Errorf("problem %s, want type %q and status %d", res.body, typ, status)
	}
}

func TestHealthz(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)
	if res := e.send(request{method: "GET", path: "/healthz"}); res.status != http.StatusOK {
		t.Fatalf("GET /healthz: %d %s", res.status, res.body)
	}
}

// TestOpenAPIServed checks that GET /openapi.yaml serves the bundled spec,
// which loads and validates on its own.
func TestOpenAPIServed(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)
	res := e.send(request{method: "GET", path: "/openapi.yaml"})
	if res.status != http.StatusOK || res.header.Get("Content-Type") != "application/yaml" {
		t.Fatalf("GET /openapi.yaml: %d %s", res.status, res.header.Get("Content-Type"))
	}
	if !bytes.Equal(res.body, api.Spec()) {
		t.Fatal("GET /openapi.yaml does not serve api.Spec()")
	}
	if _, err := spectest.Load(t.Context()); err != nil {
		t.Fatalf("the served document does not stand on its own: %v", err)
	}
}

// TestMetricsNotPublic is the review's finding: GET /metrics was served
// on the public listener, open, with payment volume, decline rates, keys
// in progress and SDK versions. The API serves no metrics: GET /metrics is
// 404, with an API key or without, and never asks for credentials.
func TestMetricsNotPublic(t *testing.T) {
	t.Parallel()
	for name, handler := range map[string]func(testing.TB, *pgxpool.Pool) http.Handler{"protected": protected, "unprotected": unprotected} {
		t.Run(name, func(t *testing.T) {
			e := setup(t, handler)
			a := e.signUp("ops", 1)
			for _, auth := range []string{"", a.ApiKey} {
				// Not through the spec-checking client: the path is in
				// no spec.
				req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, e.srv.URL+"/metrics", nil)
				if err != nil {
					t.Fatal(err)
				}
				if auth != "" {
					req.Header.Set("Authorization", "Bearer "+auth)
				}
				raw, err := e.srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(raw.Body)
				_ = raw.Body.Close()
				res := response{status: raw.StatusCode, header: raw.Header, body: body}
				wantProblem(t, res, http.StatusNotFound, "about:blank")
				if bytes.Contains(res.body, []byte("idem_")) || res.header.Get("WWW-Authenticate") != "" {
					t.Fatalf("GET /metrics (API key %v): %s %v", auth != "", res.body, res.header)
				}
			}
		})
	}
}

func TestAccounts(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)

	t.Run("sign up and read", func(t *testing.T) {
		res := e.send(request{method: "POST", path: "/accounts", body: `{"owner": "ada"}`})
		if res.status != http.StatusCreated || res.header.Get("Cache-Control") != "no-store" {
			t.Fatalf("sign up: %d, Cache-Control %q", res.status, res.header.Get("Cache-Control"))
		}
		var a api.AccountCreated
		decodeInto(t, res, &a)
		if a.Id.Version() != 4 || a.Owner != "ada" || a.Balance != payments.OpeningBalance {
			t.Fatalf("created %+v, want a random (version 4) id and the opening balance", a)
		}
		if loc := res.header.Get("Location"); loc != "/accounts/"+a.Id.String() {
			t.Errorf("Location %q", loc)
		}
		got := e.send(request{method: "GET", path: "/accounts/" + a.Id.String(), auth: a.ApiKey})
		var read api.Account
		decodeInto(t, got, &read)
		if got.status != http.StatusOK || read != (api.Account{Id: a.Id, Owner: "ada", Balance: payments.OpeningBalance}) {
			t.Fatalf("GET: %d %+v", got.status, read)
		}
	})

	t.Run("unknown account is 404", func(t *testing.T) {
		a := e.signUp("ann", 1)
		wantProblem(t, e.send(request{method: "GET", path: "/accounts/" + uuid.NewString(), auth: a.ApiKey}), http.StatusNotFound, payments.ProblemNoSuchAccount)
		wantProblem(t, e.send(request{method: "GET", path: "/accounts/abc", auth: a.ApiKey, invalid: true}), http.StatusNotFound, payments.ProblemNoSuchAccount)
		wantProblem(t, e.send(request{method: "GET", path: "/accounts/1", auth: a.ApiKey, invalid: true}), http.StatusNotFound, payments.ProblemNoSuchAccount)
	})

	t.Run("invalid input is 400", func(t *testing.T) {
		for name, body := range map[string]string{
			"empty owner":          `{"owner": " "}`,
			"missing owner":        `{}`,
			"null owner":           `{"owner": null}`,
			"owner not a string":   `{"owner": 5}`,
			"unknown field":        `{"owner": "bob", "overdraft": 100}`,
			"field in other case":  `{"OWNER": "bob"}`,
			"field twice":          `{"owner": "bob", "owner": "bo"}`,
			"malformed":            `{"owner": "bob",`,
			"two documents":        `{"owner": "bob"} {}`,
			"not an object":        `["bob", 1]`,
			"empty":                ``,
			"owner with NUL":       `{"owner": "bo\u0000b"}`,
			"owner with a newline": `{"owner": "bo\nb"}`,
			"owner with C1":        `{"owner": "bo\u0085b"}`,
			"owner too long":       `{"owner": "` + strings.Repeat("é", 101) + `"}`,
			"invalid UTF-8":        "{\"owner\": \"bo\xffb\"}",
		} {
			t.Run(name, func(t *testing.T) {
				wantProblem(t, e.send(request{method: "POST", path: "/accounts", body: body, invalid: true}), http.StatusBadRequest, payments.ProblemInvalidRequest)
			})
		}
		var n int
		if err := e.pool.QueryRow(t.Context(), "select count(*) from accounts where owner like 'bo%'").Scan(&n); err != nil || n != 0 {
			t.Fatalf("%d accounts created from invalid bodies (%v)", n, err)
		}
	})

	t.Run("owner of 200 bytes is accepted", func(t *testing.T) {
		e.signUp(strings.Repeat("é", 100), 1)
	})

	t.Run("body over 1 MiB is 413", func(t *testing.T) {
		big := `{"owner": "` + strings.Repeat("x", payments.MaxBodyBytes) + `"}`
		wantProblem(t, e.send(request{method: "POST", path: "/accounts", body: big, invalid: true}), http.StatusRequestEntityTooLarge, idemhttp.ProblemBodyTooLarge)
	})
}

// TestOwnerWithNUL is the review's finding: an owner holding NUL reached
// PostgreSQL, whose text type refused it, and the service answered 500.
func TestOwnerWithNUL(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)
	res := e.send(request{method: "POST", path: "/accounts", body: `{"owner": "\u0000"}`, invalid: true})
	wantProblem(t, res, http.StatusBadRequest, payments.ProblemInvalidRequest)
	if !bytes.Contains(res.body, []byte("control characters")) {
		t.Errorf("detail %s does not say what is wrong", res.body)
	}
}

// TestSignUpBalanceIsFixed is the review's finding: sign-up took the
// opening balance from the caller, and {"balance": 9223372036854775807}
// opened an account holding 92 quadrillion dollars. Every account now
// opens with payments.OpeningBalance; a body naming a balance, any
// balance, is refused 400 and opens nothing.
func TestSignUpBalanceIsFixed(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)
	for _, balance := range []string{"9223372036854775807", "100", "0", "-1", "1.5", `"5"`, fmt.Sprint(payments.OpeningBalance)} {
		res := e.send(request{method: "POST", path: "/accounts", body: `{"owner": "rich", "balance": ` + balance + `}`, invalid: true})
		wantProblem(t, res, http.StatusBadRequest, payments.ProblemInvalidRequest)
		if !bytes.Contains(res.body, []byte("balance cannot be chosen")) {
			t.Errorf("balance %s: detail %s does not say why", balance, res.body)
		}
	}
	var n int
	if err := e.pool.QueryRow(t.Context(), "select count(*) from accounts").Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d accounts opened with a balance of the caller's (%v)", n, err)
	}
	a := e.send(request{method: "POST", path: "/accounts", body: `{"owner": "rich"}`})
	var created api.AccountCreated
	decodeInto(t, a, &created)
	if a.status != http.StatusCreated || created.Balance != payments.OpeningBalance {
		t.Fatalf("sign-up without a balance: %d %s, want the opening balance %d", a.status, a.body, payments.OpeningBalance)
	}
}

// TestIDsRevealNoVolume is the review's finding: account and payment ids
// were sequential, so any client learnt how many accounts and payments
// there were (and, from two of them, how many in between), and could
// guess other accounts' idempotency scopes. Ids are now random UUIDs
// (version 4): two accounts opened one after the other, and two payments
// made one after the other, have ids with no order or distance to read.
func TestIDsRevealNoVolume(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)
	a, b := e.signUp("first", 1000), e.signUp("second", 1000)
	var p, q api.Payment
	decodeInto(t, e.pay(a.ApiKey, "ids-1", payment(a.Id, 1)), &p)
	decodeInto(t, e.pay(a.ApiKey, "ids-2", payment(a.Id, 1)), &q)
	for name, id := range map[string]uuid.UUID{"account": a.Id, "next account": b.Id, "payment": p.Id, "next payment": q.Id} {
		if id.Version() != 4 || id.Variant() != uuid.RFC4122 {
			t.Errorf("%s id %s: version %d, want a random UUID (version 4)", name, id, id.Version())
		}
	}
	if a.Id == b.Id || p.Id == q.Id {
		t.Fatal("two accounts or two payments with one id")
	}
	var sequential int
	err := e.pool.QueryRow(t.Context(), `select
		(select count(*) from information_schema.columns
		 where table_name in ('accounts', 'payments') and column_name = 'id' and data_type <> 'uuid') +
		(select count(*) from pg_sequences where schemaname = current_schema()
		 -- idem's fencing tokens: internal, never in an answer.
		 and sequencename <> 'idempotency_keys_operations_token_seq')`).Scan(&sequential)
	if err != nil || sequential != 0 {
		t.Fatalf("%d sequential ids or sequences in the schema (%v)", sequential, err)
	}
}

// TestSignUpKeyShownOnce checks the API key: recognisable, shown in the
// sign-up answer only, stored only as its SHA-256 hash, never in the key
// table, and a new one for every sign-up, Idempotency-Key or not.
func TestSignUpKeyShownOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)
	a := e.signUp("kim", 10)
	if !strings.HasPrefix(a.ApiKey, payments.APIKeyPrefix) || len(a.ApiKey) != 46 {
		t.Fatalf("api_key %q, want sk_ and 43 base64url characters", a.ApiKey)
	}
	var stored []byte
	var matches bool
	err := e.pool.QueryRow(t.Context(),
		"select api_key_sha256, api_key_sha256 = sha256(convert_to($2, 'UTF8')) from accounts where id = $1",
		a.Id, a.ApiKey).Scan(&stored, &matches)
	if err != nil || !matches {
		t.Fatalf("stored %x is not the SHA-256 of the key (%v)", stored, err)
	}
	var leaks int
	err = e.pool.QueryRow(t.Context(), `select
		(select count(*) from accounts a where a::text like '%' || $1 || '%') +
		(select count(*) from idempotency_keys k where k::text like '%' || $1 || '%' or encode(k.response, 'escape') like '%' || $1 || '%')`,
		a.ApiKey).Scan(&leaks)
	if err != nil || leaks != 0 {
		t.Fatalf("the key itself is stored in %d rows (%v)", leaks, err)
	}
	got := e.send(request{method: "GET", path: "/accounts/" + a.Id.String(), auth: a.ApiKey})
	if got.status != http.StatusOK || bytes.Contains(got.body, []byte(a.ApiKey)) || bytes.Contains(got.body, []byte("api_key")) {
		t.Fatalf("GET shows the key again: %d %s", got.status, got.body)
	}

	// Sign-up is not idempotent: a key header changes nothing, and a
	// second sign-up never replays the first one's secret.
	body := `{"owner": "lee"}`
	first := e.send(request{method: "POST", path: "/accounts", key: "signup-1", body: body})
	again := e.send(request{method: "POST", path: "/accounts", key: "signup-1", body: body})
	var x, y api.AccountCreated
	decodeInto(t, first, &x)
	decodeInto(t, again, &y)
	if again.replayed() || x.ApiKey == y.ApiKey || x.Id == y.Id {
		t.Fatalf("second sign-up replayed=%v, same key %v, same account %v", again.replayed(), x.ApiKey == y.ApiKey, x.Id == y.Id)
	}
	if n := e.keys(); n != 0 {
		t.Fatalf("%d idempotency keys stored by sign-ups", n)
	}
}

// TestAuthentication checks that every operation but the open ones needs
// a valid API key: without one the answer is 401 with WWW-Authenticate:
// Bearer, nothing runs, and nothing is stored under the Idempotency-Key.
func TestAuthentication(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)
	a := e.signUp("ada", 1000)
	other := e.signUp("bob", 1000)
	wrongKey := payments.APIKeyPrefix + strings.Repeat("A", 43)

	cases := map[string]http.Header{
		"no Authorization":    nil,
		"a wrong key":         {"Authorization": {"Bearer " + wrongKey}},
		"a malformed key":     {"Authorization": {"Bearer not-a-key"}},
		"another scheme":      {"Authorization": {"Basic " + a.ApiKey}},
		"two keys":            {"Authorization": {"Bearer " + a.ApiKey, "Bearer " + other.ApiKey}},
		"the scheme only":     {"Authorization": {"Bearer"}},
		"a key with a suffix": {"Authorization": {"Bearer " + a.ApiKey + "x"}},
	}
	for name, h := range cases {
		t.Run(name, func(t *testing.T) {
			for _, rq := range []request{
				{method: "GET", path: "/accounts/" + a.Id.String()},
				{method: "POST", path: "/payments", key: "auth-" + name, body: payment(a.Id, 10)},
			} {
				rq.header = h
				res := e.send(rq)
				wantProblem(t, res, http.StatusUnauthorized, idemhttp.ProblemUnauthorized)
				if ch := res.header.Get("WWW-Authenticate"); !strings.HasPrefix(ch, "Bearer") {
					t.Errorf("%s %s: WWW-Authenticate %q, want a Bearer challenge", rq.method, rq.path, ch)
				}
			}
		})
	}
	if n := e.keys(); n != 0 {
		t.Fatalf("%d idempotency keys stored by 401 answers", n)
	}
	if got := e.balance(a.Id); got != 1000 {
		t.Fatalf("balance %d after unauthenticated payments, want 1000", got)
	}

	t.Run("the scheme is case-insensitive", func(t *testing.T) {
		res := e.send(request{method: "GET", path: "/accounts/" + a.Id.String(), header: http.Header{"Authorization": {"bearer " + a.ApiKey}}})
		if res.status != http.StatusOK {
			t.Fatalf("%d %s", res.status, res.body)
		}
	})

	t.Run("a 401 leaves the key free", func(t *testing.T) {
		key := "auth-then-ok"
		wantProblem(t, e.send(request{method: "POST", path: "/payments", key: key, body: payment(a.Id, 10)}), http.StatusUnauthorized, idemhttp.ProblemUnauthorized)
		res := e.pay(a.ApiKey, key, payment(a.Id, 10))
		if res.status != http.StatusCreated || res.replayed() {
			t.Fatalf("with the API key: %d replayed=%v %s", res.status, res.replayed(), res.body)
		}
	})
}

// TestSecurityMatchesSpec checks the service's list of open operations
// against the spec: every operation the spec secures with bearerAuth
// answers 401 without an API key, and no open one does.
func TestSecurityMatchesSpec(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)
	doc := spectest.New(t).Doc()
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			security := doc.Security
			if op.Security != nil {
				security = *op.Security
			}
			secured := len(security) > 0
			rq := request{method: method, path: strings.ReplaceAll(path, "{id}", "1"), invalid: true}
			if method == http.MethodPost {
				rq.body, rq.key = "{}", "security-"+op.OperationID
			}
			res := e.send(rq)
			if got := res.status == http.StatusUnauthorized; got != secured {
				t.Errorf("%s %s: status %d without an API key; the spec secures it: %v", method, path, res.status, secured)
			}
		}
	}
}

// TestOtherAccountsAreNotFound checks that an API key reaches only its own
// account: another account's is answered 404, as a missing one, for reads
// and for payments, and its money does not move.
func TestOtherAccountsAreNotFound(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)
	alice := e.signUp("alice", 1000)
	mallory := e.signUp("mallory", 1000)

	missing := e.send(request{method: "GET", path: "/accounts/" + uuid.NewString(), auth: mallory.ApiKey})
	foreign := e.send(request{method: "GET", path: "/accounts/" + alice.Id.String(), auth: mallory.ApiKey})
	wantProblem(t, foreign, http.StatusNotFound, payments.ProblemNoSuchAccount)
	if !bytes.Equal(foreign.body, missing.body) {
		t.Errorf("another account's 404 %s differs from a missing one's %s", foreign.body, missing.body)
	}
	wantProblem(t, e.pay(mallory.ApiKey, "steal-1", payment(alice.Id, 500)), http.StatusNotFound, payments.ProblemNoSuchAccount)
	if got, n := e.balance(alice.Id), e.payments(alice.Id); got != 1000 || n != 0 {
		t.Fatalf("alice: balance %d with %d payments after mallory's attempt", got, n)
	}
}

// TestKeysScopedByPrincipal checks that idempotency keys are scoped by the
// API key's account: the same Idempotency-Key sent by two accounts is two
// unrelated keys, and an account resending another's key and body is
// answered for itself (404: the account is not its own), never with the
// other account's stored answer.
func TestKeysScopedByPrincipal(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)
	alice := e.signUp("alice", 1000)
	bob := e.signUp("bob", 1000)
	const key = "shared-key"

	fromAlice := e.pay(alice.ApiKey, key, payment(alice.Id, 100))
	fromBob := e.pay(bob.ApiKey, key, payment(bob.Id, 200))
	if fromAlice.status != http.StatusCreated || fromBob.status != http.StatusCreated || fromBob.replayed() {
		t.Fatalf("alice %d, bob %d (replayed=%v): want both charged", fromAlice.status, fromBob.status, fromBob.replayed())
	}
	if e.balance(alice.Id) != 900 || e.balance(bob.Id) != 800 {
		t.Fatalf("balances %d and %d, want 900 and 800", e.balance(alice.Id), e.balance(bob.Id))
	}

	// Bob resends Alice's key with Alice's body.
	stolen := e.pay(bob.ApiKey, "alice-only", payment(alice.Id, 100))
	wantProblem(t, stolen, http.StatusNotFound, payments.ProblemNoSuchAccount)
	aliceFirst := e.pay(alice.ApiKey, "alice-only", payment(alice.Id, 100))
	if aliceFirst.status != http.StatusCreated || aliceFirst.replayed() {
		t.Fatalf("alice's own key after bob used it: %d replayed=%v", aliceFirst.status, aliceFirst.replayed())
	}
	replay := e.pay(bob.ApiKey, "alice-only", payment(alice.Id, 100))
	wantProblem(t, replay, http.StatusNotFound, payments.ProblemNoSuchAccount)
	if bytes.Contains(replay.body, aliceFirst.body) || !bytes.Equal(replay.body, stolen.body) {
		t.Fatalf("bob received %s, want his own 404, never alice's answer %s", replay.body, aliceFirst.body)
	}
	if got := e.balance(alice.Id); got != 800 {
		t.Fatalf("alice's balance %d, want 800", got)
	}
}

// TestErrorBodiesEchoNothing is the review's finding: decode answered
// "invalid JSON body: " + the decoder's error, which repeats the client's
// field names and Go's own (`Go struct field paymentRequest.amount of type
// int64`); a field name of 1 MiB of '<' became a 6 MiB escaped error body.
// Error details are now fixed sentences naming at most a field of the API.
func TestErrorBodiesEchoNothing(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)
	a := e.signUp("ada", 1000)
	huge := `{"` + strings.Repeat("<", payments.MaxBodyBytes-64) + `": 1}`

	t.Run("a huge unknown field", func(t *testing.T) {
		for _, res := range []response{
			e.send(request{method: "POST", path: "/accounts", body: huge, invalid: true}),
			e.send(request{method: "POST", path: "/payments", auth: a.ApiKey, key: "huge-1", body: huge, invalid: true}),
		} {
			wantProblem(t, res, http.StatusBadRequest, payments.ProblemInvalidRequest)
			if len(res.body) >= 512 || bytes.Contains(res.body, []byte("<")) || bytes.Contains(res.body, []byte(`\u003c`)) {
				t.Fatalf("%d-byte error body: %.200s", len(res.body), res.body)
			}
		}
	})

	t.Run("fixed messages", func(t *testing.T) {
		for body, want := range map[string]string{
			`{"account_id": "00000000-0000-4000-8000-000000000001", "amount": "5", "currency": "USD"}`:                    "amount must be an integer",
			`{"account_id": "00000000-0000-4000-8000-000000000001", "amount": 1.5, "currency": "USD"}`:                    "amount must be an integer",
			`{"account_id": "00000000-0000-4000-8000-000000000001", "amount": 99999999999999999999, "currency": "USD"}`:   "amount must be an integer",
			`{"account_id": "00000000-0000-4000-8000-000000000001", "amount": 5, "currency": 7}`:                          "currency must be a string",
			`{"account_id": "00000000-0000-4000-8000-000000000001", "amount": 5, "currency": "USD", "secret<script>": 1}`: "unknown field",
			`{"account_id": "00000000-0000-4000-8000-000000000001", "amount": 5, "currency": "USD", "AMOUNT": 1}`:         "unknown field",
			`{"account_id": "00000000-0000-4000-8000-000000000001", "amount": 5, "currency": "<b>EUR</b>"}`:               "currency must be USD",
			`{"account_id": "00000000-0000-4000-8000-000000000001", "amount": 5`:                                          "the body is not valid JSON",
			`{"account_id": "00000000-0000-4000-8000-000000000001", "amount": 5, "currency": "USD"} "<trailing>"`:         "the body holds more than one JSON value",
			`"<just a string>"`: "the body must be one JSON object",
			`{"account_id": "00000000-0000-4000-8000-000000000001", "currency": "USD"}`:                                        "amount is required",
			`{"account_id": "00000000-0000-4000-8000-000000000001", "amount": null, "currency": "USD"}`:                        "amount must not be null",
			`{"account_id": "00000000-0000-4000-8000-000000000001", "amount": 5, "amount": 6, "currency": "USD"}`:              "amount appears more than once",
			"{\"account_id\": \"00000000-0000-4000-8000-000000000001\", \"amount\": 5, \"currency\": \"US\xff\"}":              "the body is not valid UTF-8",
			`{"account_id": "00000000-0000-4000-8000-000000000001", "amount": {"<nested>": 1}, "currency": "USD"}`:             "amount must be an integer",
			`{"account_id": [1, "<x>"], "amount": 5, "currency": "USD"}`:                                                       "account_id must be a UUID",
			`{"account_id": 1, "amount": 5, "currency": "USD"}`:                                                                "account_id must be a UUID",
			`{"account_id": "<not-a-uuid>", "amount": 5, "currency": "USD"}`:                                                   "account_id must be a UUID",
			`{"account_id": "00000000-0000-4000-8000-000000000001", "amount": 5, "currency": "USD", "note": "` + "\x00" + `"}`: "the body is not valid JSON",
		} {
			res := e.send(request{method: "POST", path: "/payments", auth: a.ApiKey, key: "msg-" + want, body: body, invalid: true})
			wantProblem(t, res, http.StatusBadRequest, payments.ProblemInvalidRequest)
			var p struct{ Detail string }
			decodeInto(t, res, &p)
			if p.Detail != want {
				t.Errorf("%s: detail %q, want %q", body, p.Detail, want)
			}
			for _, leak := range []string{"<", "Go struct", "paymentRequest", "PaymentRequest", "int64", "json:"} {
				if strings.Contains(string(res.body), leak) {
					t.Errorf("%s: the answer %s holds %q", body, res.body, leak)
				}
			}
		}
	})
	if got := e.balance(a.Id); got != 1000 {
		t.Fatalf("balance %d, want 1000", got)
	}
}

func TestPayments(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)

	t.Run("charged once, replayed after", func(t *testing.T) {
		a := e.signUp("ada", 10_000)
		first := e.pay(a.ApiKey, "pay-1", payment(a.Id, 2500))
		if first.status != http.StatusCreated || first.replayed() {
			t.Fatalf("first: %d replayed=%v %s", first.status, first.replayed(), first.body)
		}
		var p api.Payment
		decodeInto(t, first, &p)
		if p.Id.Version() != 4 || p.AccountId != a.Id || p.Amount != 2500 || p.Balance != 7500 {
			t.Fatalf("payment %+v", p)
		}
		for _, key := range []string{"pay-1", `"pay-1"`} { // the bare and the quoted form
			again := e.pay(a.ApiKey, key, payment(a.Id, 2500))
			if again.status != http.StatusCreated || !again.replayed() || !bytes.Equal(again.body, first.body) {
				t.Fatalf("replay with %s: %d replayed=%v %s, want the first body %s", key, again.status, again.replayed(), again.body, first.body)
			}
		}
		if got, n := e.balance(a.Id), e.payments(a.Id); got != 7500 || n != 1 {
			t.Fatalf("balance %d with %d payments, want 7500 and 1", got, n)
		}
	})

	t.Run("insufficient funds is 402, stored and replayed", func(t *testing.T) {
		a := e.signUp("bob", 100)
		first := e.pay(a.ApiKey, "pay-poor", payment(a.Id, 101))
		wantProblem(t, first, http.StatusPaymentRequired, payments.ProblemInsufficientFunds)
		// Money arrives, but the key's answer stays the stored refusal.
		if _, err := e.pool.Exec(t.Context(), "update accounts set balance = 1000 where id = $1", a.Id); err != nil {
			t.Fatal(err)
		}
		again := e.pay(a.ApiKey, "pay-poor", payment(a.Id, 101))
		wantProblem(t, again, http.StatusPaymentRequired, payments.ProblemInsufficientFunds)
		if !again.replayed() || !bytes.Equal(again.body, first.body) {
			t.Fatalf("replay: replayed=%v %s, want %s", again.replayed(), again.body, first.body)
		}
		if got, n := e.balance(a.Id), e.payments(a.Id); got != 1000 || n != 0 {
			t.Fatalf("balance %d with %d payments, want 1000 and none", got, n)
		}
	})

	t.Run("another account is 404, not stored", func(t *testing.T) {
		a := e.signUp("cy", 100)
		nobody := payment(uuid.New(), 1)
		first := e.pay(a.ApiKey, "pay-nobody", nobody)
		wantProblem(t, first, http.StatusNotFound, payments.ProblemNoSuchAccount)
		again := e.pay(a.ApiKey, "pay-nobody", nobody)
		wantProblem(t, again, http.StatusNotFound, payments.ProblemNoSuchAccount)
		if first.replayed() || again.replayed() || !bytes.Equal(again.body, first.body) {
			t.Fatalf("replayed %v then %v; %s then %s", first.replayed(), again.replayed(), first.body, again.body)
		}
		// The key stayed free: the caller's own payment runs under it.
		own := e.pay(a.ApiKey, "pay-nobody", payment(a.Id, 1))
		if own.status != http.StatusCreated || own.replayed() {
			t.Fatalf("the key after two 404s: %d replayed=%v %s", own.status, own.replayed(), own.body)
		}
	})

	t.Run("key", func(t *testing.T) {
		a := e.signUp("carol", 1000)
		t.Run("missing is 400", func(t *testing.T) {
			wantProblem(t, e.send(request{method: "POST", path: "/payments", auth: a.ApiKey, body: payment(a.Id, 1), invalid: true}), http.StatusBadRequest, idemhttp.ProblemMissingKey)
		})
		t.Run("invalid is 400", func(t *testing.T) {
			for _, key := range []string{strings.Repeat("k", 256), `"unterminated`, "a,b"} {
				wantProblem(t, e.send(request{method: "POST", path: "/payments", auth: a.ApiKey, key: key, body: payment(a.Id, 1), invalid: true}), http.StatusBadRequest, idemhttp.ProblemInvalidKey)
			}
		})
		t.Run("reused with another body is 422", func(t *testing.T) {
			if res := e.pay(a.ApiKey, "pay-reuse", payment(a.Id, 10)); res.status != http.StatusCreated {
				t.Fatalf("first: %d %s", res.status, res.body)
			}
			wantProblem(t, e.pay(a.ApiKey, "pay-reuse", payment(a.Id, 20)), http.StatusUnprocessableEntity, idemhttp.ProblemKeyMismatch)
		})
		if got := e.balance(a.Id); got != 990 {
			t.Fatalf("balance %d, want 990", got)
		}
	})

	t.Run("invalid body is 400", func(t *testing.T) {
		a := e.signUp("dan", 1000)
		for name, body := range map[string]string{
			"malformed":          `{"account_id": `,
			"zero amount":        fmt.Sprintf(`{"account_id": %d, "amount": 0, "currency": "USD"}`, a.Id),
			"negative amount":    fmt.Sprintf(`{"account_id": %d, "amount": -5, "currency": "USD"}`, a.Id),
			"fractional amount":  fmt.Sprintf(`{"account_id": %d, "amount": 1.5, "currency": "USD"}`, a.Id),
			"string amount":      fmt.Sprintf(`{"account_id": %d, "amount": "5", "currency": "USD"}`, a.Id),
			"other currency":     fmt.Sprintf(`{"account_id": %d, "amount": 5, "currency": "EUR"}`, a.Id),
			"missing currency":   fmt.Sprintf(`{"account_id": %d, "amount": 5}`, a.Id),
			"missing account_id": `{"amount": 5, "currency": "USD"}`,
			"unknown field":      fmt.Sprintf(`{"account_id": %d, "amount": 5, "currency": "USD", "note": "x"}`, a.Id),
		} {
			t.Run(name, func(t *testing.T) {
				wantProblem(t, e.send(request{method: "POST", path: "/payments", auth: a.ApiKey, key: "bad-" + name, body: body, invalid: true}), http.StatusBadRequest, payments.ProblemInvalidRequest)
			})
		}
		if got := e.balance(a.Id); got != 1000 {
			t.Fatalf("balance %d, want 1000", got)
		}
	})

	t.Run("body over 1 MiB is 413", func(t *testing.T) {
		a := e.signUp("eve", 1000)
		big := `{"account_id": "00000000-0000-4000-8000-000000000001", "amount": 1, "currency": "USD", "pad": "` + strings.Repeat("x", payments.MaxBodyBytes) + `"}`
		wantProblem(t, e.send(request{method: "POST", path: "/payments", auth: a.ApiKey, key: "pay-big", body: big, invalid: true}), http.StatusRequestEntityTooLarge, idemhttp.ProblemBodyTooLarge)
	})
}

// TestValidationFailureNotStored checks idemhttp.DefaultStoreStatus in the
// example: a 400 leaves the key free, so the corrected body sent with the
// same key runs, and charges once; its retries replay it.
func TestValidationFailureNotStored(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)
	a := e.signUp("fay", 1000)
	const key = "fix-and-retry"

	wantProblem(t, e.send(request{method: "POST", path: "/payments", auth: a.ApiKey, key: key,
		body: fmt.Sprintf(`{"account_id": %d, "amount": "300", "currency": "USD"}`, a.Id), invalid: true}),
		http.StatusBadRequest, payments.ProblemInvalidRequest)
	if n := e.keys(); n != 0 {
		t.Fatalf("%d keys stored by a 400", n)
	}
	fixed := e.pay(a.ApiKey, key, payment(a.Id, 300))
	if fixed.status != http.StatusCreated || fixed.replayed() {
		t.Fatalf("corrected body: %d replayed=%v %s", fixed.status, fixed.replayed(), fixed.body)
	}
	again := e.pay(a.ApiKey, key, payment(a.Id, 300))
	if again.status != http.StatusCreated || !again.replayed() || !bytes.Equal(again.body, fixed.body) {
		t.Fatalf("retry: %d replayed=%v", again.status, again.replayed())
	}
	if got, n := e.balance(a.Id), e.payments(a.Id); got != 700 || n != 1 {
		t.Fatalf("balance %d with %d payments, want 700 and 1", got, n)
	}
}

// TestPaymentInFlight holds the account's row lock so that a first payment
// stops inside its transaction, key claimed; a second request with the key
// meets it there.
func TestPaymentInFlight(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)
	a := e.signUp("erin", 1000)

	lock, err := e.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(context.WithoutCancel(t.Context())) }()
	if _, err := lock.Exec(t.Context(), "select 1 from accounts where id = $1 for update", a.Id); err != nil {
		t.Fatal(err)
	}

	firstDone := make(chan response, 1)
	go func() { firstDone <- e.pay(a.ApiKey, "pay-slow", payment(a.Id, 300)) }()
	waitForLockWait(t, e.pool)

	inProgress := e.pay(a.ApiKey, "pay-slow", payment(a.Id, 300))
	wantProblem(t, inProgress, http.StatusConflict, idemhttp.ProblemInProgress)
	if inProgress.header.Get("Retry-After") == "" {
		t.Error("409 without Retry-After")
	}

	if err := lock.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	first := <-firstDone
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	again := e.pay(a.ApiKey, "pay-slow", payment(a.Id, 300))
	if again.status != http.StatusCreated || !again.replayed() || !bytes.Equal(again.body, first.body) {
		t.Fatalf("after the first finished: %d replayed=%v %s", again.status, again.replayed(), again.body)
	}
	if got := e.balance(a.Id); got != 700 {
		t.Fatalf("balance %d, want 700", got)
	}
}

// waitForLockWait returns once a session of the test's database waits for a
// row lock. It polls; the deadline only bounds a broken run.
func waitForLockWait(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	for range 3000 {
		var waiting bool
		err := pool.QueryRow(t.Context(), `select exists (
			select 1 from pg_stat_activity
			where datname = current_database() and wait_event_type = 'Lock')`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the first payment never reached the account's row lock")
}

// TestConcurrentPaymentsNeverOverdraw sends 50 payments of 100 at once
// against a balance of 1000: exactly 10 succeed, and the balance ends at 0.
func TestConcurrentPaymentsNeverOverdraw(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)
	a := e.signUp("frank", 1000)

	const n = 50
	statuses := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			statuses[i] = e.pay(a.ApiKey, fmt.Sprintf("overdraw-%d", i), payment(a.Id, 100)).status
		})
	}
	wg.Wait()

	count := map[int]int{}
	for _, s := range statuses {
		count[s]++
	}
	if count[http.StatusCreated] != 10 || count[http.StatusPaymentRequired] != 40 {
		t.Fatalf("statuses %v, want 10×201 and 40×402", count)
	}
	if got, p := e.balance(a.Id), e.payments(a.Id); got != 0 || p != 10 {
		t.Fatalf("balance %d with %d payments, want 0 and 10", got, p)
	}
}

// TestSameKeyConcurrently sends one payment from 20 goroutines at once with
// the same key, each retrying while the key is in progress (409): the
// account is charged once and every caller receives the same answer.
func TestSameKeyConcurrently(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)
	a := e.signUp("gina", 1000)

	const n = 20
	results := make([]response, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			for range 1000 {
				results[i] = e.pay(a.ApiKey, "same-key", payment(a.Id, 250))
				if results[i].status != http.StatusConflict {
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	wg.Wait()

	replays := 0
	for i, res := range results {
		if res.status != http.StatusCreated || !bytes.Equal(res.body, results[0].body) {
			t.Fatalf("caller %d: %d %s, want 201 %s", i, res.status, res.body, results[0].body)
		}
		if res.replayed() {
			replays++
		}
	}
	if replays != n-1 {
		t.Errorf("%d replays, want %d", replays, n-1)
	}
	if got, p := e.balance(a.Id), e.payments(a.Id); got != 750 || p != 1 {
		t.Fatalf("balance %d with %d payments, want 750 and 1", got, p)
	}
}

// TestUnprotectedChargesEveryRetry documents what the key prevents: without
// idemhttp, a retried payment is a second charge.
func TestUnprotectedChargesEveryRetry(t *testing.T) {
	t.Parallel()
	e := setup(t, unprotected)
	a := e.signUp("hal", 1000)
	for range 2 {
		if res := e.pay(a.ApiKey, "retried", payment(a.Id, 100)); res.status != http.StatusCreated {
			t.Fatalf("%d %s", res.status, res.body)
		}
	}
	if got, p := e.balance(a.Id), e.payments(a.Id); got != 800 || p != 2 {
		t.Fatalf("balance %d with %d payments, want 800 and 2", got, p)
	}
	wantProblem(t, e.send(request{method: "POST", path: "/payments", body: payment(a.Id, 1), key: "k"}), http.StatusUnauthorized, idemhttp.ProblemUnauthorized)
}

// TestBalanceNeverNegativeInSchema checks the last line of defence: even a
// write that bypasses the charge statement cannot overdraw an account.
func TestBalanceNeverNegativeInSchema(t *testing.T) {
	t.Parallel()
	e := setup(t, protected)
	a := e.signUp("ivy", 10)
	_, err := e.pool.Exec(t.Context(), "update accounts set balance = balance - 11 where id = $1", a.Id)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != pgerrcode.CheckViolation {
		t.Fatalf("overdrawing update: %v, want a check violation", err)
	}
}

// TestMigrateOldDatabase applies the schema to a database made by an
// earlier version, whose ids were sequential: Migrate refuses it with
// ErrOldSchema, twice, and changes nothing (the old rows stay, no table
// is added).
func TestMigrateOldDatabase(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	_, err := pool.Exec(t.Context(), `
		CREATE TABLE accounts (
		    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		    owner   text   NOT NULL CHECK (owner <> ''),
		    balance bigint NOT NULL,
		    CONSTRAINT accounts_balance_check CHECK (balance >= 0)
		);
		INSERT INTO accounts (owner, balance) VALUES ('old', 5)`)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := payments.Migrate(t.Context(), pool); !errors.Is(err, payments.ErrOldSchema) {
			t.Fatalf("Migrate on the old layout: %v, want ErrOldSchema", err)
		}
	}
	var owner string
	var payments_ bool
	err = pool.QueryRow(t.Context(), "select owner, to_regclass('payments') is not null from accounts").Scan(&owner, &payments_)
	if err != nil || owner != "old" || payments_ {
		t.Fatalf("after the refusal: owner %q, payments table %v (%v); want the old row and nothing added", owner, payments_, err)
	}
}
