package idemamqp_test

import (
	"os"
	"testing"

	"github.com/idemhq/idem/testkit/consumertest"
	"github.com/idemhq/idem/testkit/testdb"
)

// A process storm's consumer instance is this binary, started again
// (consumertest.Child); testdb.Main runs goleak after the tests.
func TestMain(m *testing.M) {
	consumertest.Child(openEndpoint)
	os.Exit(testdb.Main(m))
}
