//go:build idembench

package protocolswitch

// Built reports whether idem reads EagerClaim: only in a build with -tags
// idembench.
const Built = true
