//go:build idembench

package idem

import "github.com/idemhq/idem/internal/protocolswitch"

// forceInsertProtocol lets idem-bench, built with -tags idembench, measure
// insertProtocol where deferredProtocol would run, through the same code
// path and side by side with it. Without the tag it is the constant false,
// and the library's call path never reads a switch.
func forceInsertProtocol() bool { return protocolswitch.EagerClaim.Load() }
