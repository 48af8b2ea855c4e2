package unary

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemhq/idem/idem"
	chargev1 "github.com/idemhq/idem/idemgrpc/internal/example/charge/v1"
)

const (
	charge      = "/idem.example.charge.v1.ChargeService/Charge"
	listCharges = "/idem.example.charge.v1.ChargeService/ListCharges"
)

// noDB is a database that New accepts and these tests never reach.
type noDB struct{}

func (noDB) Begin(context.Context) (pgx.Tx, error) { return nil, errors.New("no database") }

func TestNewChecksTheConfig(t *testing.T) {
	ok := map[string]MethodConfig{charge: {KeyField: "request_id"}}
	scope := func(context.Context) (string, error) { return "caller", nil }
	for name, tc := range map[string]struct {
		db  idem.Beginner
		cfg Config
	}{
		"nil database":         {cfg: Config{Methods: ok}},
		"typed nil pool":       {db: (*pgxpool.Pool)(nil), cfg: Config{Methods: ok}},
		"no scope":             {db: noDB{}, cfg: Config{Methods: ok, SharedKeys: false}},
		"scope and shared":     {db: noDB{}, cfg: Config{Methods: ok, Scope: scope, SharedKeys: true}},
		"no methods":           {db: noDB{}},
		"not a full name":      {db: noDB{}, cfg: Config{Methods: map[string]MethodConfig{"idem.example.charge.v1.ChargeService/Charge": {}}}},
		"three parts":          {db: noDB{}, cfg: Config{Methods: map[string]MethodConfig{charge + "/x": {}}}},
		"unknown service":      {db: noDB{}, cfg: Config{Methods: map[string]MethodConfig{"/no.such.Service/Charge": {}}}},
		"a message, not a svc": {db: noDB{}, cfg: Config{Methods: map[string]MethodConfig{"/idem.example.charge.v1.ChargeRequest/Charge": {}}}},
		"unknown method":       {db: noDB{}, cfg: Config{Methods: map[string]MethodConfig{"/idem.example.charge.v1.ChargeService/Refund": {}}}},
		"streaming method":     {db: noDB{}, cfg: Config{Methods: map[string]MethodConfig{listCharges: {}}}},
		"unknown key field":    {db: noDB{}, cfg: Config{Methods: map[string]MethodConfig{charge: {KeyField: "idempotency_key"}}}},
		"key field not string": {db: noDB{}, cfg: Config{Methods: map[string]MethodConfig{charge: {KeyField: "amount"}}}},
		"negative response":    {db: noDB{}, cfg: Config{Methods: ok, MaxResponseBytes: -1}},
		"negative retry delay": {db: noDB{}, cfg: Config{Methods: ok, RetryDelay: -time.Second}},
		"negative wait":        {db: noDB{}, cfg: Config{Methods: ok, Wait: -time.Second}},
		"read-only tx":         {db: noDB{}, cfg: Config{Methods: ok, TxOptions: pgx.TxOptions{AccessMode: pgx.ReadOnly}}},
	} {
		t.Run(name, func(t *testing.T) {
			tc.cfg.Package = "test"
			if tc.cfg.Scope == nil && name != "no scope" {
				tc.cfg.SharedKeys = true // so that the error is the case's own
			}
			s, err := New(tc.db, tc.cfg)
			if !errors.Is(err, idem.ErrInvalidOption) || s != nil {
				t.Fatalf("New: %v, %v; want an error wrapping idem.ErrInvalidOption", s, err)
			}
			if !strings.Contains(err.Error(), "test") {
				t.Fatalf("the error %q does not name the package", err)
			}
		})
	}
	s, err := New(noDB{}, Config{Package: "test", Methods: ok, Scope: ContextScope})
	if err != nil {
		t.Fatal(err)
	}
	if s.Method(charge) == nil || s.Method(listCharges) != nil {
		t.Fatal("Method does not report the covered methods")
	}
}

