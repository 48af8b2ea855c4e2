package idem

import (
	"runtime"
	"sync"
	"weak"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A Client's settings are not optional extras: its table is where the keys
// are, its Sealer is what keeps them encrypted. So a database that a Client
// with settings was made on refuses to be used bare: Do, Run, Wrap and the
// integrations given the *pgxpool.Pool or *pgx.Conn itself fail with
// ErrInvalidOption instead of running with the defaults, which would write
// to another table, with another TTL, unsealed. The refusal is loud rather
// than a lookup of the Client's settings, because a database may carry two
// Clients (two tables) and a call site should read what it uses.
//
// The record is kept per pool or connection, weakly: it goes when the
// database does. A Client whose settings are the defaults records nothing,
// since a bare call runs with exactly those.
var configured sync.Map // weak.Pointer[pgxpool.Pool] or weak.Pointer[pgx.Conn] -> struct{}

// markConfigured records that db has a Client with settings.
func markConfigured(db Beginner) {
	switch d := db.(type) {
	case *pgxpool.Pool:
		remember(d)
	case *pgx.Conn:
		remember(d)
	}
}

func remember[T any](p *T) {
	k := weak.Make(p)
	if _, loaded := configured.LoadOrStore(k, struct{}{}); !loaded {
		runtime.AddCleanup(p, func(k weak.Pointer[T]) { configured.Delete(k) }, k)
	}
}

// bareError is the error of a call given db itself when a Client with
// settings was made on it, or nil.
func bareError(db Beginner) error {
	var k any
	switch d := db.(type) {
	case *pgxpool.Pool:
		k = weak.Make(d)
	case *pgx.Conn:
		k = weak.Make(d)
	default:
		return nil
	}
	if _, ok := configured.Load(k); !ok {
		return nil
	}
	return inputError(ErrInvalidOption,
		"the %T was given bare, but idem.NewClient made a Client with settings (table, TTL, Sealer...) on it: pass that Client, so that the call uses its settings rather than the defaults", db)
}
