package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/schema"
)

// connect opens a pool on DATABASE_URL and makes sure the key table and an
// accounts table exist. (The tests of this package point DATABASE_URL at a
// fresh database.)
func connect(ctx context.Context) *pgxpool.Pool {
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	if err := schema.Apply(ctx, pool); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS accounts (id int PRIMARY KEY, balance int NOT NULL CHECK (balance >= 0));
		CREATE TABLE IF NOT EXISTS orders (id serial PRIMARY KEY, tenant text, items text[])`); err != nil {
		log.Fatal(err)
	}
	return pool
}

// openAccount creates (or resets) an account with a balance.
func openAccount(ctx context.Context, pool *pgxpool.Pool, id, balance int) {
	_, err := pool.Exec(ctx, `INSERT INTO accounts VALUES ($1, $2)
		ON CONFLICT (id) DO UPDATE SET balance = excluded.balance`, id, balance)
	if err != nil {
		log.Fatal(err)
	}
}

type ChargeRequest struct {
	AccountID int `json:"account_id"`
	Amount    int `json:"amount"`
}

type Payment struct {
	Balance int `json:"balance"`
}

// ErrInsufficientFunds is a business refusal: stored with the key and
// replayed to every retry.
var ErrInsufficientFunds = idem.Refuse("insufficient_funds", "insufficient funds").WithStatus(402)

// charge takes req.Amount from the account, once per key.
func charge(ctx context.Context, db idem.Beginner, key string, req ChargeRequest) (Payment, idem.Outcome, error) {
	hash, err := idem.HashJSON(req)
	if err != nil {
		return Payment{}, 0, err
	}
	return idem.Run(ctx, db, key, hash, func(ctx context.Context, tx pgx.Tx) (Payment, error) {
		var p Payment
		err := tx.QueryRow(ctx,
			`UPDATE accounts SET balance = balance - $1 WHERE id = $2 AND balance >= $1 RETURNING balance`,
			req.Amount, req.AccountID).Scan(&p.Balance)
		if errors.Is(err, pgx.ErrNoRows) {
			return p, ErrInsufficientFunds
		}
		return p, err
	})
}

// A charge whose answer was lost is retried with the same key: the retry gets
// the first answer and the account is charged once. The same key with
// another request is refused.
func ExampleDo() {
	ctx := context.Background()
	pool := connect(ctx)
	defer pool.Close()
	openAccount(ctx, pool, 1, 1000)

	req := ChargeRequest{AccountID: 1, Amount: 300}
	hash, _ := idem.HashJSON(req)
	charge := func(tx pgx.Tx) (Payment, error) {
		var p Payment
		err := tx.QueryRow(ctx,
			`UPDATE accounts SET balance = balance - $1 WHERE id = $2 RETURNING balance`,
			req.Amount, req.AccountID).Scan(&p.Balance)
		return p, err
	}
	const key = "3f2b8c1e-5d4a-4e0b-9f6a-1c2d3e4f5a6b"
	first, err := idem.Do(ctx, pool, key, hash, charge)
	fmt.Println(first.Balance, err)
	retry, err := idem.Do(ctx, pool, key, hash, charge) // the answer was lost; the client retries
	fmt.Println(retry.Balance, err)

	other, _ := idem.HashJSON(ChargeRequest{AccountID: 1, Amount: 999})
	_, err = idem.Do(ctx, pool, key, other, charge)
	fmt.Println(errors.Is(err, idem.ErrMismatch))

	var balance int
	_ = pool.QueryRow(ctx, "SELECT balance FROM accounts WHERE id = 1").Scan(&balance)
	fmt.Println("balance:", balance)
	// Output:
	// 700 <nil>
	// 700 <nil>
	// true
	// balance: 700
}

// Run also says whether the result was replayed.
func ExampleRun() {
	ctx := context.Background()
	pool := connect(ctx)
	defer pool.Close()
	openAccount(ctx, pool, 2, 1000)

	for range 2 {
		p, outcome, err := charge(ctx, pool, "run-key-1", ChargeRequest{AccountID: 2, Amount: 250})
		fmt.Println(p.Balance, outcome, err)
	}
	// Output:
	// 750 executed <nil>
	// 750 replayed <nil>
}

// A business refusal is stored like a success: the retry gets the same
// refusal, even if the account has been topped up since.
func ExampleRefuse() {
	ctx := context.Background()
	pool := connect(ctx)
	defer pool.Close()
	openAccount(ctx, pool, 3, 1000)

	req := ChargeRequest{AccountID: 3, Amount: 5000}
	_, outcome, err := charge(ctx, pool, "key-too-much", req)
	fmt.Println(outcome, err)
	openAccount(ctx, pool, 3, 10000)
	_, outcome, err = charge(ctx, pool, "key-too-much", req)
	fmt.Println(outcome, err, errors.Is(err, ErrInsufficientFunds))
	// Output:
	// refused refused: insufficient_funds: insufficient funds
	// replayed refused: insufficient_funds: insufficient funds true
}

type OrderRequest struct {
	Items []string `json:"items"`
}

type Order struct {
	ID int `json:"id"`
}

type Orders struct{}

// Create inserts an order for the tenant the context carries.
func (Orders) Create(ctx context.Context, tx pgx.Tx, req OrderRequest) (Order, error) {
	tenant, _ := idem.ScopeFromContext(ctx)
	var o Order
	err := tx.QueryRow(ctx, "INSERT INTO orders (tenant, items) VALUES ($1, $2) RETURNING id",
		tenant, req.Items).Scan(&o.ID)
	return o, err
}

// Wrap makes a service method idempotent without touching it. It is built
// once; the tenant comes with each request's context, and the same key in
// two tenants is two keys.
func ExampleWrap() {
	ctx := context.Background()
	pool := connect(ctx)
	defer pool.Close()

	create := idem.Wrap(pool, "orders.create", Orders{}.Create)

	acme := idem.ContextWithScope(ctx, "tenant-acme")
	globex := idem.ContextWithScope(ctx, "tenant-globex")
	a, _, _ := create(acme, "order-key-1", OrderRequest{Items: []string{"book"}})
	b, outcome, _ := create(acme, "order-key-1", OrderRequest{Items: []string{"book"}}) // a retry
	c, _, _ := create(globex, "order-key-1", OrderRequest{Items: []string{"book"}})
	fmt.Println(a.ID, b.ID, c.ID)
	fmt.Println("the retry was", outcome)
	// Output:
	// 1 1 2
	// the retry was replayed
}

// A deployment's settings live in one Config, checked once; the Client is
// then passed wherever a database is expected. Support staff look keys up.
func ExampleNewClient() {
	ctx := context.Background()
	pool := connect(ctx)
	defer pool.Close()
	openAccount(ctx, pool, 4, 1000)

	keys, err := idem.NewClient(pool, &idem.Config{TTL: 48 * time.Hour})
	if err != nil {
		log.Fatal(err) // a bad setting is found here, at start-up
	}
	tenant := idem.ContextWithScope(ctx, "tenant-7")
	if _, _, err := charge(tenant, keys, "client-key-1", ChargeRequest{AccountID: 4, Amount: 100}); err != nil {
		log.Fatal(err)
	}

	rec, err := keys.Lookup(ctx, "tenant-7", "client-key-1")
	if err != nil {
		log.Fatal(err)
	}
	p, err := idem.DecodeResult[Payment](rec)
	fmt.Println(rec.Status, rec.ExpiresAt.Sub(rec.CompletedAt), p.Balance, err)
	// Output: completed 48h0m0s 900 <nil>
}

// The key for a downstream service (a payment processor) is derived from
// the request's key and a purpose: every retry sends the same one.
func ExampleCallKey_Derive() {
	k := idem.CallKey{Scope: "tenant-7", Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"}
	charge, retry := k.Derive("charge"), k.Derive("charge") // a retry derives the same key
	fmt.Println(charge)
	fmt.Println(charge == retry, charge == k.Derive("refund"))
	// Output:
	// e15e91a7-28f7-8148-aee1-2d08ec80924d
	// true false
}
