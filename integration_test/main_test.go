// Package integration_test checks idem's guarantees end to end against a real
// PostgreSQL: the contract of idem.Do over a pool, a connection and an outer
// transaction, faults on the wire, isolation levels and hostile input.
package integration_test

import (
	"os"
	"testing"

	"github.com/idemhq/idem/testkit/testdb"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }
