package dbtx

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// ErrTxOwned is returned by Commit and Rollback of a transaction the library
// hands to user code: the library ends it.
var ErrTxOwned = errors.New("idem: the transaction belongs to idem; return from fn (or write the response) instead of committing or rolling back")

// Owned is a transaction handed to user code: everything passes through
// except ending it, which belongs to the library.
type Owned struct{ pgx.Tx }

// Commit returns ErrTxOwned.
func (Owned) Commit(context.Context) error { return ErrTxOwned }

// Rollback returns ErrTxOwned.
func (Owned) Rollback(context.Context) error { return ErrTxOwned }
