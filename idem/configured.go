package idem

import (
	"runtime"
	"sync"
	"weak"

	"github.com/jackc/pgx/v5/pgxpool"
)

// A Client's settings are not optional extras: its table is where the keys
// are, its Sealer is what keeps them encrypted. So a pool that a Client with
// settings was made on refuses to be used bare: Do, Run, Wrap and the
// integrations given the *pgxpool.Pool itself fail with ErrInvalidOption
// instead of running with the defaults, which would write to another table,
// with another TTL, unsealed. The refusal is loud rather than a lookup of
// the Client's settings, because a pool may carry two Clients (two tables)
// and a call site should read what it uses.
//
// The record is kept per pool, weakly: it goes when the pool does. A Client
// whose settings are the defaults records nothing, since a bare call runs
// with exactly those.
var configured sync.Map // weak.Pointer[pgxpool.Pool] -> struct{}

// markConfigured records that pool has a Client with settings.
func markConfigured(pool *pgxpool.Pool) {
	k := weak.Make(pool)
	if _, loaded := configured.LoadOrStore(k, struct{}{}); !loaded {
		runtime.AddCleanup(pool, func(k weak.Pointer[pgxpool.Pool]) { configured.Delete(k) }, k)
	}
}

// bareError is the error of a call given db itself when a Client with
// settings was made on it, or nil.
func bareError(db Beginner) error {
	pool, ok := db.(*pgxpool.Pool)
	if !ok || pool == nil {
		return nil
	}
	if _, ok := configured.Load(weak.Make(pool)); !ok {
		return nil
	}
	return inputError(ErrInvalidOption,
		"the %T was given bare, but idem.NewClient made a Client with settings (table, TTL, Sealer...) on it: pass that Client, so that the call uses its settings rather than the defaults", db)
}
