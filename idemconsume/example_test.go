package idemconsume_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemconsume"
	"github.com/idemhq/idem/schema"
)

// printSettler stands in for a broker adapter: it prints what it was told.
type printSettler struct{}

func (printSettler) Ack(context.Context) error { fmt.Println("  broker: ack"); return nil }

func (printSettler) Retry(_ context.Context, d time.Duration) error {
	fmt.Println("  broker: redeliver in", d)
	return nil
}

func (printSettler) DeadLetter(_ context.Context, reason error) error {
	fmt.Println("  broker: dead letter:", reason)
	return nil
}

// A message delivered twice (the consumer died after COMMIT, before its
// ack) is processed once; the same id with another payload is
// dead-lettered.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // the tests point it at a fresh database
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := schema.Apply(ctx, pool); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS ledger (event text NOT NULL, body text NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	keys, err := idem.NewClient(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	c, err := idemconsume.New(keys, &idemconsume.Config{Name: "ledger-example"},
		func(ctx context.Context, tx pgx.Tx, m *idemconsume.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1, $2)`, m.ID, m.Payload)
			return err
		})
	if err != nil {
		log.Fatal(err)
	}
	for i, body := range []string{`{"amount":500}`, `{"amount":500}`, `{"amount":900}`} {
		m := &idemconsume.Message{ID: "payment-17-settled", Payload: []byte(body), Deliveries: i + 1}
		res, err := c.Process(ctx, m, printSettler{})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("delivery %d: %s\n", i+1, res.Outcome)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger WHERE event = 'payment-17-settled'`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("ledger rows:", n)
	// Output:
	//   broker: ack
	// delivery 1: executed
	//   broker: ack
	// delivery 2: replayed
	//   broker: dead letter: idem: the key was used with a different request
	// delivery 3: mismatch
	// ledger rows: 1
}
