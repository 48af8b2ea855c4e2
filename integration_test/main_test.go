// Package integration_test checks idem's guarantees end to end against a real
// PostgreSQL: the contract of idem.Do over a pool, a connection and an outer
// transaction, faults on the wire, isolation levels and hostile input.
package integration_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemhq/idem/internal/testdb"
)

func TestMain(m *testing.M) {
	fmt.Fprintln(os.Stderr, "integration_test: database:", testdb.Source())
	code := testdb.Main(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
