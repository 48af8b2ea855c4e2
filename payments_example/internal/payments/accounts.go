package payments

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/payments_example/api"
)

var (
	//go:embed sql/create_account.sql
	createAccountSQL string
	//go:embed sql/get_account.sql
	getAccountSQL string
)

// OpeningBalance is the balance every account opens with, in cents:
// 100,000.00 USD of the example's play money. Sign-up takes no balance
// from the caller: a balance is what the service owes, and only the
// service decides it.
const OpeningBalance = 100_000_00

// ErrNoAccount means the account does not exist.
var ErrNoAccount = errors.New("payments: no such account")

// querier is what reading an account needs: a pool or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func getAccount(ctx context.Context, q querier, id uuid.UUID) (api.Account, error) {
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

// signUpBody is the body POST /accounts reads: api.CreateAccountRequest,
// and a balance only to refuse it by name.
type signUpBody struct {
	Owner   string          `json:"owner"`
	Balance json.RawMessage `json:"balance"`
}

// CreateAccount serves POST /accounts, the sign-up: it opens an account
// with OpeningBalance and a random id (UUID version 4: it reveals neither
// how many accounts there are nor when this one was opened) and answers
// it with a new API key, which is shown this once; only its hash is
// stored. A body that names a balance is refused 400.
//
// Sign-up is open and not idempotent: its answer holds a secret, and an
// answer stored under an Idempotency-Key is replayed to whoever sends the
// key again. Without an account there is no scope to keep anonymous
// clients' keys apart, so a guessed or leaked key would hand out another
// client's API key, and the key table would hold the secret for a day.
func (s *server) CreateAccount(w http.ResponseWriter, r *http.Request) {
	var req signUpBody
	if rep, ok := decode(r, &req, "owner"); !ok {
		rep.write(w)
		return
	}
	if req.Balance != nil {
		invalid("balance cannot be chosen: every account opens with the same balance").write(w)
		return
	}
	if detail, ok := validOwner(req.Owner); !ok {
		invalid(detail).write(w)
		return
	}
	key, hash := newAPIKey()
	a := api.AccountCreated{ApiKey: key}
	err := s.pool.QueryRow(r.Context(), createAccountSQL, uuid.New(), req.Owner, OpeningBalance, hash).Scan(&a.Id, &a.Owner, &a.Balance)
	if err != nil {
		s.internal(r, fmt.Errorf("payments: create account: %w", err)).write(w)
		return
	}
	rep := respond(http.StatusCreated, a)
	rep.header = http.Header{
		"Location":      {"/accounts/" + a.Id.String()},
		"Cache-Control": {"no-store"},
	}
	rep.write(w)
}

// GetAccount serves GET /accounts/{id} for the API key's own account.
// Another account is answered 404, exactly as a missing one, so that a
// client cannot learn which accounts exist. It reads through the pool: a
// read needs neither a transaction nor a key.
func (s *server) GetAccount(w http.ResponseWriter, r *http.Request, id uuid.UUID) {
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
