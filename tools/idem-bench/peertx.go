package main

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The best correct form of the peer pattern, as libraries that keep keys in
// PostgreSQL offer it (a CompleteTx that completes the key inside the
// caller's transaction): the key is reserved in an autocommit statement of
// its own, then one transaction does the work and completes the key, so the
// work and the response commit together. It pays one commit more than idem
// (the reservation's), and holds the reserved row across two transactions.
const (
	peertxClaimSQL = `
INSERT INTO peertx.peer_keys (scope, idempotency_key, request_hash, status, expires_at)
VALUES ('', $1, $2, 'in_progress', now() + interval '24 hours')
ON CONFLICT DO NOTHING`
	peertxCompleteSQL = `
UPDATE peertx.peer_keys SET status = 'completed', response = $2, completed_at = now()
WHERE scope = '' AND idempotency_key = $1 AND status = 'in_progress'`
	// peertxReleaseSQL frees a reservation whose transaction failed, so that
	// a retry with the same key runs the work instead of finding the key
	// stuck in progress. It runs only on failure.
	peertxReleaseSQL = `
DELETE FROM peertx.peer_keys WHERE scope = '' AND idempotency_key = $1 AND status = 'in_progress'`
)

var peertxWork = workIn("peertx.")

// errKeyLost is returned when the completing update finds no reserved row:
// the reservation was removed (swept, or released by a failed attempt) while
// the work ran, and committing the work without its key would break the
// guarantee.
var errKeyLost = errors.New("peertx: the reserved key is gone")

var peertx = variant{"peertx", func(ctx context.Context, pool *pgxpool.Pool, c *client) error {
	key := c.nextKey()
	tag, err := pool.Exec(ctx, peertxClaimSQL, key, reqHash)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		// A real service would read the row and replay it, or answer 409.
		return errors.New("peertx: key already present")
	}
	account := c.account()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		r, err := peertxWork.run(ctx, tx, account, 1)
		if err != nil {
			return err
		}
		resp, err := json.Marshal(r)
		if err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, peertxCompleteSQL, key, resp)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return errKeyLost
		}
		return nil
	})
	if err != nil {
		// Best effort, on a context of its own: the caller's may be what
		// failed the transaction.
		_, _ = pool.Exec(context.WithoutCancel(ctx), peertxReleaseSQL, key)
	}
	return err
}}
