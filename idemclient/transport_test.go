package idemclient_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem/idemclient"
	"github.com/idemhq/idem/idemclient/internal/servertest"
	"github.com/idemhq/idem/idemhttp"
)

// fast is the policy of these tests: waits of a millisecond or two, so
// that what a test asserts is counts, never timing.
var fast = &idemclient.Policy{MaxAttempts: 4, MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}

// client returns an http.Client whose Transport retries as p says over the
// test server's own transport.
func client(t *testing.T, next http.RoundTripper, p *idemclient.Policy) *http.Client {
	t.Helper()
	c, err := idemclient.NewClient(next, p)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestIdemServer sends requests through the Transport to a real idem
// server (idemhttp on PostgreSQL) and checks, for every answer idem gives,
// whether it was retried, that every attempt carried one key and the same
// body, how many attempts were made, what the caller received, and how
// many charges committed.
func TestIdemServer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// setup prepares the server and returns the request to send
		// through the Transport.
		setup        func(t *testing.T, s *servertest.Idem) *http.Request
		wantStatus   int
		wantAttempts int
		wantReplayed bool
		wantCharges  int
		wantProblem  string // the problem type of the final answer, if any
	}{{
		name: "201 created: not retried",
		setup: func(t *testing.T, s *servertest.Idem) *http.Request {
			return servertest.Post(t, s.URL+"/charges", "", "500")
		},
		wantStatus:   http.StatusCreated,
		wantAttempts: 1,
		wantCharges:  1,
	}, {
		name: "201 replayed: not retried, the replay reported",
		setup: func(t *testing.T, s *servertest.Idem) *http.Request {
			do(t, s.Client(), servertest.Post(t, s.URL+"/charges", `"k-replayed"`, "500"), http.StatusCreated)
			return servertest.Post(t, s.URL+"/charges", `"k-replayed"`, "500")
		},
		wantStatus:   http.StatusCreated,
		wantAttempts: 1,
		wantReplayed: true,
		wantCharges:  1,
	}, {
		name: "503 from the handler twice (rolled back, not stored): retried until the 201",
		setup: func(t *testing.T, s *servertest.Idem) *http.Request {
			s.Failures.Store(2)
			return servertest.Post(t, s.URL+"/charges", "", "500")
		},
		wantStatus:   http.StatusCreated,
		wantAttempts: 3,
		wantCharges:  1,
	}, {
		name: "503 on every attempt: retried until the attempts are spent, the last 503 returned",
		setup: func(t *testing.T, s *servertest.Idem) *http.Request {
			s.Failures.Store(100)
			return servertest.Post(t, s.URL+"/charges", "", "500")
		},
		wantStatus:   http.StatusServiceUnavailable,
		wantAttempts: 4,
	}, {
		name: "422 key reused for another request: not retried, the problem document returned",
		setup: func(t *testing.T, s *servertest.Idem) *http.Request {
			do(t, s.Client(), servertest.Post(t, s.URL+"/charges", `"k-reused"`, "500"), http.StatusCreated)
			return servertest.Post(t, s.URL+"/charges", `"k-reused"`, "900")
		},
		wantStatus:   http.StatusUnprocessableEntity,
		wantAttempts: 1,
		wantCharges:  1,
		wantProblem:  idemhttp.ProblemKeyMismatch,
	}, {
		name: "400 invalid key: not retried",
		setup: func(t *testing.T, s *servertest.Idem) *http.Request {
			return servertest.Post(t, s.URL+"/charges", strings.Repeat("k", 256), "500")
		},
		wantStatus:   http.StatusBadRequest,
		wantAttempts: 1,
		wantProblem:  idemhttp.ProblemInvalidKey,
	}, {
		name: "401 no principal: not retried",
		setup: func(t *testing.T, s *servertest.Idem) *http.Request {
			req := servertest.Post(t, s.URL+"/charges", "", "500")
			req.Header.Del("Authorization")
			return req
		},
		wantStatus:   http.StatusUnauthorized,
		wantAttempts: 1,
		wantProblem:  idemhttp.ProblemUnauthorized,
	}, {
		name: "404 no such route: not retried",
		setup: func(t *testing.T, s *servertest.Idem) *http.Request {
			return servertest.Post(t, s.URL+"/nowhere", "", "500")
		},
		wantStatus:   http.StatusNotFound,
		wantAttempts: 1,
	}, {
		name: "500 from the handler every time (rolled back, not stored): retried until the attempts are spent",
		setup: func(t *testing.T, s *servertest.Idem) *http.Request {
			s.Status.Store(http.StatusInternalServerError)
			return servertest.Post(t, s.URL+"/charges", "", "500")
		},
		wantStatus:   http.StatusInternalServerError,
		wantAttempts: 4,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := servertest.NewIdem(t)
			req := tt.setup(t, s)
			before, _ := s.Requests()
			resp, err := client(t, s.Client().Transport, fast).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			res := checkResult(t, resp, tt.wantStatus, tt.wantAttempts, tt.wantReplayed)
			keys, bodies := s.Requests()
			keys, bodies = keys[len(before):], bodies[len(before):]
			servertest.SameKey(t, keys, tt.wantAttempts)
			if keys[0] != res.Key {
				t.Errorf("Result.Key %q, the server received %q", res.Key, keys[0])
			}
			for _, b := range bodies {
				if b != bodies[0] {
					t.Errorf("bodies %q: want the same body on every attempt", bodies)
				}
			}
			if n := s.Charges(); n != tt.wantCharges {
				t.Errorf("%d charges committed, want %d", n, tt.wantCharges)
			}
			p := idemclient.ProblemOf(resp)
			switch {
			case tt.wantProblem == "" && p != nil:
				t.Errorf("problem %+v, want none", p)
			case tt.wantProblem != "" && (p == nil || p.Type != tt.wantProblem || p.Status != tt.wantStatus):
				t.Errorf("problem %+v, want type %s", p, tt.wantProblem)
			}
			if _, err := io.ReadAll(resp.Body); err != nil { // ProblemOf put the body back
				t.Error(err)
			}
		})
	}
}

