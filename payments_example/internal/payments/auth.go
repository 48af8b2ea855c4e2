package payments

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idemhttp"
)

//go:embed sql/authenticate.sql
var authenticateSQL string

// APIKeyPrefix starts every API key, so that a leaked key is recognisable
// (by people and by secret scanners) for what it is.
const APIKeyPrefix = "sk_"

// apiKeyBytes is the entropy of an API key: 256 bits, beyond guessing.
const apiKeyBytes = 32

// apiKeyLen is the length of an API key: the prefix and 43 base64url
// characters.
var apiKeyLen = len(APIKeyPrefix) + base64.RawURLEncoding.EncodedLen(apiKeyBytes)

// newAPIKey returns a fresh API key and the SHA-256 hash that is stored in
// its place.
func newAPIKey() (key string, hash []byte) {
	b := make([]byte, apiKeyBytes)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (it crashes the program instead)
	key = APIKeyPrefix + base64.RawURLEncoding.EncodeToString(b)
	return key, hashAPIKey(key)
}

func hashAPIKey(key string) []byte {
	sum := sha256.Sum256([]byte(key))
	return sum[:]
}

var (
	// errNoCredentials: the request has no Authorization header.
	errNoCredentials = errors.New("payments: no credentials")
	// errBadCredentials: the request's credentials name no account.
	errBadCredentials = errors.New("payments: invalid credentials")
)

// bearerToken returns the token of a request's "Authorization: Bearer"
// header (RFC 6750; the scheme is case-insensitive).
func bearerToken(h http.Header) (string, error) {
	values := h.Values("Authorization")
	switch len(values) {
	case 0:
		return "", errNoCredentials
	case 1:
	default:
		return "", errBadCredentials
	}
	scheme, token, ok := strings.Cut(values[0], " ")
	token = strings.TrimLeft(token, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", errBadCredentials
	}
	return token, nil
}

// authenticate returns the account whose API key the request carries.
//
// The key is looked up by its SHA-256 hash, so comparing in constant time
// is not needed: the time the index lookup takes depends on the hash of
// what the client sent, which the client cannot steer towards a stored
// hash, and learning a stored hash would not reveal the key (a preimage of
// SHA-256 over 256 random bits). A plain string comparison of the key
// itself would leak how many of its leading bytes matched.
func (s *server) authenticate(ctx context.Context, h http.Header) (uuid.UUID, error) {
	token, err := bearerToken(h)
	if err != nil {
		return uuid.Nil, err
	}
	// Anything that is not shaped like a key is refused without a query.
	if len(token) != apiKeyLen || !strings.HasPrefix(token, APIKeyPrefix) {
		return uuid.Nil, errBadCredentials
	}
	var account uuid.UUID
	err = s.pool.QueryRow(ctx, authenticateSQL, hashAPIKey(token)).Scan(&account)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return uuid.Nil, errBadCredentials
	case err != nil:
		return uuid.Nil, fmt.Errorf("payments: authenticate: %w", err)
	}
	return account, nil
}

type accountKey struct{}

// accountFrom returns the authenticated account of a request's context.
func accountFrom(ctx context.Context) (uuid.UUID, bool) {
	id, ok := ctx.Value(accountKey{}).(uuid.UUID)
	return id, ok && id != uuid.Nil
}

// scopeOf is the idempotency scope of an account: its keys' namespace.
// The account id is random, so a scope cannot be guessed either.
func scopeOf(account uuid.UUID) string { return "account:" + account.String() }

// bearerChallenge is the WWW-Authenticate challenge of a request without
// credentials.
const bearerChallenge = `Bearer realm="payments"`

// requireAccount runs next only for requests with a valid API key, with
// the account in the context (accountFrom); POST /payments's idemhttp
// Config.Scope makes the account the idempotency scope, so the same
// Idempotency-Key sent with two API keys is two unrelated keys. It runs in
// front of idemhttp, so a 401 never reaches the key table. Other requests
// are answered 401 with WWW-Authenticate: Bearer.
func (s *server) requireAccount(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		account, err := s.authenticate(r.Context(), r.Header)
		switch {
		case errors.Is(err, errNoCredentials):
			unauthorized(w, bearerChallenge, "this request needs an API key: Authorization: Bearer <api_key>")
			return
		case errors.Is(err, errBadCredentials):
			unauthorized(w, `Bearer realm="payments", error="invalid_token"`, "the API key is not valid")
			return
		case err != nil:
			s.internal(r, err).write(w)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), accountKey{}, account)))
	})
}

// unauthorized answers 401 with the challenge and a fixed detail.
func unauthorized(w http.ResponseWriter, challenge, detail string) {
	rep := fail(http.StatusUnauthorized, idemhttp.ProblemUnauthorized, detail)
	rep.header = http.Header{"Www-Authenticate": {challenge}, "Cache-Control": {"no-store"}}
	rep.write(w)
}
