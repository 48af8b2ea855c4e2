package idemconsume_test

import (
	"os"
	"testing"

	"github.com/idemhq/idem/testkit/testdb"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }
