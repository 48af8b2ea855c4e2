package faultproxy_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemhq/idem/internal/testdb"
)

func TestMain(m *testing.M) {
	code := testdb.Main(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			println(err.Error())
			code = 1
		}
	}
	os.Exit(code)
}
