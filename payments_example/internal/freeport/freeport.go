// Package freeport picks loopback ports for servers that a test or the demo
// restarts on the same address.
package freeport

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
)

// Addr returns a loopback address whose port was free a moment ago and
// lies outside the kernel's ephemeral range (ip_local_port_range). Port 0
// and every outbound connection of the machine take their local port from
// that range, so a port of it could be taken between a server's two binds
// (before and after a restart) by a connection of a test running beside
// it, and the restart would fail with "address already in use". Outside
// the range only an explicit bind takes the port.
func Addr(ctx context.Context) (string, error) {
	lo, hi := 32768, 60999 // Linux's default range
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		_, _ = fmt.Sscan(string(b), &lo, &hi)
	}
	// Below the range, above the fixed ports services default to (5432,
	// 8080, 9464, ...); above it if there is no room below.
	first, last := max(lo/2, 10_000), lo-1
	if last-first < 1000 {
		first, last = hi+1, 65535
	}
	if last-first < 1000 {
		return "", fmt.Errorf("freeport: no room outside the ephemeral ports %d-%d", lo, hi)
	}
	for range 100 {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(first+rand.IntN(last-first+1)))
		if ln, err := new(net.ListenConfig).Listen(ctx, "tcp", addr); err == nil {
			_ = ln.Close()
			return addr, nil
		}
	}
	return "", errors.New("freeport: no free port in " + strconv.Itoa(first) + "-" + strconv.Itoa(last))
}
