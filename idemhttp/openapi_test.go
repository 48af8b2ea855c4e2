package idemhttp_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemhttp"
)

// noDatabase is a pool for Clients that never reach a database: pgxpool
// connects lazily, and this one could not.
func noDatabase(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://idem@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestOpenAPIComponentsTTL: the published document states the Client's key
// lifetime in each place that states one, and no other (draft §2.5.2: the
// expiry policy is published).
func TestOpenAPIComponentsTTL(t *testing.T) {
	t.Parallel()
	tests := []struct {
		ttl  time.Duration // 0: the default
		want string
	}{
		{0, "24 hours"},
		{48 * time.Hour, "2 days"},
		{7 * 24 * time.Hour, "7 days"},
		{time.Hour, "1 hour"},
		{36 * time.Hour, "36 hours"},
		{90 * time.Minute, "90 minutes"},
		{45 * time.Second, "45 seconds"},
		{1500 * time.Millisecond, "1.5s"},
	}
	for _, tt := range tests {
		keys, err := idem.NewClient(noDatabase(t), &idem.Config{TTL: tt.ttl})
		if err != nil {
			t.Fatal(err)
		}
		doc := idemhttp.OpenAPIComponents(keys)
		if n := bytes.Count(doc, []byte("for "+tt.want+",")) + bytes.Count(doc, []byte("for "+tt.want+" (")); n != 2 {
			t.Errorf("TTL %v: the document states a lifetime of %q %d times, want 2 (the info and the header parameter)", tt.ttl, tt.want, n)
		}
		if bytes.Contains(doc, []byte("hours by default")) {
			t.Errorf("TTL %v: the document still states the default lifetime", tt.ttl)
		}
	}
}
