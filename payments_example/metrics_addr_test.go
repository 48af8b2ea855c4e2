package main

import (
	"bytes"
	"log/slog"
	"net"
	"strings"
	"testing"
)

// TestListenMetrics: a second instance on one machine starts when the
// default metrics address is taken, on an ephemeral port that it logs; an
// address the operator chose is used or refused, never replaced; port 0
// gives an ephemeral port, logged.
func TestListenMetrics(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()

	var logged bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	ln, err := listenMetrics(t.Context(), addr, true, log)
	if err != nil {
		t.Fatalf("the default address taken: %v; want an ephemeral port", err)
	}
	got := ln.Addr().String()
	_ = ln.Close()
	if got == addr || !strings.Contains(logged.String(), got) || !strings.Contains(logged.String(), "in use") {
		t.Fatalf("listened on %s (taken: %s); log:\n%s", got, addr, logged.String())
	}

	if ln, err := listenMetrics(t.Context(), addr, false, log); err == nil {
		_ = ln.Close()
		t.Fatalf("an address the operator chose, taken: listened on %s; want an error", ln.Addr())
	}

	logged.Reset()
	ln, err = listenMetrics(t.Context(), "127.0.0.1:0", false, log)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if !strings.Contains(logged.String(), "http://"+ln.Addr().String()+"/metrics") {
		t.Fatalf("port 0: listened on %s, log:\n%s", ln.Addr(), logged.String())
	}
}
