package idemconnect_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/internal/testdb"
)

// exampleTB lets examples, which get no *testing.T, take a database from
// testdb. testdb calls only the methods defined here.
type exampleTB struct {
	testing.TB
	cleanups []func()
}

func (*exampleTB) Helper()            {}
func (*exampleTB) Failed() bool       { return false }
func (e *exampleTB) Cleanup(f func()) { e.cleanups = append(e.cleanups, f) }
func (*exampleTB) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}
func (*exampleTB) Errorf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}

// exampleDB returns a pool on a fresh database and the function that drops
// it.
func exampleDB() (*pgxpool.Pool, func()) {
	tb := &exampleTB{}
	pool := testdb.New(tb)
	return pool, func() {
		for i := len(tb.cleanups) - 1; i >= 0; i-- {
			tb.cleanups[i]()
		}
	}
}
