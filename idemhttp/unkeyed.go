package idemhttp

import (
	"context"
	"errors"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/internal/dbtx"
)

// serveUnkeyed runs the handler in a plain transaction, and ends the
// transaction, returning its connection to the pool, before the first byte
// of the response is written: a client that never reads cannot hold a
// connection.
func (h *handler) serveUnkeyed(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx, err := h.begin(ctx)
	if err != nil {
		h.fail(w, r, ProblemUnavailable, "the database is unavailable; retry later", err)
		return
	}
	rolledBack := false
	rollback := func() {
		if !rolledBack {
			rolledBack = true
			dbtx.Rollback(ctx, tx) // after Commit a no-op returning pgx.ErrTxClosed
		}
	}
	defer rollback() // a panic in the handler

	c := newCapture(h.m.cfg.MaxResponseBytes)
	st := &requestState{tx: dbtx.Owned{Tx: tx, Err: idem.ErrTxOwned}}
	h.next.ServeHTTP(c, r.WithContext(context.WithValue(ctx, txKey{}, st)))
	c.finish()
	h.warnReplaced(r, c)
	switch {
	case c.overflow:
		rollback()
		h.fail(w, r, ProblemResponseTooLarge, "the response exceeds the limit; nothing was committed", errResponseTooLarge)
		return
	case c.status < 400 && !st.noStore:
		cctx, cancel := dbtx.CleanupContext(ctx)
		err := tx.Commit(cctx)
		cancel()
		if err != nil {
			rollback()
			switch {
			case dbtx.CommitOutcomeUnknown(err):
				h.fail(w, r, ProblemOutcomeUnknown, "the connection failed while the transaction was committing; whether it committed is unknown", err)
			case idem.Retryable(err):
				h.fail(w, r, ProblemUnavailable, "the transaction did not commit; retry later", err)
			default: // a deferred constraint, say: a retry fails the same way
				h.fail(w, r, ProblemInternal, "the transaction did not commit", err)
			}
			return
		}
	case c.status < 400: // NoStore on a success: its writes must not look committed
		rollback()
		h.noStoredSuccess(w, r, c.status)
		return
	default:
		rollback()
	}
	c.full().writeTo(w, false, nil)
}

// begin begins the plain transaction with Config.TxOptions.
func (h *handler) begin(ctx context.Context) (pgx.Tx, error) {
	opts := h.m.cfg.TxOptions
	if opts == (pgx.TxOptions{}) {
		return h.m.db.Begin(ctx)
	}
	type txBeginner interface {
		BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	}
	if tb, ok := h.m.db.(txBeginner); ok {
		return tb.BeginTx(ctx, opts)
	}
	return nil, errors.New("idemhttp: Config.TxOptions needs a database that begins transactions with options")
}
