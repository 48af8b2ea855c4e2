// Package kit is the machinery the test kits idemtest and idemhttptest
// share: running scenarios as subtests (or, outside a test, on a recorder),
// the key table and the fault the kits inject into it, a digest of the
// database's tables, and a deterministic change of a JSON request.
//
// It needs only what a user gives the kits (a database and a table name);
// it must never depend on the project's own test harness.
package kit