// TestInProgress: a request whose key is held by a request still running
// is answered 409 by idem; the Transport waits the Retry-After idem sends
// (1s) and retries with the same key, and receives the first request's
// answer, replayed. The handler ran once.
func TestInProgress(t *testing.T) {
	t.Parallel()
	s := servertest.NewIdem(t)
	s.Entered, s.Release = make(chan struct{}), make(chan struct{})
	var first sync.WaitGroup
	first.Go(func() { do(t, s.Client(), servertest.Post(t, s.URL+"/charges", `"k-busy"`, "500"), http.StatusCreated) })
	<-s.Entered
	var once sync.Once
	watch := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := s.Client().Transport.RoundTrip(req)
		if err == nil && resp.StatusCode == http.StatusConflict {
			once.Do(func() { close(s.Release) }) // the first request may finish now
		}
		return resp, err
	})
	resp, err := client(t, watch, fast).Do(servertest.Post(t, s.URL+"/charges", `"k-busy"`, "500"))
	once.Do(func() { close(s.Release) }) // whatever the answer: a failed test must not hang
	first.Wait()
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	res, _ := idemclient.ResultOf(resp)
	if resp.StatusCode != http.StatusCreated || !res.Replayed || res.Attempts < 2 {
		t.Fatalf("status %d, %+v: want the first request's 201 replayed after a 409", resp.StatusCode, res)
	}
	keys, _ := s.Requests()
	servertest.SameKey(t, keys, 1+res.Attempts)
	if n := s.Charges(); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}

// TestScripted covers the answers idem never gives itself, from a server
// that answers as each case says: retried or not, one key on every
// attempt, the attempts counted, and what the caller receives.
func TestScripted(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		answers      []int // then 201
		problem      string
		wantStatus   int
		wantAttempts int
	}{
		{name: "403: not retried", answers: []int{403}, wantStatus: 403, wantAttempts: 1},
		{name: "400: not retried", answers: []int{400}, wantStatus: 400, wantAttempts: 1},
		{name: "422: not retried", answers: []int{422}, wantStatus: 422, wantAttempts: 1},
		{name: "418, another 4xx: not retried", answers: []int{418}, wantStatus: 418, wantAttempts: 1},
		{name: "501: not retried", answers: []int{501}, wantStatus: 501, wantAttempts: 1},
		{name: "500: retried", answers: []int{500}, wantStatus: 201, wantAttempts: 2},
		{name: "409: retried", answers: []int{409, 409}, wantStatus: 201, wantAttempts: 3},
		{name: "425: retried", answers: []int{425}, wantStatus: 201, wantAttempts: 2},
		{name: "429: retried", answers: []int{429}, wantStatus: 201, wantAttempts: 2},
		{name: "502: retried", answers: []int{502}, wantStatus: 201, wantAttempts: 2},
		{name: "504: retried", answers: []int{504}, wantStatus: 201, wantAttempts: 2},
		{name: "503 outcome unknown: retried", answers: []int{503}, problem: "/problems/outcome-unknown", wantStatus: 201, wantAttempts: 2},
		{name: "connection reset: retried", answers: []int{0, 0}, wantStatus: 201, wantAttempts: 3},
		{name: "502 on every attempt: the last 502 returned", answers: []int{502, 502, 502, 502}, wantStatus: 502, wantAttempts: 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := servertest.NewScripted(t, tt.answers...)
			s.Problem = tt.problem
			s.Start(t)
			resp, err := client(t, s.Client().Transport, fast).Do(servertest.Post(t, s.URL, "", `{"amount":500}`))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			checkResult(t, resp, tt.wantStatus, tt.wantAttempts, tt.wantStatus == 201)
			keys, bodies := s.Requests()
			servertest.SameKey(t, keys, tt.wantAttempts)
			for _, b := range bodies {
				if b != `{"amount":500}` {
					t.Fatalf("bodies %q: want the same body on every attempt", bodies)
				}
			}
		})
	}
}

// TestNoAnswer: when no attempt is answered (a connection reset each time,
// or a refused one), the caller gets a *RetryError that says which key was
// sent how often.
func TestNoAnswer(t *testing.T) {
	t.Parallel()
	t.Run("reset every time", func(t *testing.T) {
		t.Parallel()
		s := servertest.NewScripted(t, 0, 0, 0, 0).Start(t)
		resp, err := client(t, s.Client().Transport, fast).Do(servertest.Post(t, s.URL, "", "500"))
		if err == nil {
			_ = resp.Body.Close()
		}
		var re *idemclient.RetryError
		if !errors.As(err, &re) || re.Attempts != 4 {
			t.Fatalf("error %v: want a *RetryError after 4 attempts", err)
		}
		keys, _ := s.Requests()
		servertest.SameKey(t, keys, 4)
		if re.Key != keys[0] {
			t.Fatalf("RetryError.Key %q, sent %q", re.Key, keys[0])
		}
	})
	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		s := servertest.NewScripted(t).Start(t)
		s.Close() // nothing listens at its address now
		resp, err := client(t, nil, fast).Do(servertest.Post(t, s.URL, "", "500"))
		if err == nil {
			_ = resp.Body.Close()
		}
		var re *idemclient.RetryError
		if !errors.As(err, &re) || re.Attempts != 4 {
			t.Fatalf("error %v: want a *RetryError after 4 attempts", err)
		}
	})
}

