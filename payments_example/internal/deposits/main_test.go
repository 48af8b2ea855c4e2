package deposits_test

import (
	"os"
	"testing"

	"github.com/idemhq/idem/testkit/testdb"
)

// testdb.Main runs goleak after the tests.
func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }
