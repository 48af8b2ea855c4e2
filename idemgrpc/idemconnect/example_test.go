package idemconnect_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idemgrpc/idemconnect"
	chargev1 "github.com/idemhq/idem/idemgrpc/internal/example/charge/v1"
	"github.com/idemhq/idem/idemgrpc/internal/example/charge/v1/chargev1connect"
)

var errInsufficientFunds = errors.New("insufficient funds")

// chargeService debits accounts through the call's transaction.
type chargeService struct {
	chargev1connect.UnimplementedChargeServiceHandler
}

func (chargeService) Charge(ctx context.Context, req *connect.Request[chargev1.ChargeRequest]) (*connect.Response[chargev1.ChargeResponse], error) {
	tx := idemconnect.Tx(ctx) // commits with the key
	resp := &chargev1.ChargeResponse{AccountId: req.Msg.GetAccountId(), Amount: req.Msg.GetAmount()}
	err := tx.QueryRow(ctx, `update accounts set balance = balance - $2
		where id = $1 and balance >= $2 returning balance`, req.Msg.GetAccountId(), req.Msg.GetAmount()).Scan(&resp.Balance)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errInsufficientFunds) // stored and replayed
	}
	if err == nil {
		err = tx.QueryRow(ctx, "insert into charges (account_id, amount) values ($1, $2) returning id",
			req.Msg.GetAccountId(), req.Msg.GetAmount()).Scan(&resp.ChargeId)
	}
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("try again")) // not stored: the key stays free
	}
	return connect.NewResponse(resp), nil
}

// A client retries a charge with the same Idempotency-Key: the handler
// runs once, and the retry receives the stored response.
func Example() {
	pool, drop := exampleDB() // a *pgxpool.Pool on a migrated database
	defer drop()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `
		create table accounts (id text primary key, balance bigint not null);
		create table charges (id bigserial primary key, account_id text not null, amount bigint not null);
		insert into accounts values ('acct-1', 10000)`); err != nil {
		panic(err)
	}

	intercept, err := idemconnect.NewInterceptor(pool, &idemconnect.Config{
		Methods: map[string]idemconnect.Method{
			chargev1connect.ChargeServiceChargeProcedure: {Required: true, KeyField: "request_id"},
		},
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle(chargev1connect.NewChargeServiceHandler(chargeService{}, connect.WithInterceptors(intercept)))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	client := chargev1connect.NewChargeServiceClient(srv.Client(), srv.URL)
	for range 2 {
		req := connect.NewRequest(&chargev1.ChargeRequest{AccountId: "acct-1", Amount: 2500})
		req.Header().Set(idemconnect.HeaderKey, "order-17/charge")
		resp, err := client.Charge(ctx, req)
		if err != nil {
			panic(err)
		}
		fmt.Printf("charge %d, balance %d, replayed %q\n", resp.Msg.GetChargeId(), resp.Msg.GetBalance(), resp.Header().Get(idemconnect.HeaderReplayed))
	}

	var n int
	if err := pool.QueryRow(ctx, "select count(*) from charges").Scan(&n); err != nil {
		panic(err)
	}
	fmt.Println("charges:", n)
	// Output:
	// charge 1, balance 7500, replayed ""
	// charge 1, balance 7500, replayed "true"
	// charges: 1
}
