package idemriver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemriver"
)

// A client gives up after the processor charged, before it heard back.
// The completer's job, inserted when the operation began, finishes the
// operation without it: it asks the processor again with the same derived
// key (the processor charges once), records the receipt and stores the
// answer, which the client would get on a retry.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_receipts (key text, charge_id text)`); err != nil {
		log.Fatal(err)
	}
	keys, err := idem.NewClient(pool, nil)
	if err != nil {
		log.Fatal(err)
	}

	// The workers first, then the River client, then the operation that
	// inserts with it, then its completer, registered before Start.
	workers := river.NewWorkers()
	jobs, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:  map[string]river.QueueConfig{idemriver.QueueName: {MaxWorkers: 10}},
		Workers: workers,
	})
	if err != nil {
		log.Fatal(err)
	}

	clientCtx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	var mu sync.Mutex
	charges := map[string]string{} // the processor's, by idempotency key
	charge, err := idem.NewOperation(keys, "example.charge",
		func(s *idem.Steps, amount int64) (string, error) {
			id, err := idem.External(s, "charge", func(ctx context.Context, key string) (string, error) {
				mu.Lock()
				defer mu.Unlock()
				if charges[key] == "" {
					charges[key] = fmt.Sprintf("ch_%d", len(charges)+1)
				}
				giveUp() // the client goes away; the completer's ctx is not the client's
				return charges[key], ctx.Err()
			})
			if err != nil {
				return "", err
			}
			return idem.Step(s, "receipt", func(ctx context.Context, tx pgx.Tx) (string, error) {
				_, err := tx.Exec(ctx, `INSERT INTO example_receipts VALUES ($1, $2)`, s.Key().Key, id)
				return id, err
			})
		},
		&idem.OperationConfig[int64, string]{
			Lease:   time.Second,
			OnStart: idemriver.OnStart(jobs, 2*time.Second), // past the lease
		})
	if err != nil {
		log.Fatal(err)
	}
	completer, err := idemriver.NewWorker(charge)
	if err != nil {
		log.Fatal(err)
	}
	river.AddWorker(workers, completer)
	completed, stop := jobs.Subscribe(river.EventKindJobCompleted)
	defer stop()
	if err := jobs.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer jobs.Stop(ctx)

	_, outcome, err := charge.Run(clientCtx, "order-1042", 2500)
	fmt.Println("client:", outcome, err)

	select {
	case ev := <-completed:
		job, err := jobs.JobGet(ctx, ev.Job.ID)
		if err != nil {
			log.Fatal(err)
		}
		var res idemriver.Result
		if err := json.Unmarshal(job.Output(), &res); err != nil {
			log.Fatal(err)
		}
		fmt.Println("completer:", res.Outcome)
	case <-time.After(time.Minute):
		log.Fatal("the completer did not finish the operation")
	}
	rec, err := keys.Lookup(ctx, "", "order-1042")
	if err != nil {
		log.Fatal(err)
	}
	id, err := idem.DecodeResult[string](rec)
	fmt.Println("stored:", rec.Status, id, err, "charges:", len(charges))
	// Output:
	// client: failed context canceled
	// completer: executed
	// stored: completed ch_1 <nil> charges: 1
}
