package idemhttp_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
)

// NewMiddleware refuses, at start-up, the configurations under which a
// request would silently go unprotected: methods no client sends, a
// database that was never set, keys without a scope, and a storing rule
// that lets a rolled-back success reach the client.
func TestNewMiddlewareRefusesSilentMisconfiguration(t *testing.T) {
	t.Parallel()
	pool := unreachablePool(t)
	scope := func(*http.Request) (string, error) { return "user", nil }
	var typedNil *pgxpool.Pool
	for name, c := range map[string]struct {
		db   idem.Beginner
		cfg  *idemhttp.Config
		want string // in the error
	}{
		"lower-case method":        {pool, &idemhttp.Config{Scope: scope, Methods: []string{"post"}}, `write "POST"`},
		"typed nil pool":           {typedNil, &idemhttp.Config{Scope: scope}, "nil database"},
		"typed nil client":         {(*idem.Client)(nil), &idemhttp.Config{Scope: scope}, "nil database"},
		"no scope":                 {pool, &idemhttp.Config{Required: true}, "Scope is not set"},
		"nil config":               {pool, nil, "Scope"},
		"scope and shared keys":    {pool, &idemhttp.Config{Scope: scope, SharedKeys: true}, "SharedKeys"},
		"success not stored":       {pool, &idemhttp.Config{Scope: scope, StoreStatus: func(s int) bool { return s != http.StatusAccepted }}, "StoreStatus(202)"},
		"an empty method":          {pool, &idemhttp.Config{Scope: scope, Methods: []string{""}}, "empty method"},
		"a method with a new line": {pool, &idemhttp.Config{Scope: scope, Methods: []string{"POST\n"}}, "no method holds"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := idemhttp.NewMiddleware(c.db, c.cfg)
			if !errors.Is(err, idem.ErrInvalidOption) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%v, want ErrInvalidOption saying %q", err, c.want)
			}
		})
	}
	for _, cfg := range []*idemhttp.Config{
		{Scope: scope, Methods: []string{"POST", "PURGE"}},
		{SharedKeys: true},
		{Scope: idemhttp.ContextScope},
	} {
		if _, err := idemhttp.NewMiddleware(pool, cfg); err != nil {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
}
