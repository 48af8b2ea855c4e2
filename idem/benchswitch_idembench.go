//go:build idembench

package idem

import "os"

// forceInsertProtocol lets idem-bench, built with -tags idembench, measure
// insertProtocol where deferredProtocol would run, through the same code
// path and side by side with it: while IDEM_BENCH_EAGER_CLAIM is "1", every
// call claims with claim.sql (the key's row inserted 'in_progress' by the
// claim and updated by the completion), as it does at REPEATABLE READ and
// SERIALIZABLE. The contract is the same either way; only the cost differs.
// Without the tag it is the constant false, and the library's call path
// never reads the environment.
func forceInsertProtocol() bool { return os.Getenv("IDEM_BENCH_EAGER_CLAIM") == "1" }
