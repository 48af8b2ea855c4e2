package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
)

// Two variants frame idem's protocol from either side, each on its own
// tables:
//
//   - eager is idem.Do as it ran before the deferred protocol: the claim
//     inserts the key's row 'in_progress' (claim.sql) and the completion
//     updates it (complete.sql). It is the same build and code path as do,
//     switched per slice by the environment variable
//     IDEM_BENCH_EAGER_CLAIM, which idem reads only when built with -tags
//     idembench; variants never run
//     at the same time, so the switch is only ever on during eager's own
//     slices.
//   - atend is the reference that keeps no contract: no claim, no lock, no
//     assertion, no savepoint; the key's row is inserted once, completed,
//     in the pipeline that carries COMMIT. It is what one more indexed row
//     per transaction costs on this machine, the floor any protocol that
//     stores the key with the work can approach.
var (
	eagerWork = workIn("eager.")
	atendWork = workIn("atend.")

	eagerClients sync.Map // *pgxpool.Pool → *idem.Client on eager's table
	plainClients sync.Map // *pgxpool.Pool → *idem.Client with the defaults
)

// eagerClaimEnv set to "1" makes idem, built with -tags idembench, claim
// with claim.sql (see idem/benchswitch_idembench.go).
const eagerClaimEnv = "IDEM_BENCH_EAGER_CLAIM"

// plainClient is the Client with the defaults on pool, for do and replay:
// the pool itself is refused bare once eager's Client, with a table of its
// own, was made on it.
func plainClient(pool *pgxpool.Pool) *idem.Client {
	if c, ok := plainClients.Load(pool); ok {
		return c.(*idem.Client)
	}
	c, err := idem.NewClient(pool, nil)
	if err != nil {
		panic(err) // the defaults are valid and pool is not nil
	}
	actual, _ := plainClients.LoadOrStore(pool, c)
	return actual.(*idem.Client)
}

func eagerClient(pool *pgxpool.Pool) (*idem.Client, error) {
	if c, ok := eagerClients.Load(pool); ok {
		return c.(*idem.Client), nil
	}
	c, err := idem.NewClient(pool, &idem.Config{Table: "eager.idempotency_keys"})
	if err != nil {
		return nil, err
	}
	actual, _ := eagerClients.LoadOrStore(pool, c)
	return actual.(*idem.Client), nil
}

var eager = variant{"eager", func(ctx context.Context, pool *pgxpool.Pool, c *client) error {
	if !idemBenchBuild {
		return errors.New("the eager variant needs idem built with -tags idembench (make bench passes it)")
	}
	keys, err := eagerClient(pool)
	if err != nil {
		return err
	}
	key := c.nextKey()
	account := c.account()
	// Read by idem on every call in this build; variants never run at the
	// same time, so it is set only during eager's own slices.
	if err := os.Setenv(eagerClaimEnv, "1"); err != nil {
		return err
	}
	defer os.Unsetenv(eagerClaimEnv)
	_, err = idem.Do(ctx, keys, key, reqHash, func(tx pgx.Tx) (receipt, error) {
		return eagerWork.run(ctx, tx, account, 1)
	})
	return err
}}

const atendInsertSQL = `
INSERT INTO atend.idempotency_keys
    (scope, idempotency_key, request_hash, status, response, created_at, completed_at, expires_at)
VALUES ('', $1, $2, 'completed', $3, now(), clock_timestamp(), now() + interval '24 hours')`

var atend = variant{"atend", func(ctx context.Context, pool *pgxpool.Pool, c *client) error {
	key := c.nextKey()
	account := c.account()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	r, err := atendWork.run(ctx, tx, account, 1)
	if err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	resp, err := json.Marshal(r)
	if err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	// The insert travels with COMMIT, as idem's completion does.
	b := &pgx.Batch{}
	b.Queue(atendInsertSQL, key, reqHash, resp)
	b.Queue("commit")
	if err := execAll(conn.SendBatch(ctx, b), 2); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	return nil
}}
