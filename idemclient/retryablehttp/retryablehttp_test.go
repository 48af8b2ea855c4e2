package retryablehttp_test

import (
	"context"
	"net/http"
	"os"
	"testing"
	"time"

	rhttp "github.com/hashicorp/go-retryablehttp"

	"github.com/idemhq/idem/idemclient"
	"github.com/idemhq/idem/idemclient/internal/servertest"
	idemretryablehttp "github.com/idemhq/idem/idemclient/retryablehttp"
	"github.com/idemhq/idem/testkit/testdb"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

var fast = &idemclient.Policy{MaxAttempts: 4, MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}

// newClient returns a go-retryablehttp client configured with p, sending
// through the test server's transport, and counting its attempts in its
// RequestLogHook, which Configure keeps.
func newClient(t *testing.T, hc *http.Client, p *idemclient.Policy) (*rhttp.Client, *int) {
	t.Helper()
	c := rhttp.NewClient()
	c.HTTPClient = hc
	c.Logger = nil
	attempts := new(int)
	c.RequestLogHook = func(_ rhttp.Logger, _ *http.Request, _ int) { *attempts++ }
	if err := idemretryablehttp.Configure(c, p); err != nil {
		t.Fatal(err)
	}
	return c, attempts
}

// send sends req through c and returns the status of the answer.
func send(t *testing.T, c *rhttp.Client, req *http.Request) int {
	t.Helper()
	r, err := rhttp.FromRequest(req)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// TestIdemServer: against a real idem server, a 503 of the handler is
// retried with the same key until the 201, the charge made once; a 422 for
// a reused key is returned at once.
func TestIdemServer(t *testing.T) {
	t.Parallel()
	t.Run("503 then 201", func(t *testing.T) {
		t.Parallel()
		s := servertest.NewIdem(t)
		s.Failures.Store(2)
		c, attempts := newClient(t, s.Client(), fast)
		status := send(t, c, servertest.Post(t, s.URL+"/charges", "", "500"))
		keys, bodies := s.Requests()
		if status != http.StatusCreated || *attempts != 3 || s.Charges() != 1 {
			t.Fatalf("status %d after %d attempts, %d charges: want 201 after 3, one charge", status, *attempts, s.Charges())
		}
		servertest.SameKey(t, keys, 3)
		if bodies[0] != "500" || bodies[2] != "500" {
			t.Fatalf("bodies %q", bodies)
		}
	})
	t.Run("422 not retried", func(t *testing.T) {
		t.Parallel()
		s := servertest.NewIdem(t)
		c, attempts := newClient(t, s.Client(), fast)
		send(t, c, servertest.Post(t, s.URL+"/charges", "k-1", "500"))
		status := send(t, c, servertest.Post(t, s.URL+"/charges", "k-1", "900"))
		if status != http.StatusUnprocessableEntity || *attempts != 2 {
			t.Fatalf("status %d after %d attempts in all: want 422, not retried", status, *attempts)
		}
	})
}

// TestScripted: what is retried and what is not, one key on every
// attempt, and the last answer returned when the attempts are spent.
func TestScripted(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name         string
		answers      []int
		retryAfter   string
		wantStatus   int
		wantAttempts int
	}{
		{name: "409 retried", answers: []int{409}, wantStatus: 201, wantAttempts: 2},
		{name: "429 retried", answers: []int{429}, wantStatus: 201, wantAttempts: 2},
		{name: "connection reset retried", answers: []int{0}, wantStatus: 201, wantAttempts: 2},
		{name: "501 not retried", answers: []int{501}, wantStatus: 501, wantAttempts: 1},
		{name: "422 not retried", answers: []int{422}, wantStatus: 422, wantAttempts: 1},
		{name: "503 every time: the last 503", answers: []int{503, 503, 503, 503}, wantStatus: 503, wantAttempts: 4},
		{name: "429 with a Retry-After past the deadline: at once", answers: []int{429}, retryAfter: "30", wantStatus: 429, wantAttempts: 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := servertest.NewScripted(t, tt.answers...)
			s.RetryAfter = tt.retryAfter
			s.Start(t)
			c, attempts := newClient(t, s.Client(), fast)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			status := send(t, c, servertest.Post(t, s.URL, "", `{"amount":500}`).WithContext(ctx))
			if status != tt.wantStatus || *attempts != tt.wantAttempts {
				t.Fatalf("status %d after %d attempts, want %d after %d", status, *attempts, tt.wantStatus, tt.wantAttempts)
			}
			keys, _ := s.Requests()
			servertest.SameKey(t, keys, tt.wantAttempts)
		})
	}
}

// TestContextKey: the context's key is sent, quoted, on every attempt.
func TestContextKey(t *testing.T) {
	t.Parallel()
	s := servertest.NewScripted(t, 503).Start(t)
	c, _ := newClient(t, s.Client(), fast)
	req := servertest.Post(t, s.URL, "", "500")
	send(t, c, req.WithContext(idemclient.ContextWithKey(req.Context(), "order-17")))
	keys, _ := s.Requests()
	servertest.SameKey(t, keys, 2)
	if keys[0] != `"order-17"` {
		t.Fatalf("key %q", keys[0])
	}
}
