// Command idem-mutate checks that the test suite catches deliberate bugs.
//
// It reads a list of mutations (scripts/mutations/mutations.txt by default):
// each replaces one piece of text in one file of the repository with a
// broken version and names the test packages that must then fail. It copies
// the repository's files (tracked and untracked, not ignored) into a scratch
// directory, runs the named packages once unmutated (they must pass), then,
// one mutation at a time, applies it to the copy, runs
//
//	go test -count=1 -failfast -timeout <timeout> <packages>
//
// and restores the file. The working tree is never written.
//
// Each mutation ends as one of:
//
//	caught    the tests failed, before the timeout
//	survived  every test passed with the bug in place
//	hang      only go test's timeout stopped the run: a test waited instead
//	          of failing (give it a context deadline)
//	invalid   the mutated code did not build
//	stale     the text to find is not in the file exactly once
//
// It prints a table with the tests that failed for each mutation and a
// total, keeps every run's output in a log directory, and exits 1 unless
// every mutation was caught.
//
//	go run ./idem-mutate                       # every mutation
//	go run ./idem-mutate -run 'claim|sweep'    # those whose name matches
//	go run ./idem-mutate -check                # only check that each applies
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

func main() {
	var (
		list     = flag.String("list", "scripts/mutations/mutations.txt", "the mutation list, relative to the repository root")
		run      = flag.String("run", "", "run only the mutations whose name matches this regular expression")
		timeout  = flag.Duration("timeout", 5*time.Minute, "go test -timeout for each run")
		check    = flag.Bool("check", false, "only check that every mutation applies; run no test")
		baseline = flag.Bool("baseline", true, "first run the packages unmutated; they must pass")
		keep     = flag.Bool("keep", false, "keep the scratch copy")
		verbose  = flag.Bool("v", false, "stream go test's output")
	)
	flag.Parse()
	os.Exit(mainErr(options{
		list: *list, run: *run, timeout: *timeout, check: *check,
		baseline: *baseline, keep: *keep, verbose: *verbose,
	}))
}

type options struct {
	list, run      string
	timeout        time.Duration
	check          bool
	baseline, keep bool
	verbose        bool
}

func mainErr(o options) int {
	if err := mutate(o); err != nil {
		fmt.Fprintln(os.Stderr, "idem-mutate:", err)
		return 1
	}
	return 0
}

// result is how one mutation ended.
type result struct {
	m        mutation
	status   string
	caughtBy []string
	elapsed  time.Duration
	log      string
}

