package conformance_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	chargev1 "github.com/idemhq/idem/idemgrpc/internal/example/charge/v1"
	"github.com/idemhq/idem/testkit/testdb"
)

// Codes the bank answers with, as google.rpc.Code values.
const (
	codeOK                 = 0
	codeCanceled           = 1
	codeInvalidArgument    = 3
	codeNotFound           = 5
	codeFailedPrecondition = 9
	codeAborted            = 10
	codeInternal           = 13
	codeUnavailable        = 14
	codeUnauthenticated    = 16
)

// failAmount makes Charge fail with UNAVAILABLE, after writing, while
// bank.failures is positive.
const failAmount = 13

// nulAmount makes Charge refuse, after writing, with FAILED_PRECONDITION
// and nulMessage, whose U+0000 jsonb cannot hold.
const (
	nulAmount  = 17
	nulMessage = "declined by the issuer:\x00 code 05"
)

// bank is the charge service of these tests, free of any transport: the
// gRPC and Connect handlers both call its methods. Charge writes a charge
// row and debits the account through the call's transaction, and answers:
//
//	amount <= 0                   INVALID_ARGUMENT (validation: not stored)
//	unknown account               NOT_FOUND (stored)
//	balance < amount              FAILED_PRECONDITION with ErrorInfo and
//	                              PreconditionFailure details (stored)
//	amount == failAmount          UNAVAILABLE while failures > 0 (not stored)
//	otherwise                     the charge
type bank struct {
	pool     *pgxpool.Pool
	tx       func(context.Context) pgx.Tx // idemgrpc.Tx or idemconnect.Tx
	runs     atomic.Int64                 // Charge executions
	failures atomic.Int64                 // failAmount charges still to fail
	entered  chan struct{}                // when set, receives once Charge has written
	gate     chan struct{}                // when set, Charge waits for it after writing
	waitDone atomic.Bool                  // Charge waits for its context to end after writing
	sawTx    atomic.Int64                 // GetBalance and ListCharges calls that found a Tx
	keys     chan idem.CallKey            // when set, receives the key Charge ran under
}

// rpcError is an error answer, free of any transport.
type rpcError struct {
	code    int32
	message string
	details []proto.Message
}

func (e *rpcError) Error() string { return e.message }

func newBank(t *testing.T) *bank {
	t.Helper()
	return newBankOn(t, testdb.New(t))
}

// newBankOn returns the bank on pool, which must be on a new database.
func newBankOn(t *testing.T, pool *pgxpool.Pool) *bank {
	t.Helper()
	b := &bank{pool: pool}
	_, err := b.pool.Exec(context.Background(), `
		create table accounts (id text primary key, balance bigint not null check (balance >= 0));
		create table charges (
			id bigserial primary key,
			account_id text not null,
			amount bigint not null);
		insert into accounts values ('acct-1', 100000), ('acct-2', 100000), ('poor', 100)`)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *bank) Charge(ctx context.Context, req *chargev1.ChargeRequest) (*chargev1.ChargeResponse, error) {
	b.runs.Add(1)
	if req.GetAmount() <= 0 {
		return nil, &rpcError{code: codeInvalidArgument, message: "amount must be positive"}
	}
	tx := b.tx(ctx)
	if tx == nil {
		return nil, &rpcError{code: codeInternal, message: "no transaction"}
	}
	if b.keys != nil {
		k, _ := idem.KeyFromContext(ctx)
		b.keys <- k
	}
	resp := &chargev1.ChargeResponse{AccountId: req.GetAccountId(), Amount: req.GetAmount()}
	if err := tx.QueryRow(ctx, `insert into charges (account_id, amount) values ($1, $2) returning id`,
		req.GetAccountId(), req.GetAmount()).Scan(&resp.ChargeId); err != nil {
		return nil, &rpcError{code: codeUnavailable, message: err.Error()}
	}
	if b.entered != nil {
		b.entered <- struct{}{}
	}
	if b.gate != nil {
		<-b.gate
	}
	if b.waitDone.Load() {
		<-ctx.Done()
	}
	if req.GetAmount() == failAmount && b.failures.Add(-1) >= 0 {
		return nil, &rpcError{code: codeUnavailable, message: "the ledger is down"}
	}
	if req.GetAmount() == nulAmount {
		return nil, &rpcError{code: codeFailedPrecondition, message: nulMessage}
	}
	// The context may have ended (waitDone): the debit uses one that has
	// not, as a handler that has decided to finish would.
	err := tx.QueryRow(context.WithoutCancel(ctx), `update accounts set balance = balance - $2
		where id = $1 and balance >= $2 returning balance`, req.GetAccountId(), req.GetAmount()).Scan(&resp.Balance)
	if errors.Is(err, pgx.ErrNoRows) {
		var balance int64
		err := tx.QueryRow(context.WithoutCancel(ctx), `select balance from accounts where id = $1`, req.GetAccountId()).Scan(&balance)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, &rpcError{code: codeNotFound, message: "no account " + req.GetAccountId()}
		}
		return nil, insufficientFunds(balance)
	}
	if err != nil {
		return nil, &rpcError{code: codeUnavailable, message: err.Error()}
	}
	return resp, nil
}

// insufficientFunds is the refusal of a charge over the balance, with
// details that a replay must carry too.
func insufficientFunds(balance int64) *rpcError {
	return &rpcError{
		code:    codeFailedPrecondition,
		message: "insufficient funds",
		details: []proto.Message{
			&errdetails.ErrorInfo{Reason: "INSUFFICIENT_FUNDS", Domain: "idem.example.charge.v1",
				Metadata: map[string]string{"balance": strconv.FormatInt(balance, 10)}},
			&errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{
				{Type: "BALANCE", Subject: "accounts/poor", Description: "the balance is lower than the amount"}}},
		},
	}
}

func (b *bank) GetBalance(ctx context.Context, req *chargev1.GetBalanceRequest) (*chargev1.GetBalanceResponse, error) {
	if b.tx(ctx) != nil {
		b.sawTx.Add(1)
	}
	resp := &chargev1.GetBalanceResponse{}
	err := b.pool.QueryRow(ctx, "select balance from accounts where id = $1", req.GetAccountId()).Scan(&resp.Balance)
	if err != nil {
		return nil, &rpcError{code: codeNotFound, message: err.Error()}
	}
	return resp, nil
}

func (b *bank) ListCharges(ctx context.Context, req *chargev1.ListChargesRequest, send func(*chargev1.ChargeResponse) error) error {
	if b.tx(ctx) != nil {
		b.sawTx.Add(1)
	}
	rows, err := b.pool.Query(ctx, "select id, account_id, amount from charges where account_id = $1 order by id", req.GetAccountId())
	if err != nil {
		return &rpcError{code: codeUnavailable, message: err.Error()}
	}
	charges, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*chargev1.ChargeResponse, error) {
		c := &chargev1.ChargeResponse{}
		return c, row.Scan(&c.ChargeId, &c.AccountId, &c.Amount)
	})
	if err != nil {
		return &rpcError{code: codeUnavailable, message: err.Error()}
	}
	for _, c := range charges {
		if err := send(c); err != nil {
			return err
		}
	}
	return nil
}

func (b *bank) count(t *testing.T, query string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := b.pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (b *bank) charges(t *testing.T) int64 {
	t.Helper()
	return b.count(t, "select count(*) from charges")
}

func (b *bank) keyRows(t *testing.T) int64 {
	t.Helper()
	return b.count(t, "select count(*) from idempotency_keys")
}

func (b *bank) balance(t *testing.T, account string) int64 {
	t.Helper()
	return b.count(t, "select balance from accounts where id = $1", account)
}
