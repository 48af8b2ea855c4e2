package payments

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/payments_example/api"
)

var (
	//go:embed sql/create_account.sql
	createAccountSQL string
	//go:embed sql/get_account.sql
	getAccountSQL string
)

// ErrNoAccount means the account does not exist.
var ErrNoAccount = errors.New("payments: no such account")

// querier is what reading an account needs: a pool or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func getAccount(ctx context.Context, q querier, id int64) (api.Account, error) {
	var a api.Account
	err := q.QueryRow(ctx, getAccountSQL, id).Scan(&a.Id, &a.Owner, &a.Balance)
	if errors.Is(err, pgx.ErrNoRows) {
		return api.Account{}, ErrNoAccount
	}
	if err != nil {
		return api.Account{}, fmt.Errorf("payments: read account: %w", err)
	}
	return a, nil
}

// CreateAccount serves POST /accounts, the sign-up: it opens an account and
// answers it with a new API key, which is shown this once; only its hash
// is stored.
//
// Sign-up is open and not idempotent: its answer holds a secret, and an
// answer stored under an Idempotency-Key is replayed to whoever sends the
// key again. Without an account there is no scope to keep anonymous
// clients' keys apart, so a guessed or leaked key would hand out another
// client's API key, and the key table would hold the secret for a day.
func (s *server) CreateAccount(w http.ResponseWriter, r *http.Request) {
	var req api.CreateAccountRequest
	if rep, ok := decode(r, &req, "owner", "balance"); !ok {
		rep.write(w)
		return
	}
	if detail, ok := validOwner(req.Owner); !ok {
		invalid(detail).write(w)
		return
	}
	if req.Balance < 0 {
		invalid("balance must not be negative").write(w)
		return
	}
	key, hash := newAPIKey()
	a := api.AccountCreated{ApiKey: key}
	err := s.pool.QueryRow(r.Context(), createAccountSQL, req.Owner, req.Balance, hash).Scan(&a.Id, &a.Owner, &a.Balance)
	if err != nil {
		s.internal(r, fmt.Errorf("payments: create account: %w", err)).write(w)
		return
	}
	rep := respond(http.StatusCreated, a)
	rep.header = http.Header{
		"Location":      {"/accounts/" + strconv.FormatInt(a.Id, 10)},
		"Cache-Control": {"no-store"},
	}
	rep.write(w)
}

// GetAccount serves GET /accounts/{id} for the API key's own account.
// Another account is answered 404, exactly as a missing one, so that a
// client cannot learn which accounts exist. It reads through the pool: a
// read needs neither a transaction nor a key.
func (s *server) GetAccount(w http.ResponseWriter, r *http.Request, id int64) {
	if own, _ := accountFrom(r.Context()); id != own {
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
