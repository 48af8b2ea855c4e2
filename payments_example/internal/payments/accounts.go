package payments

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

var (
	//go:embed sql/create_account.sql
	createAccountSQL string
	//go:embed sql/get_account.sql
	getAccountSQL string
)

// Account is an account as the API shows it. Balance is in minor units.
type Account struct {
	ID      int64  `json:"id"`
	Owner   string `json:"owner"`
	Balance int64  `json:"balance"`
}

// ErrNoAccount means the account does not exist.
var ErrNoAccount = errors.New("payments: no such account")

// querier is what reading an account needs: a pool or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func createAccount(ctx context.Context, tx pgx.Tx, owner string, balance int64) (Account, error) {
	var a Account
	err := tx.QueryRow(ctx, createAccountSQL, owner, balance).Scan(&a.ID, &a.Owner, &a.Balance)
	if err != nil {
		return Account{}, fmt.Errorf("payments: create account: %w", err)
	}
	return a, nil
}

func getAccount(ctx context.Context, q querier, id int64) (Account, error) {
	var a Account
	err := q.QueryRow(ctx, getAccountSQL, id).Scan(&a.ID, &a.Owner, &a.Balance)
	if errors.Is(err, pgx.ErrNoRows) {
		return Account{}, ErrNoAccount
	}
	if err != nil {
		return Account{}, fmt.Errorf("payments: read account: %w", err)
	}
	return a, nil
}

type createAccountRequest struct {
	Owner   string `json:"owner"`
	Balance *int64 `json:"balance"` // a pointer, so that a missing balance is an error, not 0
}

// handleCreateAccount serves POST /accounts.
func (s *service) handleCreateAccount(r *http.Request, tx pgx.Tx) reply {
	var req createAccountRequest
	if rep, ok := decode(r, &req); !ok {
		return rep
	}
	switch {
	case strings.TrimSpace(req.Owner) == "":
		return fail(http.StatusBadRequest, ProblemInvalidRequest, "owner is required")
	case req.Balance == nil:
		return fail(http.StatusBadRequest, ProblemInvalidRequest, "balance is required (an integer in minor units)")
	case *req.Balance < 0:
		return fail(http.StatusBadRequest, ProblemInvalidRequest, "balance must not be negative")
	}
	a, err := createAccount(r.Context(), tx, req.Owner, *req.Balance)
	if err != nil {
		return s.internal(r, err)
	}
	rep := respond(http.StatusCreated, a)
	rep.header = http.Header{"Location": {"/accounts/" + strconv.FormatInt(a.ID, 10)}}
	return rep
}

// handleGetAccount serves GET /accounts/{id}. It reads through the pool:
// a read needs neither a transaction nor a key.
func (s *service) handleGetAccount(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		fail(http.StatusNotFound, ProblemNoSuchAccount, "no such account").write(w)
		return
	}
	a, err := getAccount(r.Context(), s.pool, id)
	switch {
	case errors.Is(err, ErrNoAccount):
		fail(http.StatusNotFound, ProblemNoSuchAccount, "no such account").write(w)
	case err != nil:
		s.internal(r, err).write(w)
	default:
		respond(http.StatusOK, a).write(w)
	}
}
