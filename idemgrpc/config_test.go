package idemgrpc_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemgrpc"
	chargev1 "github.com/idemhq/idem/idemgrpc/internal/example/charge/v1"
)

type noDB struct{}

func (noDB) Begin(context.Context) (pgx.Tx, error) { return nil, errors.New("no database") }

func TestNewUnaryServerInterceptorChecksConfig(t *testing.T) {
	for name, cfg := range map[string]*idemgrpc.Config{
		"nil":       nil,
		"no method": {},
		"streaming": {Methods: map[string]idemgrpc.Method{chargev1.ChargeService_ListCharges_FullMethodName: {}}},
		"key field": {Methods: map[string]idemgrpc.Method{chargev1.ChargeService_Charge_FullMethodName: {KeyField: "amount"}}},
		"negative":  {Methods: map[string]idemgrpc.Method{chargev1.ChargeService_Charge_FullMethodName: {}}, MaxResponseBytes: -1},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := idemgrpc.NewUnaryServerInterceptor(noDB{}, cfg); !errors.Is(err, idem.ErrInvalidOption) {
				t.Fatalf("%v, want an error wrapping idem.ErrInvalidOption", err)
			}
		})
	}
	if _, err := idemgrpc.NewUnaryServerInterceptor(noDB{}, &idemgrpc.Config{
		Methods: map[string]idemgrpc.Method{chargev1.ChargeService_Charge_FullMethodName: {KeyField: "request_id"}},
	}); err != nil {
		t.Fatal(err)
	}
}

func TestDefaultStoreCode(t *testing.T) {
	stored := map[codes.Code]bool{codes.NotFound: true, codes.AlreadyExists: true, codes.FailedPrecondition: true, codes.OutOfRange: true}
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if got := idemgrpc.DefaultStoreCode(c); got != stored[c] {
			t.Errorf("DefaultStoreCode(%v) = %t", c, got)
		}
	}
}
