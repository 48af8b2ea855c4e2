package main

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
)

// The schedule: every process derives the same keys from the plan, so the
// racers of all workers know each race key without exchanging them.

// contenders is how many racers send each race key.
func (p plan) contenders() int { return p.workers * p.raceWidth }

// races is how many race keys the plan has.
func (p plan) races() int {
	if p.raceFrac == 0 {
		return 0
	}
	n := int(math.Round(float64(p.ops)*p.raceFrac)) / p.contenders()
	return max(n, 1)
}

// regularCalls is how many calls the clients (not the racers) make.
func (p plan) regularCalls() int { return max(p.ops-p.races()*p.contenders(), 0) }

// clientCalls is how many calls client c of worker w makes.
func (p plan) clientCalls(w, c int) int {
	all := p.workers * p.clients
	i := w*p.clients + c
	n := p.regularCalls() / all
	if i < p.regularCalls()%all {
		n++
	}
	return n
}

// retryProb is the chance that a client's call retries one of its earlier
// keys, chosen so that retries make up retryFrac of all calls.
func (p plan) retryProb() float64 {
	if p.regularCalls() == 0 {
		return 0
	}
	return min(float64(p.ops)*p.retryFrac/float64(p.regularCalls()), 1)
}

// clientRand is client c of worker w's source of decisions.
func (p plan) clientRand(w, c int) *rand.Rand {
	return rand.New(rand.NewPCG(p.seed, uint64(w)<<32|uint64(c)))
}

func (p plan) freshKey(w, c, n int) string { return fmt.Sprintf("s%d-w%d-c%d-%d", p.seed, w, c, n) }

func (p plan) raceKey(r int) string { return fmt.Sprintf("s%d-race-%d", p.seed, r) }

// amountOf is the ledger amount of a key's operation: derived from the key,
// so an answer can be checked on its own.
func amountOf(key string) int64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	return int64(h.Sum64()%100_000) + 1
}
