// Command pgcontainer starts the PostgreSQL container that the test harness
// (testkit/testdb) falls back to when no server is found and a Docker engine
// answers. It lives in the tools module so that testcontainers-go and its
// Docker client never enter the go.sum of a library user.
//
// It prints the server's connection URL on one line to standard output,
// then waits until its standard input reaches end of file, which happens when
// the test process that started it finishes or dies, and then terminates the
// container. Interrupt and termination signals terminate it too. Everything
// else, testcontainers' own log included, goes to standard error.
//
// Usage, from the tools module's directory (testkit/testdb runs it so, with
// a pipe as standard input that it keeps open while its tests run):
//
//	go run ./pgcontainer
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// image is the server the tests run against when they start one themselves.
const image = "postgres:16-alpine"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "pgcontainer:", err)
		os.Exit(1)
	}
}

func run() error {
	// A signal ends the wait below as end of input does; the container is
	// then terminated rather than left for the reaper.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	// The test process that reads standard error may be gone: a write to it,
	// testcontainers' log of the termination for one, must fail rather than
	// kill this program before the container is terminated.
	signal.Ignore(syscall.SIGPIPE)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, u, err := start(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err := testcontainers.TerminateContainer(c); err != nil {
			fmt.Fprintln(os.Stderr, "pgcontainer: terminate:", err)
		}
	}()
	if _, err := fmt.Println(u); err != nil {
		return err
	}
	eof := make(chan struct{})
	go func() {
		// Nothing is expected on standard input: its end is the signal.
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(eof)
	}()
	select {
	case <-eof:
	case <-stop:
	}
	return nil
}

// start runs the container and returns it with its connection URL.
func start(ctx context.Context) (c testcontainers.Container, u string, err error) {
	defer func() {
		// testcontainers panics in some set-ups without a Docker engine.
		if r := recover(); r != nil {
			err = fmt.Errorf("docker: %v", r)
		}
	}()
	provider, err := testcontainers.ProviderDocker.GetProvider()
	if err != nil {
		return nil, "", err
	}
	defer provider.Close()
	if err := provider.Health(ctx); err != nil {
		return nil, "", err
	}
	pg, err := tcpostgres.Run(ctx, image,
		tcpostgres.WithDatabase("postgres"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies(),
	)
	if err != nil {
		// Run may return a container together with the error.
		return nil, "", errors.Join(err, testcontainers.TerminateContainer(pg))
	}
	u, err = pg.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		return nil, "", errors.Join(err, testcontainers.TerminateContainer(pg))
	}
	return pg, u, nil
}
