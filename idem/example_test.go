package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/internal/testdb"
)

// exampleDB returns a pool on a fresh database with an accounts table.
func exampleDB() (*pgxpool.Pool, func()) {
	pool, done, err := testdb.Open()
	if err != nil {
		log.Fatal(err)
	}
	_, err = pool.Exec(context.Background(), `
		CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL CHECK (balance >= 0));
		INSERT INTO accounts VALUES (1, 1000);`)
	if err != nil {
		log.Fatal(err)
	}
	return pool, done
}

type ChargeRequest struct {
	AccountID int `json:"account_id"`
	Amount    int `json:"amount"`
}

type Payment struct {
	Balance int `json:"balance"`
}

var ErrInsufficientFunds = idem.Refuse("insufficient_funds", "insufficient funds").WithStatus(402)

func charge(ctx context.Context, pool *pgxpool.Pool, key string, req ChargeRequest) (Payment, bool, error) {
	hash, err := idem.HashJSON(req)
	if err != nil {
		return Payment{}, false, err
	}
	var replayed bool
	p, err := idem.Do(ctx, pool, key, hash, func(tx pgx.Tx) (Payment, error) {
		var p Payment
		err := tx.QueryRow(ctx,
			`UPDATE accounts SET balance = balance - $1 WHERE id = $2 AND balance >= $1 RETURNING balance`,
			req.Amount, req.AccountID).Scan(&p.Balance)
		if errors.Is(err, pgx.ErrNoRows) {
			return p, ErrInsufficientFunds
		}
		return p, err
	}, idem.WithReplayed(&replayed))
	return p, replayed, err
}

// A charge whose answer was lost is retried with the same key: the retry gets
// the first answer and the account is charged once.
func ExampleDo() {
	pool, done := exampleDB()
	defer done()
	ctx := context.Background()
	req := ChargeRequest{AccountID: 1, Amount: 300}

	p, replayed, err := charge(ctx, pool, "3f2b8c1e-5d4a-4e0b-9f6a-1c2d3e4f5a6b", req)
	fmt.Println(p.Balance, replayed, err)
	p, replayed, err = charge(ctx, pool, "3f2b8c1e-5d4a-4e0b-9f6a-1c2d3e4f5a6b", req)
	fmt.Println(p.Balance, replayed, err)

	_, _, err = charge(ctx, pool, "3f2b8c1e-5d4a-4e0b-9f6a-1c2d3e4f5a6b", ChargeRequest{AccountID: 1, Amount: 999})
	fmt.Println(errors.Is(err, idem.ErrMismatch))

	var balance int
	_ = pool.QueryRow(ctx, "SELECT balance FROM accounts WHERE id = 1").Scan(&balance)
	fmt.Println("balance:", balance)
	// Output:
	// 700 false <nil>
	// 700 true <nil>
	// true
	// balance: 700
}

// A business refusal is stored like a success: the retry gets the same
// refusal, even if the account has been topped up since.
func ExampleRefuse() {
	pool, done := exampleDB()
	defer done()
	ctx := context.Background()
	req := ChargeRequest{AccountID: 1, Amount: 5000}

	_, _, err := charge(ctx, pool, "key-too-much", req)
	fmt.Println(err)
	_, _ = pool.Exec(ctx, "UPDATE accounts SET balance = 10000 WHERE id = 1")
	_, replayed, err := charge(ctx, pool, "key-too-much", req)
	fmt.Println(err, replayed, errors.Is(err, ErrInsufficientFunds))
	// Output:
	// refused: insufficient_funds: insufficient funds
	// refused: insufficient_funds: insufficient funds true true
}

type OrderRequest struct {
	Items []string `json:"items"`
}

type Order struct {
	ID int `json:"id"`
}

type Orders struct{}

func (Orders) Create(ctx context.Context, tx pgx.Tx, req OrderRequest) (Order, error) {
	var o Order
	err := tx.QueryRow(ctx, "INSERT INTO orders (items) VALUES ($1) RETURNING id", req.Items).Scan(&o.ID)
	return o, err
}

// Wrap makes a service method idempotent without touching it.
func ExampleWrap() {
	pool, done := exampleDB()
	defer done()
	ctx := context.Background()
	_, _ = pool.Exec(ctx, "CREATE TABLE orders (id serial PRIMARY KEY, items text[])")

	create := idem.Wrap(pool, "orders.create", Orders{}.Create)
	a, _ := create(ctx, "order-key-1", OrderRequest{Items: []string{"book"}})
	b, _ := create(ctx, "order-key-1", OrderRequest{Items: []string{"book"}})
	c, _ := create(ctx, "order-key-2", OrderRequest{Items: []string{"pen"}})
	fmt.Println(a.ID, b.ID, c.ID)
	// Output: 1 1 2
}
