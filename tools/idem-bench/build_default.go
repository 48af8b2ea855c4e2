//go:build !idembench

package main

// idemBenchBuild reports whether this build has -tags idembench, in which
// idem reads eagerClaimEnv.
const idemBenchBuild = false
