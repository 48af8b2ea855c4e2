//go:build !idembench

package idem

// forceInsertProtocol is false outside the benchmark's build: see
// benchswitch_idembench.go.
func forceInsertProtocol() bool { return false }
