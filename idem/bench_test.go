package idem_test

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/testkit/testdb"
)

// The benchmarks compare idem.Do with the same work in a bare pgx
// transaction, one client on a one-connection pool, with allocations
// reported. tools/idem-bench measures throughput, latency and round trips under
// concurrency; these isolate the client-side cost per call:
//
//	go test -run '^$' -bench . -benchmem ./idem/

const (
	benchDebitSQL  = `UPDATE bench_accounts SET balance = balance - $2 WHERE id = $1 RETURNING balance`
	benchLedgerSQL = `INSERT INTO bench_ledger (account_id, amount) VALUES ($1, $2) RETURNING id`
	benchHash      = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"
	benchAccounts  = 1000
)

type benchReceipt struct {
	LedgerID int64 `json:"ledger_id"`
	Balance  int64 `json:"balance"`
}

func benchPool(b *testing.B) *pgxpool.Pool {
	b.Helper()
	pool := testdb.New(b, func(c *pgxpool.Config) { c.MaxConns, c.MinConns = 1, 1 })
	_, err := pool.Exec(context.Background(), `
CREATE TABLE bench_accounts (id bigint PRIMARY KEY, balance bigint NOT NULL);
INSERT INTO bench_accounts SELECT g, 1000000000 FROM generate_series(1, 1000) g;
CREATE TABLE bench_ledger (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id bigint NOT NULL,
    amount     bigint NOT NULL
);`)
	if err != nil {
		b.Fatal(err)
	}
	return pool
}

func benchWork(ctx context.Context, tx pgx.Tx, account int64) (benchReceipt, error) {
	var r benchReceipt
	if err := tx.QueryRow(ctx, benchDebitSQL, account, int64(1)).Scan(&r.Balance); err != nil {
		return r, err
	}
	err := tx.QueryRow(ctx, benchLedgerSQL, account, int64(1)).Scan(&r.LedgerID)
	return r, err
}

func benchKeys(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = prefix + strconv.Itoa(i)
	}
	return keys
}

// BenchmarkBare is the baseline: the work in pgx.BeginFunc.
func BenchmarkBare(b *testing.B) {
	ctx := context.Background()
	pool := benchPool(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		account := int64(1 + i%benchAccounts)
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := benchWork(ctx, tx, account)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDo is the same work through idem.Do, a new key each call.
func BenchmarkDo(b *testing.B) {
	ctx := context.Background()
	pool := benchPool(b)
	keys := benchKeys("do-", b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		account := int64(1 + i%benchAccounts)
		_, err := idem.Do(ctx, pool, keys[i], benchHash, func(tx pgx.Tx) (benchReceipt, error) {
			return benchWork(ctx, tx, account)
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReplay calls idem.Do with keys that have already completed.
func BenchmarkReplay(b *testing.B) {
	ctx := context.Background()
	pool := benchPool(b)
	keys := benchKeys("replay-", 1000)
	for i, key := range keys {
		_, err := idem.Do(ctx, pool, key, benchHash, func(tx pgx.Tx) (benchReceipt, error) {
			return benchWork(ctx, tx, int64(1+i))
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	ran := errors.New("fn ran on a replay")
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_, err := idem.Do(ctx, pool, keys[i%len(keys)], benchHash, func(pgx.Tx) (benchReceipt, error) {
			return benchReceipt{}, ran
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}
