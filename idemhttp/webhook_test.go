package idemhttp_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
	"github.com/idemhq/idem/testkit/testdb"
)

const webhookSecret = "It's a Secret to Everybody"

// A push delivery as GitHub sends it: the delivery's GUID, the event, the
// hook, and the HMAC-SHA256 of the body under the hook's secret. A
// redelivery carries the same GUID and body.
func gitHubDelivery(body []byte) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/webhooks/github", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("User-Agent", "GitHub-Hookshot/044aadd")
	r.Header.Set("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
	r.Header.Set("X-GitHub-Event", "push")
	r.Header.Set("X-GitHub-Hook-ID", "292430182")
	r.Header.Set("X-GitHub-Hook-Installation-Target-ID", "79929171")
	r.Header.Set("X-GitHub-Hook-Installation-Target-Type", "repository")
	r.Header.Set("X-Hub-Signature-256", "sha256="+sign(body))
	return r
}

const gitHubPush = `{"ref":"refs/heads/main","before":"6113728f27ae82c7b1a177c8d03f9e96e0adf246",` +
	`"after":"0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c","repository":{"id":35129377,` +
	`"full_name":"octo-org/octo-repo"},"pusher":{"name":"octocat"},"sender":{"login":"octocat","id":583231}}`

// A Stripe event: the key is the event's id in the body. Stripe signs each
// attempt with its own timestamp, so a retry's Stripe-Signature differs
// while the body does not.
func stripeEvent(body []byte, attempt int) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/webhooks/stripe", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json; charset=utf-8")
	r.Header.Set("User-Agent", "Stripe/1.0 (+https://stripe.com/docs/webhooks)")
	ts := strconv.Itoa(1700000000 + attempt*60)
	r.Header.Set("Stripe-Signature", "t="+ts+",v1="+sign([]byte(ts+"."+string(body))))
	return r
}

const stripePaymentSucceeded = `{"id":"evt_3MtwBwLkdIwHu7ix28a3tqPa","object":"event","api_version":"2022-11-15",` +
	`"created":1680064028,"type":"payment_intent.succeeded","livemode":false,"pending_webhooks":1,` +
	`"data":{"object":{"id":"pi_3MtwBwLkdIwHu7ix28a3tqPa","object":"payment_intent","amount":2000,"currency":"usd"}}}`

func sign(b []byte) string {
	m := hmac.New(sha256.New, []byte(webhookSecret))
	m.Write(b)
	return hex.EncodeToString(m.Sum(nil))
}

// verifyGitHub lets only deliveries signed with the hook's secret through,
// scoped by their sender.
func verifyGitHub(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		want := "sha256=" + sign(body)
		if err != nil || !hmac.Equal([]byte(r.Header.Get("X-Hub-Signature-256")), []byte(want)) {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r.WithContext(idem.ContextWithScope(r.Context(), "webhook:github")))
	})
}

// stripeEventID is a Config.Key function: the id of the event in the body.
func stripeEventID(_ *http.Request, body []byte) (string, error) {
	var event struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(body, &event); err != nil {
		return "", errors.New("the body is not a Stripe event")
	}
	return event.ID, nil
}

// A provider that delivers the same event twice (its retry after a timeout,
// or a redelivery by hand) has it processed once: the second delivery
// receives the stored answer, marked replayed, and the effect happened
// once.
func TestWebhookDeliveredTwice(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	if _, err := pool.Exec(context.Background(), `create table deliveries (
		provider text not null, event text not null, received int not null)`); err != nil {
		t.Fatal(err)
	}
	record := func(provider string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			var n int
			err := idemhttp.Tx(r.Context()).QueryRow(r.Context(), `insert into deliveries
				select $1, $2, count(*) + 1 from deliveries returning received`,
				provider, r.Header.Get("X-GitHub-Event")).Scan(&n)
			if err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"received":%d}`, n)
		}
	}
	github, err := idemhttp.NewMiddleware(pool, &idemhttp.Config{
		Required: true,
		Key:      idemhttp.KeyHeader("X-GitHub-Delivery"),
		Scope:    idemhttp.ContextScope,
	})
	if err != nil {
		t.Fatal(err)
	}
	stripe, err := idemhttp.NewMiddleware(pool, &idemhttp.Config{
		Required: true,
		Key:      stripeEventID,
		Scope:    func(*http.Request) (string, error) { return "webhook:stripe", nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /webhooks/github", verifyGitHub(github.Handler(record("github"))))
	mux.Handle("POST /webhooks/stripe", stripe.Handler(record("stripe")))

	for _, c := range []struct {
		provider string
		deliver  func(attempt int) *http.Request
	}{
		{"github", func(int) *http.Request { return gitHubDelivery([]byte(gitHubPush)) }},
		{"stripe", func(attempt int) *http.Request { return stripeEvent([]byte(stripePaymentSucceeded), attempt) }},
	} {
		t.Run(c.provider, func(t *testing.T) {
			var bodies [2]string
			for attempt := range 2 {
				w := httptest.NewRecorder()
				mux.ServeHTTP(w, c.deliver(attempt))
				wantStatus(t, w, http.StatusOK)
				wantReplayed(t, w, attempt == 1)
				bodies[attempt] = w.Body.String()
			}
			if bodies[0] != bodies[1] {
				t.Fatalf("the redelivery got %q, want the stored %q", bodies[1], bodies[0])
			}
			var n int
			if err := pool.QueryRow(context.Background(), "select count(*) from deliveries where provider = $1", c.provider).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 1 {
				t.Fatalf("%d deliveries recorded, want 1", n)
			}
		})
	}

	t.Run("no delivery id", func(t *testing.T) {
		r := gitHubDelivery([]byte(gitHubPush))
		r.Header.Del("X-GitHub-Delivery")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		wantProblem(t, w, http.StatusBadRequest, idemhttp.ProblemMissingKey)
	})
	t.Run("not an event", func(t *testing.T) {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, stripeEvent([]byte(`["evt_1"]`), 0))
		wantProblem(t, w, http.StatusBadRequest, idemhttp.ProblemInvalidKey)
	})
}
