package processor_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

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

var charge = processor.Charge{PaymentID: 1, AccountID: 2, Amount: 300, Currency: "USD"}

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
	for name, rq := range map[string]struct{ key, body string }{
		"no key":        {"", `{"payment_id":1,"account_id":1,"amount":1,"currency":"USD"}`},
		"long key":      {strings.Repeat("k", 256), `{"payment_id":1,"account_id":1,"amount":1,"currency":"USD"}`},
		"not JSON":      {"k", `{`},
		"unknown field": {"k", `{"payment_id":1,"account_id":1,"amount":1,"currency":"USD","x":1}`},
		"zero amount":   {"k", `{"payment_id":1,"account_id":1,"amount":0,"currency":"USD"}`},
		"other money":   {"k", `{"payment_id":1,"account_id":1,"amount":1,"currency":"EUR"}`},
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
	if _, err := processor.NewFake(processor.FakeConfig{LoseRate: 1}); err == nil {
		t.Error("NewFake accepted a lose rate of 1")
	}
}
