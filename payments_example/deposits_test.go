package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemhq/idem/payments_example/api"
	"github.com/idemhq/idem/payments_example/internal/callmetrics"
	"github.com/idemhq/idem/payments_example/internal/deposits"
	"github.com/idemhq/idem/payments_example/internal/payments"
	"github.com/idemhq/idem/testkit/testdb"
)

// TestDeposits starts the command's server with -nats on a JetStream
// server embedded in the test process, on a stream whose duplicate window
// is short, and publishes a deposit twice with one Nats-Msg-Id, the
// second time after the window: the account is credited once, GET
// /metrics counts one delivery credited and one duplicate (and the
// duplicate's replayed call in idem_calls_total), and serve stops cleanly.
func TestDeposits(t *testing.T) {
	ctx := t.Context()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: t.TempDir(), NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("the embedded NATS server did not start")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	const window = 100 * time.Millisecond
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: deposits.StreamName,
		Subjects: []string{deposits.Subject}, Duplicates: window}); err != nil {
		t.Fatal(err)
	}

	pool := testdb.New(t)
	if err := payments.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := deposits.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	set := defaultSettings()
	set.natsURL = srv.ClientURL()
	s := start(t, pool, set)
	a := s.signUp(ctx, t)

	body, err := json.Marshal(deposits.Deposit{AccountID: a.Id, Amount: 2500, Currency: payments.Currency})
	if err != nil {
		t.Fatal(err)
	}
	for stored := 0; stored < 2; {
		ack, err := js.Publish(ctx, deposits.Subject, body, jetstream.WithMsgID("transfer-1"))
		if err != nil {
			t.Fatal(err)
		}
		if !ack.Duplicate {
			stored++
		}
		time.Sleep(window)
	}

	var counted map[string]int64
	deadline := time.Now().Add(liveness)
	for {
		status, metrics := rawGet(t, s.metricsAddr, "/metrics")
		if status != http.StatusOK {
			t.Fatalf("GET /metrics: %d %s", status, metrics)
		}
		if counted, err = callmetrics.Sum(bytes.NewReader(metrics), callmetrics.DepositsMetric, callmetrics.DepositsResultName); err != nil {
			t.Fatal(err)
		}
		if counted["credited"]+counted["duplicate"] >= 2 {
			calls, err := callmetrics.Read(bytes.NewReader(metrics))
			if err != nil {
				t.Fatal(err)
			}
			if n := callmetrics.Of(calls, "replayed"); n != 1 {
				t.Errorf("idem_calls_total counts %d replays, want the duplicate's 1", n)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("deposits_messages_total after %v: %v", liveness, counted)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if want := map[string]int64{"credited": 1, "duplicate": 1}; !reflect.DeepEqual(counted, want) {
		t.Errorf("deposits_messages_total by result: %v, want %v", counted, want)
	}
	status, got := s.get(ctx, t, "/accounts/"+a.Id.String(), a.ApiKey)
	var account api.Account
	if err := json.Unmarshal(got, &account); err != nil || status != http.StatusOK {
		t.Fatalf("GET /accounts/{id}: %d %s", status, got)
	}
	if want := int64(payments.OpeningBalance + 2500); account.Balance != want {
		t.Errorf("balance %d, want %d: the deposit credited once", account.Balance, want)
	}
	if err := s.stop(); err != nil {
		t.Fatalf("serve after shutdown: %v", err)
	}
}
