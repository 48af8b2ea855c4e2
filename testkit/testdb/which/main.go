// Command which prints the PostgreSQL server the tests will use, so that a
// test run's output says which path it took.
package main

import (
	"fmt"

	"github.com/idemhq/idem/testkit/testdb"
)

func main() {
	fmt.Println("tests use:", testdb.Describe())
}
