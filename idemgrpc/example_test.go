package idemgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemgrpc"
	chargev1 "github.com/idemhq/idem/idemgrpc/internal/example/charge/v1"
)

// chargeService debits accounts through the call's transaction.
type chargeService struct {
	chargev1.UnimplementedChargeServiceServer
}

func (chargeService) Charge(ctx context.Context, req *chargev1.ChargeRequest) (*chargev1.ChargeResponse, error) {
	tx := idemgrpc.Tx(ctx) // commits with the key
	resp := &chargev1.ChargeResponse{AccountId: req.GetAccountId(), Amount: req.GetAmount()}
	err := tx.QueryRow(ctx, `update accounts set balance = balance - $2
		where id = $1 and balance >= $2 returning balance`, req.GetAccountId(), req.GetAmount()).Scan(&resp.Balance)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, status.Error(codes.FailedPrecondition, "insufficient funds") // stored and replayed
	}
	if err == nil {
		err = tx.QueryRow(ctx, "insert into charges (account_id, amount) values ($1, $2) returning id",
			req.GetAccountId(), req.GetAmount()).Scan(&resp.ChargeId)
	}
	if err != nil {
		return nil, status.Error(codes.Unavailable, "try again") // not stored: the key stays free
	}
	return resp, nil
}

// A client retries a charge with the same request_id: the handler runs
// once, and the retry receives the stored response. Keys are scoped by the
// caller, whom the authentication interceptor in front puts in the
// context: another caller who sends the same request_id gets a charge of
// her own, never the first caller's response.
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
	authenticate := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		tokens := metadata.ValueFromIncomingContext(ctx, "authorization")
		if len(tokens) != 1 || callers[tokens[0]] == "" { // a real service verifies a credential here
			return nil, status.Error(codes.Unauthenticated, "sign in")
		}
		return handler(idem.ContextWithScope(ctx, callers[tokens[0]]), req)
	}
	intercept, err := idemgrpc.NewUnaryServerInterceptor(pool, &idemgrpc.Config{
		Methods: map[string]idemgrpc.Method{
			chargev1.ChargeService_Charge_FullMethodName: {Required: true, KeyField: "request_id"},
		},
		Scope: idemgrpc.ContextScope, // the caller authenticate put in the context
	})
	if err != nil {
		panic(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(authenticate, intercept))
	chargev1.RegisterChargeServiceServer(srv, chargeService{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := chargev1.NewChargeServiceClient(conn)
	req := &chargev1.ChargeRequest{RequestId: "8e03978e-40d5-43e8-bc93-6894a57f9324", AccountId: "acct-1", Amount: 2500}
	for _, token := range []string{"token-ada", "token-ada", "token-grace"} { // acct-1 is their joint account
		var header metadata.MD
		cctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
		resp, err := client.Charge(cctx, req, grpc.Header(&header))
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s: charge %d, balance %d, replayed %q\n", token, resp.GetChargeId(), resp.GetBalance(), header.Get(idemgrpc.MetadataReplayed))
	}

	var n int
	if err := pool.QueryRow(ctx, "select count(*) from charges").Scan(&n); err != nil {
		panic(err)
	}
	fmt.Println("charges:", n)
	// Output:
	// token-ada: charge 1, balance 7500, replayed []
	// token-ada: charge 1, balance 7500, replayed ["true"]
	// token-grace: charge 2, balance 5000, replayed []
	// charges: 2
}
