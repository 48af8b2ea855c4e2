package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/idemhq/idem/payments_example/internal/freeport"
)

// The commands the demo runs as child processes, built from this module.
const (
	serviceCmd     = "github.com/idemhq/idem/payments_example"
	unprotectedCmd = "github.com/idemhq/idem/payments_example/demo/unprotected"
)

// build compiles the commands into dir with go build and returns their
// paths, in the order given.
func build(ctx context.Context, dir string, pkgs ...string) ([]string, error) {
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	cmd := exec.CommandContext(ctx, "go", append(args, pkgs...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build: %w\n%s", err, out)
	}
	bins := make([]string, len(pkgs))
	for i, p := range pkgs {
		bins[i] = filepath.Join(dir, filepath.Base(p))
	}
	return bins, nil
}

// A child is a service run as a child process on a fixed address, so that
// it can be killed and started again behind the same proxy.
type child struct {
	bin       string
	args, env []string
	url       string
	logPath   string // what it printed, for when it fails

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan error
}

// newChild prepares bin to run with args on a free loopback port (one it
// can bind again after a restart), with env added to the demo's
// environment; it prints to a file in dir.
func newChild(ctx context.Context, dir, bin string, args []string, env ...string) (*child, error) {
	addr, err := freeport.Addr(ctx)
	if err != nil {
		return nil, err
	}
	return &child{
		bin:     bin,
		args:    append([]string{"-addr", addr}, args...),
		env:     append(os.Environ(), env...),
		url:     "http://" + addr,
		logPath: filepath.Join(dir, filepath.Base(bin)+".log"),
	}, nil
}

// start starts the process and waits until GET /healthz answers 200. The
// process is killed if ctx ends (the demo was interrupted).
func (c *child) start(ctx context.Context) error {
	log, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, c.bin, c.args...)
	cmd.Env = c.env
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait(); _ = log.Close() }()
	c.mu.Lock()
	c.cmd, c.done = cmd, done
	c.mu.Unlock()

	for {
		select {
		case err := <-done:
			done <- err
			return fmt.Errorf("%s exited while starting: %w\n%s", filepath.Base(c.bin), err, c.output())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url+"/healthz", nil)
		if err != nil {
			return err
		}
		if res, err := http.DefaultClient.Do(req); err == nil {
			_ = res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
}

// kill sends SIGKILL and waits for the process to be gone; start starts
// it again.
func (c *child) kill() error {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	err := <-done
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		return fmt.Errorf("%s had exited before the kill: %w\n%s", filepath.Base(c.bin), err, c.output())
	}
	return nil
}

// stop stops the process as SIGTERM does.
func (c *child) stop() error {
	c.mu.Lock()
	cmd, done := c.cmd, c.done
	c.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		done <- err
		if err != nil {
			return fmt.Errorf("%s: %w\n%s", filepath.Base(c.bin), err, c.output())
		}
		return nil
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		return fmt.Errorf("%s did not stop within 30s of SIGTERM", filepath.Base(c.bin))
	}
}

// output returns the last 4 KiB the process printed.
func (c *child) output() string {
	b, _ := os.ReadFile(c.logPath)
	return string(b[max(0, len(b)-4096):])
}
