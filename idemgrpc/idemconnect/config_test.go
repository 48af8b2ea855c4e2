package idemconnect_test

import (
	"context"
	"errors"
	"testing"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemgrpc/idemconnect"
	"github.com/idemhq/idem/idemgrpc/internal/example/charge/v1/chargev1connect"
)

type noDB struct{}

func (noDB) Begin(context.Context) (pgx.Tx, error) { return nil, errors.New("no database") }

func TestNewInterceptorChecksConfig(t *testing.T) {
	for name, cfg := range map[string]*idemconnect.Config{
		"nil":       nil,
		"no method": {},
		"streaming": {Methods: map[string]idemconnect.Method{chargev1connect.ChargeServiceListChargesProcedure: {}}},
		"key field": {Methods: map[string]idemconnect.Method{chargev1connect.ChargeServiceChargeProcedure: {KeyField: "amount"}}},
		"negative":  {Methods: map[string]idemconnect.Method{chargev1connect.ChargeServiceChargeProcedure: {}}, MaxResponseBytes: -1},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := idemconnect.NewInterceptor(noDB{}, cfg); !errors.Is(err, idem.ErrInvalidOption) {
				t.Fatalf("%v, want an error wrapping idem.ErrInvalidOption", err)
			}
		})
	}
	if _, err := idemconnect.NewInterceptor(noDB{}, &idemconnect.Config{
		Methods: map[string]idemconnect.Method{chargev1connect.ChargeServiceChargeProcedure: {KeyField: "request_id"}},
	}); err != nil {
		t.Fatal(err)
	}
}

func TestDefaultStoreCode(t *testing.T) {
	stored := map[connect.Code]bool{connect.CodeNotFound: true, connect.CodeAlreadyExists: true, connect.CodeFailedPrecondition: true, connect.CodeOutOfRange: true}
	for c := connect.Code(0); c <= connect.CodeUnauthenticated; c++ {
		if got := idemconnect.DefaultStoreCode(c); got != stored[c] {
			t.Errorf("DefaultStoreCode(%v) = %t", c, got)
		}
	}
}