// TestRetryAfter: the wait before a retry is the answer's Retry-After when
// that is longer than the backoff, and an answer whose Retry-After would
// pass the context's deadline (or Policy.MaxRetryAfter) is returned at
// once, without a second attempt.
func TestRetryAfter(t *testing.T) {
	t.Parallel()
	t.Run("honoured", func(t *testing.T) {
		t.Parallel()
		s := servertest.NewScripted(t, 429)
		s.RetryAfter = "1"
		s.Start(t)
		resp, err := client(t, s.Client().Transport, fast).Do(servertest.Post(t, s.URL, "", "500"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		checkResult(t, resp, 201, 2, true)
		// A lower bound: a wait never ends early, however slow the machine.
		if at := s.Arrivals(); at[1].Sub(at[0]) < time.Second {
			t.Fatalf("the retry came %v after the 429, want at least its Retry-After (1s)", at[1].Sub(at[0]))
		}
	})
	for _, tt := range []struct {
		name   string
		status int
		after  string
		policy *idemclient.Policy
	}{
		{"409 past the deadline", 409, "30", fast},
		{"429 past the deadline", 429, "30", fast},
		{"503 past the deadline, as an HTTP-date", 503, time.Now().Add(time.Hour).UTC().Format(http.TimeFormat), fast},
		{"429 over MaxRetryAfter", 429, "3", &idemclient.Policy{MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond, MaxRetryAfter: 2 * time.Second}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := servertest.NewScripted(t, tt.status, tt.status, tt.status, tt.status)
			s.RetryAfter = tt.after
			s.Start(t)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			resp, err := client(t, s.Client().Transport, tt.policy).Do(servertest.Post(t, s.URL, "", "500").WithContext(ctx))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			checkResult(t, resp, tt.status, 1, false)
			if ctx.Err() != nil {
				t.Fatal("the deadline passed: the Transport waited instead of answering at once")
			}
		})
	}
}

// TestBodyNotReplayable: a request with a body that cannot be read again
// is refused before anything is sent.
func TestBodyNotReplayable(t *testing.T) {
	t.Parallel()
	s := servertest.NewScripted(t).Start(t)
	req := servertest.Post(t, s.URL, "", "")
	req.Body = io.NopCloser(strings.NewReader(`{"amount":500}`)) // no GetBody
	req.GetBody = nil
	resp, err := client(t, s.Client().Transport, fast).Do(req)
	if err == nil {
		_ = resp.Body.Close()
	}
	if !errors.Is(err, idemclient.ErrBodyNotReplayable) {
		t.Fatalf("error %v, want ErrBodyNotReplayable", err)
	}
	if keys, _ := s.Requests(); len(keys) != 0 {
		t.Fatalf("the server received %d requests, want none", len(keys))
	}
}

// TestKeySources: the key is the request's own header, else the context's,
// else a new UUID in the draft's quoted form; methods other than POST and
// PATCH get none of their own.
func TestKeySources(t *testing.T) {
	t.Parallel()
	s := servertest.NewScripted(t, 503, 503, 503, 503, 503, 503).Start(t)
	c := client(t, s.Client().Transport, &idemclient.Policy{MaxAttempts: 1, UUIDVersion: 7})
	send := func(req *http.Request) string {
		t.Helper()
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		res, _ := idemclient.ResultOf(resp)
		return res.Key
	}
	if got := send(servertest.Post(t, s.URL, "bare-key", "")); got != "bare-key" {
		t.Errorf("the request's own key: sent %q", got)
	}
	if got := send(servertest.Post(t, s.URL, "", "").WithContext(idemclient.ContextWithKey(t.Context(), "order-17"))); got != `"order-17"` {
		t.Errorf("the context's key: sent %q", got)
	}
	if got := send(servertest.Post(t, s.URL, "", "")); len(got) != 38 || got[0] != '"' || got[15] != '7' {
		t.Errorf("a new key: sent %q, want a quoted UUIDv7", got)
	}
	get, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, s.URL, nil)
	if got := send(get); got != "" {
		t.Errorf("a GET: sent key %q, want none", got)
	}
	keys, _ := s.Requests()
	if len(keys) != 4 {
		t.Fatalf("%d requests, want 4", len(keys))
	}
}

// do sends req through c (no retries) and fails t unless it is answered
// want.
func do(t *testing.T, c *http.Client, req *http.Request, want int) {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Error(err)
		return
	}
	resp.Body.Close()
	if resp.StatusCode != want {
		t.Errorf("status %d, want %d", resp.StatusCode, want)
	}
}

// checkResult fails t unless resp has status and its Result reports
// attempts and replayed; it returns the Result.
func checkResult(t *testing.T, resp *http.Response, status, attempts int, replayed bool) idemclient.Result {
	t.Helper()
	res, ok := idemclient.ResultOf(resp)
	if !ok {
		t.Fatal("ResultOf: no result")
	}
	if resp.StatusCode != status || res.Attempts != attempts || res.Replayed != replayed {
		t.Fatalf("status %d, %+v: want status %d after %d attempts, replayed %v", resp.StatusCode, res, status, attempts, replayed)
	}
	return res
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }
