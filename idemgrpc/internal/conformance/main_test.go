// Package conformance_test runs the same exactly-once scenarios over
// idemgrpc (a gRPC server on a loopback connection) and idemconnect (a
// Connect server, over the Connect protocol and over the gRPC protocol),
// against a real PostgreSQL, counting committed charges in the database.
package conformance_test

import (
	"os"
	"testing"

	"github.com/idemhq/idem/testkit/testdb"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }
