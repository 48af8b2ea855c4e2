package kit

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// A Recorder is a testing.TB for code that runs outside a test: it records
// failures instead of reporting them. FailNow, Fatal and Fatalf end the
// calling goroutine, as in a test, so run the code under test with Go.
// Cleanup functions run, last registered first, when Go's function ends.
type Recorder struct {
	// TB is nil: it only lends the interface's unexported method. Every
	// method of testing.TB is implemented below.
	testing.TB

	ctx    context.Context
	cancel context.CancelFunc
	name   string

	mu       sync.Mutex
	failures []string
	logs     []string
	failed   bool
	skipped  bool
	cleanups []func()
}

// NewRecorder returns a Recorder named name whose Context is derived from
// ctx.
func NewRecorder(ctx context.Context, name string) *Recorder {
	ctx, cancel := context.WithCancel(ctx)
	return &Recorder{ctx: ctx, cancel: cancel, name: name}
}

// Go runs f(r) in a goroutine of its own, waits for it to end (by returning,
// or by FailNow or SkipNow), then cancels r's Context and runs the cleanups.
// A panic in f is re-raised after the cleanups.
func (r *Recorder) Go(f func(t testing.TB)) {
	done := make(chan any, 1)
	go func() {
		var panicked any
		defer func() { done <- panicked }()
		defer func() { panicked = recover() }()
		f(r)
	}()
	p := <-done
	r.cancel()
	r.runCleanups()
	if p != nil {
		panic(p)
	}
}

func (r *Recorder) runCleanups() {
	for {
		r.mu.Lock()
		n := len(r.cleanups)
		if n == 0 {
			r.mu.Unlock()
			return
		}
		f := r.cleanups[n-1]
		r.cleanups = r.cleanups[:n-1]
		r.mu.Unlock()
		// A FailNow inside a cleanup ends only that cleanup.
		done := make(chan struct{})
		go func() { defer close(done); f() }()
		<-done
	}
}

// Failures returns the messages of Error, Errorf, Fatal and Fatalf, in order.
func (r *Recorder) Failures() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.failures...)
}

// Logs returns the messages of Log and Logf, in order.
func (r *Recorder) Logs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.logs...)
}

func (r *Recorder) record(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures = append(r.failures, strings.TrimSuffix(msg, "\n"))
	r.failed = true
}

// ArtifactDir returns a temporary directory, as TempDir does.
func (r *Recorder) ArtifactDir() string { return r.TempDir() }

// Attr does nothing.
func (r *Recorder) Attr(key, value string) {}

// Cleanup registers f to run when Go's function has ended.
func (r *Recorder) Cleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

// Error records a failure.
func (r *Recorder) Error(args ...any) { r.record(fmt.Sprintln(args...)) }

// Errorf records a failure.
func (r *Recorder) Errorf(format string, args ...any) { r.record(fmt.Sprintf(format, args...)) }

// Fail marks r failed.
func (r *Recorder) Fail() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
}

// FailNow marks r failed and ends the calling goroutine.
func (r *Recorder) FailNow() {
	r.Fail()
	runtime.Goexit()
}

// Failed reports whether r has failed.
func (r *Recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

// Fatal records a failure and ends the calling goroutine.
func (r *Recorder) Fatal(args ...any) {
	r.Error(args...)
	runtime.Goexit()
}

// Fatalf records a failure and ends the calling goroutine.
func (r *Recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

// Helper does nothing.
func (r *Recorder) Helper() {}

// Log records a message.
func (r *Recorder) Log(args ...any) { r.log(fmt.Sprintln(args...)) }

// Logf records a message.
func (r *Recorder) Logf(format string, args ...any) { r.log(fmt.Sprintf(format, args...)) }

func (r *Recorder) log(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.logs = append(r.logs, strings.TrimSuffix(msg, "\n"))
}

// Name returns the name r was given.
func (r *Recorder) Name() string { return r.name }

// Setenv is not supported outside a test: it records a failure and ends the
// goroutine.
func (r *Recorder) Setenv(key, value string) {
	r.Fatalf("Setenv(%q) is not supported outside a test", key)
}

// Chdir is not supported outside a test: it records a failure and ends the
// goroutine.
func (r *Recorder) Chdir(dir string) { r.Fatalf("Chdir(%q) is not supported outside a test", dir) }

// Skip logs args, marks r skipped and ends the calling goroutine.
func (r *Recorder) Skip(args ...any) {
	r.Log(args...)
	r.SkipNow()
}

// Skipf logs a message, marks r skipped and ends the calling goroutine.
func (r *Recorder) Skipf(format string, args ...any) {
	r.Logf(format, args...)
	r.SkipNow()
}

// SkipNow marks r skipped and ends the calling goroutine.
func (r *Recorder) SkipNow() {
	r.mu.Lock()
	r.skipped = true
	r.mu.Unlock()
	runtime.Goexit()
}

// Skipped reports whether r was skipped.
func (r *Recorder) Skipped() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.skipped
}

// TempDir returns a new temporary directory, removed by the cleanups.
func (r *Recorder) TempDir() string {
	dir, err := os.MkdirTemp("", "idemtest")
	if err != nil {
		r.Fatalf("TempDir: %v", err)
	}
	r.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// Context returns r's context, cancelled when Go's function has ended,
// before the cleanups run.
func (r *Recorder) Context() context.Context { return r.ctx }

// Output returns a writer that discards what it is given.
func (r *Recorder) Output() io.Writer { return io.Discard }
