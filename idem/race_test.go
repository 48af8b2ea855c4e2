//go:build race

package idem_test

// raceEnabled: the race detector instruments code and changes what
// allocates, so allocation counts are checked only without it.
const raceEnabled = true