func mutate(o options) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	f, err := os.Open(filepath.Join(root, o.list))
	if err != nil {
		return err
	}
	all, err := parseList(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", o.list, err)
	}
	var selected []mutation
	if o.run == "" {
		selected = all
	} else {
		re, err := regexp.Compile(o.run)
		if err != nil {
			return err
		}
		for _, m := range all {
			if re.MatchString(m.name) {
				selected = append(selected, m)
			}
		}
	}
	if len(selected) == 0 {
		return errors.New("no mutation selected")
	}

	// Every mutation must apply to the code as it is, before any test runs.
	var stale []string
	for _, m := range selected {
		content, err := os.ReadFile(filepath.Join(root, m.file))
		if err == nil {
			_, err = m.apply(string(content))
		}
		if err != nil {
			stale = append(stale, err.Error())
		}
	}
	if len(stale) > 0 {
		return fmt.Errorf("stale mutations:\n  %s", strings.Join(stale, "\n  "))
	}
	if o.check {
		fmt.Printf("%d mutations, each applies to the code as it is\n", len(selected))
		return nil
	}

	scratch, err := os.MkdirTemp("", "idem-mutate-")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Println("scratch copy:", scratch)
	} else {
		defer os.RemoveAll(scratch)
	}
	work := filepath.Join(scratch, "repo")
	// The logs outlive the scratch copy: they are the evidence.
	logs, err := os.MkdirTemp("", "idem-mutate-logs-")
	if err != nil {
		return err
	}
	if err := copyRepo(root, work); err != nil {
		return err
	}
	fmt.Printf("repository copied to %s; logs in %s\n", work, logs)

	if o.baseline {
		var pkgs []string
		for _, m := range selected {
			for _, p := range m.pkgs {
				if !slices.Contains(pkgs, p) {
					pkgs = append(pkgs, p)
				}
			}
		}
		fmt.Printf("baseline: go test %s\n", strings.Join(pkgs, " "))
		start := time.Now()
		out, err := goTest(work, pkgs, o.timeout, o.verbose)
		logFile := filepath.Join(logs, "baseline.txt")
		_ = os.WriteFile(logFile, out, 0o644)
		if err != nil {
			return fmt.Errorf("the unmutated code fails its tests (see %s): fix that first: %w", logFile, err)
		}
		fmt.Printf("baseline passed in %s\n", time.Since(start).Round(time.Second))
	}

	var results []result
	for i, m := range selected {
		fmt.Printf("[%d/%d] %s (%s) ... ", i+1, len(selected), m.name, m.file)
		r := runOne(work, logs, m, o)
		fmt.Printf("%s in %s\n", r.status, r.elapsed.Round(time.Second))
		results = append(results, r)
	}
	printTable(os.Stdout, results)
	for _, r := range results {
		if r.status != "caught" {
			return errors.New("not every mutation was caught")
		}
	}
	return nil
}

// runOne applies m to the copy in work, runs its tests, and restores the file.
func runOne(work, logs string, m mutation, o options) result {
	r := result{m: m, log: filepath.Join(logs, m.name+".txt")}
	path := filepath.Join(work, m.file)
	orig, err := os.ReadFile(path)
	if err != nil {
		r.status = "stale"
		return r
	}
	mutated, err := m.apply(string(orig))
	if err != nil {
		r.status = "stale"
		return r
	}
	if err := os.WriteFile(path, []byte(mutated), 0o644); err != nil {
		r.status = "invalid"
		return r
	}
	defer func() {
		if err := os.WriteFile(path, orig, 0o644); err != nil {
			panic(fmt.Sprintf("restore %s: %v", path, err)) // every later result would be wrong
		}
	}()
	start := time.Now()
	var out []byte
	err = nil
	if m.run != "" {
		// The focused tests first: most mutations fail there in seconds.
		out, err = goTest(work, append([]string{"-run", m.run}, m.pkgs...), o.timeout, o.verbose)
	}
	if err == nil {
		out, err = goTest(work, m.pkgs, o.timeout, o.verbose)
	}
	r.elapsed = time.Since(start)
	_ = os.WriteFile(r.log, out, 0o644)
	r.status, r.caughtBy = classify(out, err)
	return r
}

// goTest runs go test on pkgs in dir, where pkgs may also hold go test's
// flags (-run and its pattern). go test runs only the packages of the
// module it runs in, so a package of a nested module (./idemclient/...)
// is tested from that module's folder, in a go test of its own; the
// output is every run's, and the error the first failure's. Each process
// gets a minute beyond go test's own timeout, which reports a hang with
// the goroutines' stacks.
func goTest(dir string, pkgs []string, timeout time.Duration, verbose bool) ([]byte, error) {
	flags, modules, byModule := splitByModule(dir, pkgs)
	var (
		buf   bytes.Buffer
		first error
	)
	for _, m := range modules {
		ctx, cancel := context.WithTimeout(context.Background(), timeout+time.Minute)
		args := append([]string{"test", "-count=1", "-failfast", "-timeout", timeout.String()}, flags...)
		cmd := exec.CommandContext(ctx, "go", append(args, byModule[m]...)...)
		cmd.Dir = filepath.Join(dir, m)
		if verbose {
			cmd.Stdout = io.MultiWriter(&buf, os.Stdout)
		} else {
			cmd.Stdout = &buf
		}
		cmd.Stderr = cmd.Stdout
		cmd.WaitDelay = 10 * time.Second
		if err := cmd.Run(); err != nil && first == nil {
			first = err
		}
		cancel()
	}
	return buf.Bytes(), first
}

// splitByModule parts args into go test's flags and the packages, grouped
// by the folder of the module that holds each ("." for the root module's),
// in the order they first appear, each package relative to its module.
func splitByModule(dir string, args []string) (flags, modules []string, byModule map[string][]string) {
	byModule = map[string][]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if strings.HasPrefix(a, "-") {
			flags = append(flags, a)
			if a == "-run" && i+1 < len(args) {
				i++
				flags = append(flags, args[i])
			}
			continue
		}
		m, rel := ".", a
		parts := strings.Split(strings.TrimPrefix(a, "./"), "/")
		for n := len(parts); n > 0; n-- {
			if _, err := os.Stat(filepath.Join(dir, filepath.Join(parts[:n]...), "go.mod")); err == nil {
				m, rel = filepath.Join(parts[:n]...), "./"+strings.Join(parts[n:], "/")
				if n == len(parts) {
					rel = "."
				}
				break
			}
		}
		if _, ok := byModule[m]; !ok {
			modules = append(modules, m)
		}
		byModule[m] = append(byModule[m], rel)
	}
	return flags, modules, byModule
}

var failLine = regexp.MustCompile(`(?m)^\s*--- FAIL: (\S+)`)

// classify names the outcome of a mutated run from go test's output.
func classify(out []byte, err error) (string, []string) {
	if err == nil {
		return "survived", nil
	}
	text := string(out)
	if strings.Contains(text, "[build failed]") || strings.Contains(text, "[setup failed]") {
		return "invalid", nil
	}
	var names []string
	for _, m := range failLine.FindAllStringSubmatch(text, -1) {
		top, _, _ := strings.Cut(m[1], "/")
		if !slices.Contains(names, top) {
			names = append(names, top)
		}
	}
	if strings.Contains(text, "panic: test timed out after") {
		return "hang", names
	}
	if len(names) == 0 && !strings.Contains(text, "\nFAIL") {
		return "invalid", nil // go test itself failed
	}
	return "caught", names
}

func printTable(w io.Writer, results []result) {
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| # | mutation | file | result | caught by | time |")
	fmt.Fprintln(w, "|---|---|---|---|---|---:|")
	counts := map[string]int{}
	for i, r := range results {
		counts[r.status]++
		by := strings.Join(r.caughtBy, ", ")
		if len(r.caughtBy) > 3 {
			by = strings.Join(r.caughtBy[:3], ", ") + fmt.Sprintf(" (+%d)", len(r.caughtBy)-3)
		}
		fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %s |\n", i+1, r.m.name, r.m.file, r.status, by, r.elapsed.Round(time.Second))
	}
	fmt.Fprintf(w, "\ncaught %d of %d", counts["caught"], len(results))
	for _, s := range []string{"survived", "hang", "invalid", "stale"} {
		if counts[s] > 0 {
			fmt.Fprintf(w, ", %s %d", s, counts[s])
		}
	}
	fmt.Fprintln(w)
}

func repoRoot() (string, error) {
	out, err := exec.CommandContext(context.Background(), "git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Errorf("find the repository root (run inside the repository): %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// copyRepo copies the working tree's files, as git sees them (tracked, and
// untracked unless ignored), from root to dst.
func copyRepo(root, dst string) error {
	out, err := exec.CommandContext(context.Background(), "git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		return fmt.Errorf("list the repository's files: %w", err)
	}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		src := filepath.Join(root, name)
		info, err := os.Lstat(src)
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted in the working tree, not yet committed
		}
		if err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			continue
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, name)
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(target, data, info.Mode().Perm()); err != nil {
			return err
		}
	}
	return nil
}
