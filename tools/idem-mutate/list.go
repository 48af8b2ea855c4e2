package main

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strings"
)

// A mutation is one deliberate bug: replace the only occurrence of find in
// file by replace, then run the tests of pkgs, which must fail.
type mutation struct {
	name    string
	promise string   // what the bug breaks, in the words of the docs
	file    string   // relative to the repository root
	pkgs    []string // go test patterns, e.g. ./integration_test
	// run, if set, is a go test -run pattern of the tests that should catch
	// the mutation: they run first, and only if they pass does the whole of
	// pkgs run, so a caught mutation fails in seconds.
	run     string
	find    string
	replace string
	line    int // where the mutation starts in the list, for messages
}

// parseList reads the mutation list. Its form:
//
//	# a comment (only outside find and replace blocks: a line that starts
//	# with "# " inside one is refused, since it would be part of the text)
//	=== name
//	promise: what the bug breaks
//	file: idem/sql/claim.sql
//	test: ./integration_test ./idemhttp
//	run: TestReplay|TestFaultWire      (optional: the tests that should catch it)
//	--- find
//	text to find, exactly once in the file (any number of lines)
//	--- replace
//	text to put in its place (may be empty)
//
// Blocks keep their lines as they are, tabs included; the newline after the
// last line of a block is not part of it, and blank lines at the end of a
// replace block are dropped (they separate mutations). An empty line at the
// end of a find block makes the newline part of the text, which deletes
// whole lines when the replace block is empty.
func parseList(r io.Reader) ([]mutation, error) {
	var (
		out   []mutation
		cur   *mutation
		block *[]string // the lines of the find or replace block being read
		find  []string
		repl  []string
		n     int
	)
	flush := func() error {
		if cur == nil {
			return nil
		}
		// Blank lines before the next mutation separate, they do not replace.
		for len(repl) > 0 && strings.TrimSpace(repl[len(repl)-1]) == "" {
			repl = repl[:len(repl)-1]
		}
		cur.find, cur.replace = strings.Join(find, "\n"), strings.Join(repl, "\n")
		switch {
		case cur.file == "":
			return fmt.Errorf("line %d: mutation %s has no file", cur.line, cur.name)
		case len(cur.pkgs) == 0:
			return fmt.Errorf("line %d: mutation %s has no test packages", cur.line, cur.name)
		case cur.find == "":
			return fmt.Errorf("line %d: mutation %s has nothing to find", cur.line, cur.name)
		case cur.find == cur.replace:
			return fmt.Errorf("line %d: mutation %s changes nothing", cur.line, cur.name)
		}
		for _, m := range out {
			if m.name == cur.name {
				return fmt.Errorf("line %d: mutation %s named twice", cur.line, cur.name)
			}
		}
		out = append(out, *cur)
		cur, block, find, repl = nil, nil, nil, nil
		return nil
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		n++
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "=== "):
			if err := flush(); err != nil {
				return nil, err
			}
			cur = &mutation{name: strings.TrimSpace(line[4:]), line: n}
			if cur.name == "" || strings.ContainsAny(cur.name, " \t") {
				return nil, fmt.Errorf("line %d: a mutation name is one word", n)
			}
		case cur == nil:
			if strings.TrimSpace(line) != "" && !strings.HasPrefix(line, "#") {
				return nil, fmt.Errorf("line %d: %q outside a mutation", n, line)
			}
		case line == "--- find":
			block = &find
		case line == "--- replace":
			if block != &find {
				return nil, fmt.Errorf("line %d: --- replace before --- find", n)
			}
			block = &repl
		case block != nil && strings.HasPrefix(line, "# "):
			// No line of Go or SQL starts so: it is a comment meant for the
			// list, which would otherwise go into the code with the block.
			return nil, fmt.Errorf("line %d: a comment inside a find or replace block (it would be part of the text); put comments before the first === line, or between a === line and its --- find", n)
		case block != nil:
			*block = append(*block, line)
		case strings.HasPrefix(line, "#"), strings.TrimSpace(line) == "":
		default:
			k, v, ok := strings.Cut(line, ":")
			v = strings.TrimSpace(v)
			switch {
			case !ok:
				return nil, fmt.Errorf("line %d: want key: value, got %q", n, line)
			case k == "promise":
				cur.promise = v
			case k == "file":
				cur.file = v
			case k == "test":
				cur.pkgs = strings.Fields(v)
			case k == "run":
				if _, err := regexp.Compile(v); err != nil {
					return nil, fmt.Errorf("line %d: run: %w", n, err)
				}
				cur.run = v
			default:
				return nil, fmt.Errorf("line %d: unknown key %q", n, k)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}

// apply returns content with m applied, or an error if m's text is not
// there exactly once: a list that no longer matches the code is reported,
// never counted as caught.
func (m mutation) apply(content string) (string, error) {
	switch c := strings.Count(content, m.find); c {
	case 1:
		return strings.Replace(content, m.find, m.replace, 1), nil
	case 0:
		return "", fmt.Errorf("%s: the text to find is not in %s (the code changed: update the list)", m.name, m.file)
	default:
		return "", fmt.Errorf("%s: the text to find occurs %d times in %s (make it unique)", m.name, c, m.file)
	}
}
