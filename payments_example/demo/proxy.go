package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
)

// lossyProxy stands for an unreliable network between the client and the
// service. It forwards each request and reads the service's whole answer,
// so the service has acted; then, for a share of the requests, it closes
// the client's connection instead of relaying the answer. The client sees a
// broken connection and cannot tell whether its payment went through: the
// situation retries with an Idempotency-Key exist for.
type lossyProxy struct {
	upstream string       // the service's base URL
	client   *http.Client // to the service
	seed     uint64
	lossRate float64 // the share of answers dropped, in [0, 1)

	mu       sync.Mutex
	attempts map[string]int // requests seen per Idempotency-Key
	// instance counts the service's restarts (restarted); replaysOf, the
	// replays of each run of the service.
	instance  int
	replaysOf map[int]int64

	lost    atomic.Int64 // answers dropped
	replays atomic.Int64 // answers the service marked Idempotent-Replayed
}

func newLossyProxy(upstream string, seed uint64, lossRate float64) *lossyProxy {
	return &lossyProxy{
		upstream:  upstream,
		client:    &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}},
		seed:      seed,
		lossRate:  lossRate,
		attempts:  map[string]int{},
		replaysOf: map[int]int64{},
	}
}

// restarted tells the proxy that the service was stopped and is about to
// start again: the answers that follow come from its next run. Call it
// once the stopped process is gone, and before the next one starts.
func (p *lossyProxy) restarted() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.instance++
}

// replaysSinceRestart returns the replays that the service's current run
// served through the proxy.
func (p *lossyProxy) replaysSinceRestart() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.replaysOf[p.instance]
}

// countReplay counts a replay of the run of the service that was current
// when its request was sent, if that run is still current: a request that
// a restart overtook may have been answered by either run.
func (p *lossyProxy) countReplay(instance int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.instance == instance {
		p.replaysOf[instance]++
	}
}

func (p *lossyProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	attempt := p.attempts[key]
	p.attempts[key]++
	instance := p.instance
	p.mu.Unlock()

	out, err := http.NewRequestWithContext(r.Context(), r.Method, p.upstream+r.URL.RequestURI(), r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out.Header = r.Header.Clone()
	res, err := p.client.Do(out)
	if err != nil {
		// The service is down or died mid-request: the client sees what
		// it would see without a proxy, a broken connection.
		hangUp(w)
		return
	}
	body, err := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if err != nil {
		hangUp(w)
		return
	}
	if res.Header.Get("Idempotent-Replayed") == "true" {
		p.replays.Add(1)
		p.countReplay(instance)
	}

	if p.loses(key, attempt) {
		p.lost.Add(1)
		hangUp(w)
		return
	}
	for k, v := range res.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(res.StatusCode)
	_, _ = w.Write(body)
}

// hangUp closes the client's connection without an answer.
func hangUp(w http.ResponseWriter) {
	if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
		_ = conn.Close()
	}
}

// loses decides whether the answer to a request is dropped. The decision
// depends only on the seed, the key and the attempt number, not on timing
// or on the order the workers send in, so every run, and both halves of
// the demo, lose exactly the same answers.
func (p *lossyProxy) loses(key string, attempt int) bool {
	sum := sha256.Sum256(fmt.Appendf(nil, "%d/%s/%d", p.seed, key, attempt))
	u := float64(binary.BigEndian.Uint64(sum[:8])>>11) / (1 << 53) // uniform in [0, 1)
	return u < p.lossRate
}

// serve starts an HTTP server for h on a free loopback port and returns
// its base URL and a function that stops it.
func serve(ctx context.Context, h http.Handler) (url string, stop func(), err error) {
	ln, err := new(net.ListenConfig).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}
