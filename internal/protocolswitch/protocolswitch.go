// Package protocolswitch lets cmd/idem-bench measure the protocol that the
// deferred protocol replaced, through the same code path, side by side with
// it: with EagerClaim set, idem claims with claim.sql (the key's row
// inserted 'in_progress' by the claim and updated by the completion) on a
// pool or connection at READ COMMITTED too, as it does at REPEATABLE READ
// and SERIALIZABLE. The contract is the same either way; only the cost
// differs.
//
// It is internal: no program outside this module can set it, and nothing in
// it sets it but the benchmark.
package protocolswitch

import "sync/atomic"

// EagerClaim makes every call claim with claim.sql while it is true.
var EagerClaim atomic.Bool