// answer maps each way idem.Run ends to the code, reason and details the
// interceptors send.
func TestAnswer(t *testing.T) {
	var logged bytes.Buffer
	var reported []string
	s, err := New(noDB{}, Config{
		Package:    "test",
		Methods:    map[string]MethodConfig{charge: {}},
		SharedKeys: true,
		Logger:     slog.New(slog.NewTextHandler(&logged, nil)),
		OnError: func(_ context.Context, method string, st *spb.Status, cause error) {
			reported = append(reported, fmt.Sprintf("%s %d %v", method, st.GetCode(), cause))
		},
		RetryDelay: 3 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	m := s.Method(charge)
	for _, tc := range []struct {
		err      error
		outcome  idem.Outcome
		code     int32
		reason   string
		retry    bool
		reported bool
	}{
		{idem.ErrMismatch, idem.OutcomeMismatch, CodeFailedPrecondition, ReasonKeyMismatch, false, false},
		{idem.ErrInProgress, idem.OutcomeInProgress, CodeAborted, ReasonInProgress, true, false},
		{fmt.Errorf("commit: %w", idem.ErrOutcomeUnknown), idem.OutcomeUnknown, CodeUnavailable, ReasonOutcomeUnknown, true, true},
		{&pgconn.PgError{Code: "40001"}, idem.OutcomeFailed, CodeUnavailable, ReasonUnavailable, true, true},
		{io.ErrUnexpectedEOF, idem.OutcomeFailed, CodeUnavailable, ReasonUnavailable, true, true},
		{idem.ErrResultTooLarge, idem.OutcomeFailed, CodeInternal, ReasonResponseTooLarge, false, true},
		{errResponseTooLarge, idem.OutcomeFailed, CodeInternal, ReasonResponseTooLarge, false, true},
		{errNoResponse, idem.OutcomeFailed, CodeInternal, ReasonInternal, false, true},
		{idem.ErrCorruptRecord, idem.OutcomeFailed, CodeInternal, ReasonInternal, false, true},
		{idem.ErrKeyLost, idem.OutcomeFailed, CodeInternal, ReasonInternal, false, true},
		{idem.ErrInvalidScope, idem.OutcomeInvalid, CodeInvalidArgument, ReasonInvalidRequest, false, false},
	} {
		t.Run(tc.err.Error(), func(t *testing.T) {
			reported = nil
			a := s.answer(context.Background(), m, reply{}, tc.outcome, tc.err)
			if a.Handler || a.Replayed || a.Status == nil {
				t.Fatalf("answer %+v, want a status of the interceptor's own", a)
			}
			if a.Status.GetCode() != tc.code || a.Status.GetMessage() == "" {
				t.Fatalf("status %v, want code %d with a message", a.Status, tc.code)
			}
			var info *errdetails.ErrorInfo
			var retry *errdetails.RetryInfo
			for _, d := range a.Status.GetDetails() {
				v, err := d.UnmarshalNew()
				if err != nil {
					t.Fatal(err)
				}
				switch v := v.(type) {
				case *errdetails.ErrorInfo:
					info = v
				case *errdetails.RetryInfo:
					retry = v
				}
			}
			if info.GetReason() != tc.reason || info.GetDomain() != "idem.example.charge.v1.ChargeService" {
				t.Fatalf("ErrorInfo %v, want reason %s in the service's domain", info, tc.reason)
			}
			if (retry != nil) != tc.retry || retry != nil && retry.GetRetryDelay().AsDuration() != 3*time.Second {
				t.Fatalf("RetryInfo %v, want one (3s): %t", retry, tc.retry)
			}
			if (len(reported) == 1) != tc.reported {
				t.Fatalf("reported %q, want a report: %t", reported, tc.reported)
			}
		})
	}

	// The handler's own answers, stored or not, are returned as they are.
	for _, tc := range []struct {
		err     error
		outcome idem.Outcome
	}{
		{nil, idem.OutcomeExecuted},
		{idem.Refuse("rpc_not_found", "no"), idem.OutcomeRefused},
		{fmt.Errorf("wrapped: %w", errNotStored), idem.OutcomeFailed},
	} {
		if a := s.answer(context.Background(), m, reply{}, tc.outcome, tc.err); !a.Handler {
			t.Fatalf("%v: answer %+v, want the handler's", tc.err, a)
		}
	}

	// A stored response of another type than the method's is not replayed.
	r, err := messageReply(&chargev1.GetBalanceResponse{Balance: 1})
	if err != nil {
		t.Fatal(err)
	}
	var stored reply
	if err := stored.UnmarshalBinary(r.data); err != nil {
		t.Fatal(err)
	}
	if a := s.answer(context.Background(), m, stored, idem.OutcomeReplayed, nil); a.Replayed || a.Status.GetCode() != CodeInternal {
		t.Fatalf("a response of another type replayed: %+v", a)
	}
	if !strings.Contains(logged.String(), "level=ERROR") || strings.Contains(logged.String(), "8e03978e") {
		t.Fatalf("log %q", logged.String())
	}
}

// A handler's error whose code the rule stores becomes a refusal, with the
// full status stored once, in the reply: the refusal names only the code.
// Others, and errors that claim success, are not stored.
func TestDecide(t *testing.T) {
	s, err := New(noDB{}, Config{Package: "test", Methods: map[string]MethodConfig{charge: {}}, MaxResponseBytes: 64, SharedKeys: true})
	if err != nil {
		t.Fatal(err)
	}
	refused := &spb.Status{Code: CodeNotFound, Message: "no account"}
	r, err := s.decide(Result{Status: refused})
	var refusal *idem.Refusal
	if !errors.As(err, &refusal) || refusal.Code != "rpc_not_found" || refusal.Message != "" {
		t.Fatalf("decide: %v, want a refusal with the code alone (the message is in the reply)", err)
	}
	var back reply
	if err := back.UnmarshalBinary(r.data); err != nil || !proto.Equal(back.status, refused) {
		t.Fatalf("stored %v, %v", back.status, err)
	}
	for _, st := range []*spb.Status{{Code: CodeUnavailable}, {Code: CodeInvalidArgument}, {Code: 0, Message: "ok?"}} {
		if _, err := s.decide(Result{Status: st}); !errors.Is(err, errNotStored) {
			t.Fatalf("code %d: %v, want not stored", st.GetCode(), err)
		}
	}
	if _, err := s.decide(Result{}); !errors.Is(err, errNoResponse) {
		t.Fatalf("no response: %v", err)
	}
	if _, err := s.decide(Result{Msg: &chargev1.ChargeResponse{AccountId: strings.Repeat("a", 64)}}); !errors.Is(err, errResponseTooLarge) {
		t.Fatalf("large response: %v", err)
	}
	if _, err := s.decide(Result{Status: &spb.Status{Code: CodeNotFound, Message: strings.Repeat("a", 64)}}); !errors.Is(err, errResponseTooLarge) {
		t.Fatalf("large status: %v", err)
	}
}
