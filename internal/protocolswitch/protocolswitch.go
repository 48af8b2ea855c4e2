// Package protocolswitch lets idem-bench measure insertProtocol where idem
// would run deferredProtocol (a pool or connection at READ COMMITTED with
// the plain table), through the same code path, side by side with it: with
// EagerClaim set, idem claims with claim.sql (the key's row inserted
// 'in_progress' by the claim and updated by the completion), as it does at
// REPEATABLE READ and SERIALIZABLE. The contract is the same either way;
// only the cost differs.
//
// idem reads the switch only when built with -tags idembench (Built is then
// true); in every other build the library's call path does not look at it.
// It is internal: no program outside this module can set it, and nothing
// sets it but the benchmark.
package protocolswitch

import "sync/atomic"

// EagerClaim makes every call claim with claim.sql while it is true, in a
// build with -tags idembench.
var EagerClaim atomic.Bool
