package dbtx

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Owned is a transaction handed to user code: everything passes through
// except ending it, which belongs to the library. Err is what Commit and
// Rollback return: idem.ErrTxOwned, which package idem defines, since it
// imports this package.
type Owned struct {
	pgx.Tx
	Err error
}

// Commit returns o.Err.
func (o Owned) Commit(context.Context) error { return o.Err }

// Rollback returns o.Err.
func (o Owned) Rollback(context.Context) error { return o.Err }
