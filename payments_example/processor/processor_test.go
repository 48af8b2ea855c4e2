package processor_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"github.com/idemhq/idem/payments_example/processor"
)

func newFake(t *testing.T, cfg processor.FakeConfig) (*processor.Fake, *processor.Client) {
	t.Helper()
	fake, err := processor.NewFake(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	client, err := processor.NewClient(srv.URL+"/", srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	return fake, client
}

var charge = processor.Charge{
	PaymentID: uuid.MustParse("0b7c3a52-3f4e-4c59-9a1d-6b2f0e8d7c11"),
	AccountID: uuid.MustParse("5e2a9f60-81d4-4b7a-a3c2-1f9e6d4b8a22"),
	Amount:    300,
	Currency:  "USD",
}

// TestFakeHonoursKeys: the same key and charge get the same id, however
// often and however concurrently they are sent; another key is another
// charge; the same key with another charge is rejected and charges nothing.
func TestFakeHonoursKeys(t *testing.T) {
	fake, client := newFake(t, processor.FakeConfig{})
	ctx := context.Background()
	ids := make([]string, 16)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			id, err := client.Charge(ctx, "key-1", charge)
			if err != nil {
				t.Error(err)
			}
			ids[i] = id
		})
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] || id == "" {
			t.Fatalf("ids %v, want one id", ids)
		}
	}
	other, err := client.Charge(ctx, "key-2", charge)
	if err != nil || other == ids[0] {
		t.Fatalf("another key: %q %v, want another charge", other, err)
	}
	changed := charge
	changed.Amount++
	if _, err := client.Charge(ctx, "key-1", changed); !errors.Is(err, processor.ErrRejected) {
		t.Fatalf("key reused for another charge: %v, want ErrRejected", err)
	}
	s := fake.Stats()
	if s.Charges != 2 || s.Replays != 15 || s.Reused != 1 || len(fake.Charges()) != 2 || fake.Charges()[0].Calls != 16 {
		t.Fatalf("stats %+v, charges %+v", s, fake.Charges())
	}
}

// TestFakeFailsAndLoses: with every call failing nothing is charged; with
// every answer lost the charge is made and the caller gets an error; the
// caller that retries with the same key gets the one charge.
func TestFakeFailsAndLoses(t *testing.T) {
	ctx := context.Background()
	t.Run("fails before charging", func(t *testing.T) {
		fake, client := newFake(t, processor.FakeConfig{FailRate: 0.999999})
		_, err := client.Charge(ctx, "k", charge)
		if err == nil || errors.Is(err, processor.ErrRejected) {
			t.Fatalf("err %v, want a retryable error", err)
		}
		if s := fake.Stats(); s.Charges != 0 || s.Failed != 1 {
			t.Fatalf("stats %+v", s)
		}
	})
	t.Run("loses answers and keeps the charge", func(t *testing.T) {
		fake, client := newFake(t, processor.FakeConfig{LoseRate: 0.5, Seed: 7})
		var id string
		var lost int
		for id == "" {
			got, err := client.Charge(ctx, "k", charge)
			switch {
			case errors.Is(err, processor.ErrRejected):
				t.Fatal(err)
			case err != nil:
				lost++
			default:
				id = got
			}
			if lost > 40 {
				t.Fatal("every answer lost")
			}
		}
		s := fake.Stats()
		if s.Charges != 1 || s.Lost != lost || fake.Charges()[0].ID != id {
			t.Fatalf("stats %+v after %d lost answers, charges %+v, answered %s", s, lost, fake.Charges(), id)
		}
	})
}

// TestFakeRefusesMalformed: requests the protocol does not allow are 400
// and charge nothing.
func TestFakeRefusesMalformed(t *testing.T) {
	fake, _ := newFake(t, processor.FakeConfig{})
	srv := httptest.NewServer(fake)
	defer srv.Close()
	const ids = `"payment_id":"0b7c3a52-3f4e-4c59-9a1d-6b2f0e8d7c11","account_id":"5e2a9f60-81d4-4b7a-a3c2-1f9e6d4b8a22"`
	for name, rq := range map[string]struct{ key, body string }{
		"no key":        {"", `{` + ids + `,"amount":1,"currency":"USD"}`},
		"long key":      {strings.Repeat("k", 256), `{` + ids + `,"amount":1,"currency":"USD"}`},
		"not JSON":      {"k", `{`},
		"no ids":        {"k", `{"amount":1,"currency":"USD"}`},
		"integer ids":   {"k", `{"payment_id":1,"account_id":1,"amount":1,"currency":"USD"}`},
		"unknown field": {"k", `{` + ids + `,"amount":1,"currency":"USD","x":1}`},
		"zero amount":   {"k", `{` + ids + `,"amount":0,"currency":"USD"}`},
		"other money":   {"k", `{` + ids + `,"amount":1,"currency":"EUR"}`},
	} {
		t.Run(name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader(rq.body))
			if rq.key != "" {
				req.Header.Set("Idempotency-Key", rq.key)
			}
			res, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d, want 400", res.StatusCode)
			}
		})
	}
	if s := fake.Stats(); s.Charges != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestNewClientRefusesBadURLs(t *testing.T) {
	for _, u := range []string{"", "127.0.0.1:8090", "ftp://x", "http://", "://"} {
		if _, err := processor.NewClient(u, nil); err == nil {
			t.Errorf("NewClient(%q) accepted", u)
		}
	}
	// Plain http only on loopback: anywhere else the charge and its key
	// cross the network in clear.
	for _, u := range []string{"http://processor.example.com", "http://10.0.0.7:8090", "http://[fd00::1]/", "http://127.0.0.1.example.com"} {
		if _, err := processor.NewClient(u, nil); !errors.Is(err, processor.ErrInsecureURL) {
			t.Errorf("NewClient(%q): %v, want ErrInsecureURL", u, err)
		}
	}
	for _, u := range []string{"https://processor.example.com", "http://127.0.0.1:8090", "http://127.3.4.5", "http://[::1]:8090", "http://localhost:8090"} {
		if _, err := processor.NewClient(u, nil); err != nil {
			t.Errorf("NewClient(%q): %v", u, err)
		}
	}
	if _, err := processor.NewFake(processor.FakeConfig{LoseRate: 1}); err == nil {
		t.Error("NewFake accepted a lose rate of 1")
	}
}

// TestChargeDoesNotFollowRedirects is the review's finding: a processor
// answering 307 to another address made the client resend the charge, its
// body and its Idempotency-Key there, and take that address's 201 for the
// processor's charge. The redirect is a failed call whose outcome is
// unknown (not ErrRejected: a retry goes to the processor again), and the
// other address receives nothing.
func TestChargeDoesNotFollowRedirects(t *testing.T) {
	var elsewhere atomic.Int64
	internal := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		elsewhere.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"ch_forged"}`))
	}))
	defer internal.Close()
	for _, status := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			redirecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, internal.URL+"/charges", status)
			}))
			defer redirecting.Close()
			hc := redirecting.Client()
			client, err := processor.NewClient(redirecting.URL, hc)
			if err != nil {
				t.Fatal(err)
			}
			id, err := client.Charge(context.Background(), "k", charge)
			if err == nil || errors.Is(err, processor.ErrRejected) || id != "" {
				t.Fatalf("Charge after a %d: %q, %v; want a failed call, not ErrRejected", status, id, err)
			}
			if n := elsewhere.Load(); n != 0 {
				t.Fatalf("the redirect's target received %d requests", n)
			}
			if hc.CheckRedirect != nil {
				t.Fatal("NewClient changed the caller's http.Client")
			}
		})
	}
}
