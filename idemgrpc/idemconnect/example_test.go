package idemconnect_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
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
// runs once, and the retry receives the stored response. Keys are scoped by
// the caller, whom the authentication interceptor listed first puts in the
// context: another caller who sends the same key gets a charge of her own,
// never the first caller's response.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // a database with idem's schema
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `
		create table accounts (id text primary key, balance bigint not null);
		create table charges (id bigserial primary key, account_id text not null, amount bigint not null);
		insert into accounts values ('acct-1', 10000)`); err != nil {
		panic(err)
	}
	defer pool.Exec(ctx, "drop table accounts, charges")

	callers := map[string]string{"Bearer token-ada": "user:ada", "Bearer token-grace": "user:grace"}
	authenticate := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			caller, ok := callers[req.Header().Get("Authorization")] // a real service verifies a credential here
			if !ok {
				return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("sign in"))
			}
			return next(idem.ContextWithScope(ctx, caller), req)
		}
	})
	intercept, err := idemconnect.NewInterceptor(pool, &idemconnect.Config{
		Methods: map[string]idemconnect.Method{
			chargev1connect.ChargeServiceChargeProcedure: {Required: true, KeyField: "request_id"},
		},
		Scope: idemconnect.ContextScope, // the caller authenticate put in the context
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle(chargev1connect.NewChargeServiceHandler(chargeService{}, connect.WithInterceptors(authenticate, intercept)))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	client := chargev1connect.NewChargeServiceClient(srv.Client(), srv.URL)
	for _, token := range []string{"token-ada", "token-ada", "token-grace"} { // acct-1 is their joint account
		req := connect.NewRequest(&chargev1.ChargeRequest{AccountId: "acct-1", Amount: 2500})
		req.Header().Set("Authorization", "Bearer "+token)
		req.Header().Set(idemconnect.HeaderKey, "order-17/charge")
		resp, err := client.Charge(ctx, req)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s: charge %d, balance %d, replayed %q\n", token, resp.Msg.GetChargeId(), resp.Msg.GetBalance(), resp.Header().Get(idemconnect.HeaderReplayed))
	}

	var n int
	if err := pool.QueryRow(ctx, "select count(*) from charges").Scan(&n); err != nil {
		panic(err)
	}
	fmt.Println("charges:", n)
	// Output:
	// token-ada: charge 1, balance 7500, replayed ""
	// token-ada: charge 1, balance 7500, replayed "true"
	// token-grace: charge 2, balance 5000, replayed ""
	// charges: 2
}
