package integration_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// chargeSQL is the charge of the README and of the payments example: it
// takes the amount only if the balance covers it, all of it included.
const chargeSQL = `UPDATE wallets SET balance = balance - $2 WHERE id = $1 AND balance >= $2 RETURNING balance`

var errNoFunds = idem.Refuse("insufficient_funds", "the balance does not cover the amount").WithStatus(402)

func walletCharge(ctx context.Context, wallet, amount int64) func(pgx.Tx) (int64, error) {
	return func(tx pgx.Tx) (int64, error) {
		var balance int64
		err := tx.QueryRow(ctx, chargeSQL, wallet, amount).Scan(&balance)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, errNoFunds
		}
		return balance, err
	}
}

// A balance covers a charge of exactly its amount, and not one cent more;
// the refusal is stored, and no interleaving of two charges that each take
// the whole balance can spend it twice.
func TestBalanceBoundary(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	if _, err := s.pool.Exec(ctx, `CREATE TABLE wallets (id bigint PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0));
		INSERT INTO wallets VALUES (1, 2500), (2, 2500), (3, 2500)`); err != nil {
		t.Fatal(err)
	}
	balance := func(id int64) int64 { return int64(s.count("SELECT balance FROM wallets WHERE id = $1", id)) }

	t.Run("exactly the balance", func(t *testing.T) {
		got, err := idem.Do(ctx, s.pool, "all-of-it", "h", walletCharge(ctx, 1, 2500))
		if err != nil || got != 0 || balance(1) != 0 {
			t.Fatalf("charging the whole balance of 2500: %d, %v (balance %d); want 0 left", got, err, balance(1))
		}
	})
	t.Run("one cent more", func(t *testing.T) {
		for i := 0; i < 2; i++ {
			_, err := idem.Do(ctx, s.pool, "one-too-many", "h", walletCharge(ctx, 2, 2501))
			if !errors.Is(err, errNoFunds) {
				t.Fatalf("call %d charging 2501 of 2500: %v; want the refusal", i+1, err)
			}
		}
		if balance(2) != 2500 {
			t.Fatalf("balance %d after a refused charge, want 2500", balance(2))
		}
	})
	t.Run("two charges of the whole balance at once", func(t *testing.T) {
		bounded, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for i, key := range []string{"race-a", "race-b"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = idem.Do(bounded, s.pool, key, "h", walletCharge(bounded, 3, 2500))
			}()
		}
		wg.Wait()
		ok, refused := 0, 0
		for _, err := range errs {
			switch {
			case err == nil:
				ok++
			case errors.Is(err, errNoFunds):
				refused++
			default:
				t.Fatalf("unexpected: %v", err)
			}
		}
		if ok != 1 || refused != 1 || balance(3) != 0 {
			t.Fatalf("%d charged, %d refused, balance %d; want 1, 1 and 0", ok, refused, balance(3))
		}
	})
}
