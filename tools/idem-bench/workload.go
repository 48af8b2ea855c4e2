package main

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
)

// Each variant works on its own copy of the tables, in its own schema, so
// that no variant inherits another's bloat or dead tuples: do and replay use
// public (where idem's table is), bare uses bare, peer uses peer, peertx
// uses peertx, eager and atend theirs (protocols.go).
const (
	setupSQL = `
ALTER TABLE idempotency_keys SET (autovacuum_enabled = false);
CREATE SCHEMA bare;
CREATE SCHEMA peer;
CREATE TABLE peer.peer_keys (LIKE idempotency_keys INCLUDING ALL);
ALTER TABLE peer.peer_keys SET (autovacuum_enabled = false);
CREATE SCHEMA peertx;
CREATE TABLE peertx.peer_keys (LIKE idempotency_keys INCLUDING ALL);
ALTER TABLE peertx.peer_keys SET (autovacuum_enabled = false);
CREATE SCHEMA eager;
CREATE TABLE eager.idempotency_keys (LIKE idempotency_keys INCLUDING ALL) WITH (fillfactor = 80);
ALTER TABLE eager.idempotency_keys SET (autovacuum_enabled = false);
CREATE SCHEMA atend;
CREATE TABLE atend.idempotency_keys (LIKE idempotency_keys INCLUDING ALL) WITH (fillfactor = 80);
ALTER TABLE atend.idempotency_keys SET (autovacuum_enabled = false);
`
	tablesSQL = `
CREATE TABLE %[1]sbench_accounts (id bigint PRIMARY KEY, balance bigint NOT NULL)
    WITH (autovacuum_enabled = false);
INSERT INTO %[1]sbench_accounts SELECT g, 1000000000 FROM generate_series(1, %[2]d) g;
CREATE TABLE %[1]sbench_ledger (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    account_id bigint NOT NULL,
    amount     bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
) WITH (autovacuum_enabled = false);
`
	resetSQL = `TRUNCATE bench_ledger, bare.bench_ledger, peer.bench_ledger, peertx.bench_ledger,
    eager.bench_ledger, atend.bench_ledger,
    idempotency_keys, peer.peer_keys, peertx.peer_keys, eager.idempotency_keys, atend.idempotency_keys`
	vacuumSQL = `VACUUM bench_accounts, bare.bench_accounts, peer.bench_accounts, peertx.bench_accounts,
    eager.bench_accounts, atend.bench_accounts`

	// The peer pattern: the key row in its own transaction, the work in a
	// second, the response in a third.
	peerClaimSQL = `
INSERT INTO peer.peer_keys (scope, idempotency_key, request_hash, status, expires_at)
VALUES ('', $1, $2, 'in_progress', now() + interval '24 hours')
ON CONFLICT DO NOTHING`
	peerCompleteSQL = `
UPDATE peer.peer_keys SET status = 'completed', response = $2, completed_at = now()
WHERE scope = '' AND idempotency_key = $1`
)

// schemas are the table sets, one per variant that writes.
var schemas = []string{"", "bare.", "peer.", "peertx.", "eager.", "atend."}

// workSQL is the business work on one schema's tables: debit an account
// picked at random among many (no hot row), append a ledger row.
type workSQL struct{ debit, ledger string }

func workIn(schema string) workSQL {
	return workSQL{
		debit:  "UPDATE " + schema + "bench_accounts SET balance = balance - $2 WHERE id = $1 RETURNING balance",
		ledger: "INSERT INTO " + schema + "bench_ledger (account_id, amount) VALUES ($1, $2) RETURNING id",
	}
}

var (
	bareWork = workIn("bare.")
	doWork   = workIn("")
	peerWork = workIn("peer.")
)

const accounts = 10000

// reqHash is the request fingerprint of every call; each key is new anyway.
const reqHash = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"

type receipt struct {
	LedgerID int64 `json:"ledger_id"`
	Balance  int64 `json:"balance"`
}

func (w workSQL) run(ctx context.Context, tx pgx.Tx, account, amount int64) (receipt, error) {
	var r receipt
	if err := tx.QueryRow(ctx, w.debit, account, amount).Scan(&r.Balance); err != nil {
		return r, err
	}
	err := tx.QueryRow(ctx, w.ledger, account, amount).Scan(&r.LedgerID)
	return r, err
}

// client is one benchmark client: its random source, the keys it made, and
// the keys a replay run draws from.
type client struct {
	rng    *rand.Rand
	prefix string
	seq    int
	made   []string
	replay []string
	keyBuf []byte
	pre    []string
}

func newClient(id int, prefix string) *client {
	return &client{
		rng:    rand.New(rand.NewPCG(uint64(id)+1, 0x1dea)),
		prefix: prefix + "-" + strconv.Itoa(id) + "-",
	}
}

func (c *client) account() int64 { return 1 + c.rng.Int64N(accounts) }

func (c *client) nextKey() string {
	if len(c.pre) > 0 {
		k := c.pre[0]
		c.pre = c.pre[1:]
		return k
	}
	c.seq++
	c.keyBuf = strconv.AppendInt(append(c.keyBuf[:0], c.prefix...), int64(c.seq), 10)
	return string(c.keyBuf)
}

// pregenerate makes the next n keys now, so that a measured loop does not
// count the harness's own key formatting, and reserves room to record them.
func (c *client) pregenerate(n int) {
	c.pre = make([]string, 0, n)
	for i := 0; i < n; i++ {
		c.seq++
		c.pre = append(c.pre, c.prefix+strconv.Itoa(c.seq))
	}
	c.made = slices.Grow(c.made, n)
}

// A variant is one way of doing the work; op runs it once.
type variant struct {
	name string
	op   func(ctx context.Context, pool *pgxpool.Pool, c *client) error
}

var errReplayRan = errors.New("replay ran fn")

var (
	bare = variant{"bare", func(ctx context.Context, pool *pgxpool.Pool, c *client) error {
		account := c.account()
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := bareWork.run(ctx, tx, account, 1)
			return err
		})
	}}

	do = variant{"do", func(ctx context.Context, pool *pgxpool.Pool, c *client) error {
		key := c.nextKey()
		account := c.account()
		_, err := idem.Do(ctx, plainClient(pool), key, reqHash, func(tx pgx.Tx) (receipt, error) {
			return doWork.run(ctx, tx, account, 1)
		})
		if err == nil {
			c.made = append(c.made, key)
		}
		return err
	}}

	replay = variant{"replay", func(ctx context.Context, pool *pgxpool.Pool, c *client) error {
		key := c.replay[c.rng.IntN(len(c.replay))]
		_, err := idem.Do(ctx, plainClient(pool), key, reqHash, func(pgx.Tx) (receipt, error) {
			return receipt{}, errReplayRan
		})
		return err
	}}

	peer = variant{"peer", func(ctx context.Context, pool *pgxpool.Pool, c *client) error {
		key := c.nextKey()
		tag, err := pool.Exec(ctx, peerClaimSQL, key, reqHash)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return errors.New("peer: key already present")
		}
		account := c.account()
		var r receipt
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			r, err = peerWork.run(ctx, tx, account, 1)
			return err
		}); err != nil {
			return err
		}
		resp, err := json.Marshal(r)
		if err != nil {
			return err
		}
		_, err = pool.Exec(ctx, peerCompleteSQL, key, resp)
		return err
	}}
)
