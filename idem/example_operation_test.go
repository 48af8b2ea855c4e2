package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// A charge made of steps: a database step, a slow processor call with no
// transaction open, and a database step. The first attempt stops after the
// processor charged (its answer was lost on the way back); the retry with
// the same key continues from there, sends the processor the same derived
// key, and the processor charges once.
func ExampleNewOperation() {
	ctx := context.Background()
	pool := connect(ctx)
	defer pool.Close()
	keys, err := idem.NewClient(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	openAccount(ctx, pool, 7, 100)

	var charged atomic.Int32
	processorKeys := map[string]bool{}
	lose := true
	charge, err := idem.NewOperation(keys, "example.charge",
		func(s *idem.Steps, req ChargeRequest) (Payment, error) {
			if _, err := idem.Step(s, "reserve", func(ctx context.Context, tx pgx.Tx) (bool, error) {
				_, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance - $1 WHERE id = $2`, req.Amount, req.AccountID)
				return true, err
			}); err != nil {
				return Payment{}, err
			}
			if _, err := idem.External(s, "charge", func(ctx context.Context, key string) (string, error) {
				if !processorKeys[key] { // the processor honours its idempotency keys
					processorKeys[key] = true
					charged.Add(1)
				}
				if lose {
					lose = false
					return "", errors.New("the processor's answer was lost")
				}
				return "ch_1", nil
			}); err != nil {
				return Payment{}, err
			}
			return idem.Step(s, "balance", func(ctx context.Context, tx pgx.Tx) (Payment, error) {
				var p Payment
				err := tx.QueryRow(ctx, `SELECT balance FROM accounts WHERE id = $1`, req.AccountID).Scan(&p.Balance)
				return p, err
			})
		}, nil)
	if err != nil {
		log.Fatal(err)
	}

	req := ChargeRequest{AccountID: 7, Amount: 30}
	_, outcome, err := charge.Run(ctx, "order-1", req)
	fmt.Println(outcome, err)
	p, outcome, err := charge.Run(ctx, "order-1", req)
	fmt.Println(outcome, p.Balance, err)
	p, outcome, _ = charge.Run(ctx, "order-1", req)
	fmt.Println(outcome, p.Balance, "charged:", charged.Load())
	// Output:
	// failed the processor's answer was lost
	// executed 70 <nil>
	// replayed 70 charged: 1
}
